"""The workflow on Slurm: a preflight before the first submission, a watchdog for jobs
that will never finish, and SIGTERM handled like Ctrl-C.

``workflow/rules/slurm.smk`` calls :func:`on_start` from ``onstart:`` (after the DAG is
built, before any job is submitted) and :func:`on_error` from ``onerror:``. With the
slurm executor, :func:`on_start`

* describes every job as a :class:`~hpcmem.slurm.preflight.JobRequest` (its
  resources as the executor plugin turns them into sbatch options), and every group of
  jobs submitted together as a :class:`~hpcmem.slurm.preflight.GroupRequest`, and refuses
  the run (one line per problem and exit status 2, as :mod:`hpcmem.workflow.refusal`
  refuses bad input) when a partition, account or QOS is unknown or not the user's, a job
  does not fit a node of its partition, a group's rules disagree, or the run's jobs queued
  at once (grouped points counted as the Slurm jobs ``group-components`` makes of them) go
  past ``jobs:`` or a QOS or association limit;
* names the run's jobs ``hpcmem-<run id>_<uuid>`` where no ``slurm-jobname-prefix`` is
  given (:mod:`hpcmem.workflow.slurm_jobs`);
* notes each job it submits, with its Slurm job id, in the run's journal of jobs (the
  report's job table: :mod:`hpcmem.workflow.submissions`);
* makes SIGTERM (a time limit, ``scancel`` of the job driving the workflow) act like
  Ctrl-C: Snakemake cancels its jobs and exits instead of waiting for them;
* has a job cancelled underneath the run fail, and not be retried; the other jobs go on
  under ``keep-going`` (:func:`~hpcmem.workflow.slurm_jobs.cancelled_jobs_fail`);
* starts the :class:`~hpcmem.slurm.watchdog.Watchdog`, which ends the run (as Ctrl-C
  would) when a job pends for a reason that does not clear by itself, naming the job.

With any other executor every point runs on this one machine: a point of more than one
node (``collectives.nodes``) is refused the same way before any job starts.

With ``HPCMEM_PREFLIGHT_REPORT=FILE`` (what ``hpcmem preflight`` sets) the run writes
the preflight's findings to FILE as JSON and stops before submitting anything. With
``HPCMEM_RERUN_HINT=TEXT`` (what ``tools/nightly.sh`` sets) :func:`on_error` says TEXT for
how to redo the rest, instead of ``rerun the same command with --config run_id=...``.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
from dataclasses import dataclass, replace
from typing import Any

from hpcmem.inputs import refused
from hpcmem.record.jsonl import atomic_open
from hpcmem.slurm.facts import SlurmCommandError, cluster_facts, gpu_count
from hpcmem.slurm.preflight import (
    Grouping,
    GroupRequest,
    JobRequest,
    RunSettings,
    SweepRequest,
    check,
    summary_line,
)
from hpcmem.slurm.watchdog import StuckJob, Watchdog
from hpcmem.workflow.refusal import REFUSED, refuse
from hpcmem.workflow.slurm_jobs import cancelled_jobs_fail, name_jobs, retry_on_nodes_up
from hpcmem.workflow.submissions import note_submissions

__all__ = ["PREFLIGHT_REPORT", "RERUN_HINT", "job_request", "on_error", "on_start",
           "rerun_hint"]

#: environment variable: write the preflight's findings here as JSON and submit nothing
PREFLIGHT_REPORT = "HPCMEM_PREFLIGHT_REPORT"
#: environment variable: how to redo the rest of an ended run, said by what started it
#: (tools/nightly.sh: ``rerun the nightly with HPCMEM_RUN_ID=...``)
RERUN_HINT = "HPCMEM_RERUN_HINT"
_HINT_LIMIT = 300
#: seconds between two looks of the watchdog at the run's jobs
WATCH_INTERVAL = 10.0


@dataclass
class _RunState:
    """What on_error reports: why the run was ended, if hpcmem ended it."""

    ended_because: str | None = None


_state = _RunState()


def _number(value: Any) -> int | None:
    """An int resource value; None for unset or not yet known (``<TBD>``)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def job_request(job: Any, rule: str | None = None) -> JobRequest:
    """What the slurm executor plugin asks sbatch for on behalf of a Snakemake job (or
    group job: then ``rule`` names it)."""
    resources = job.resources
    cpus = _number(resources.get("cpus_per_task"))
    cpus = max(1, cpus) if cpus else max(1, job.threads)
    gpus = _number(resources.get("gpu")) or gpu_count(str(resources.get("gres") or ""))
    memory = _number(resources.get("mem_mb"))
    per_cpu = _number(resources.get("mem_mb_per_cpu"))
    nodes = _number(resources.get("nodes")) or 1
    tasks = _number(resources.get("tasks")) or nodes * (_number(resources.get("tasks_per_node"))
                                                         or 1)
    return JobRequest(
        rule=rule or job.rule.name,
        partition=_text(resources.get("slurm_partition")),
        account=_text(resources.get("slurm_account")),
        qos=_text(resources.get("qos")),
        cpus_per_task=cpus,
        tasks=tasks,
        nodes=nodes,
        mem_mb=per_cpu * cpus if per_cpu else memory,
        gpus=gpus,
        runtime_min=_number(resources.get("runtime")),
        constraint=_text(resources.get("constraint")),
    )


def _submitted(workflow: Any) -> list[Any]:
    """The jobs of this run that go to Slurm."""
    return [job for job in workflow.dag.needrun_jobs() if not (job.is_local or job.is_norun)]


def _requests(workflow: Any) -> list[JobRequest]:
    """One request per distinct job shape of the jobs this run submits."""
    return list(dict.fromkeys(job_request(job) for job in _submitted(workflow)))


def _text_settings(jobs: list[Any]) -> dict[str, dict[str, str | None]]:
    """Each text resource any of ``jobs`` sets, as each rule sets it (None: unset). Sizes
    (``mem``, ``disk``: ``mem_mb`` as text), values still to be known (``<TBD>``) and
    Snakemake's own ``_`` entries are left out, as Snakemake leaves them out when it
    combines a group's resources."""
    from snakemake.common.tbdstring import TBDString
    from snakemake.resources import SizedResources

    def texts(job: Any) -> dict[str, str]:
        return {key: value for key, value in job.resources.items()
                if isinstance(value, str) and not isinstance(value, TBDString)
                and key not in SizedResources and not key.startswith("_")}

    found = {job.rule.name: texts(job) for job in jobs}
    keys = {key for values in found.values() for key in values}
    return {key: {rule: values.get(key) for rule, values in found.items()} for key in keys}


def _group_requests(workflow: Any) -> list[GroupRequest]:
    """One request per group of jobs this run submits together (one Slurm job each)."""
    submitted = _submitted(workflow)
    found = {workflow.dag.get_job_group(job) for job in submitted} - {None}
    groups = []
    for item in sorted(found, key=lambda group: group.groupid):
        jobs = [job for job in submitted if job in item.jobs]
        group = GroupRequest(item.groupid, tuple(sorted({job.rule.name for job in jobs})),
                             _text_settings(jobs), combined=None)
        if not group.disagreements:  # else Snakemake cannot combine them
            group = replace(group, combined=job_request(item, rule=group.label))
        groups.append(group)
    return groups


def _points(workflow: Any, group: Any) -> int:
    """The points of a group job: its connected components (jobs linked by what they
    wait for), as ``group-components`` counts them."""
    root = {job: job for job in group.jobs}

    def top(job: Any) -> Any:
        while root[job] is not job:
            job = root[job]
        return job

    for job in group.jobs:
        for dep in workflow.dag.dependencies[job]:
            if dep in root:
                root[top(dep)] = top(job)
    return len({top(job) for job in group.jobs})


def _groupings(workflow: Any, index: dict[Any, int]) -> tuple[Grouping, ...]:
    """The groups holding more than one point, with the Slurm jobs made of them (``index``:
    each Slurm job's place in the sweep)."""
    jobs_of: dict[str, list[Any]] = {}
    for unit in index:
        if unit.is_group():
            jobs_of.setdefault(unit.groupid, []).append(unit)
    components = workflow.group_settings.group_components
    return tuple(Grouping(name, components.get(workflow.parent_groupids.get(name, name), 1),
                          points, frozenset(index[group] for group in groups))
                 for name, groups in sorted(jobs_of.items())
                 if (points := sum(_points(workflow, group) for group in groups)) > 1)


def _sweep(workflow: Any) -> SweepRequest:
    """Every Slurm job this run submits (a group is one), what each waits for, ``jobs:``
    (the most Snakemake keeps queued at once), and the Slurm jobs of grouped points."""
    submitted = _submitted(workflow)
    unit = {job: workflow.dag.get_job_group(job) or job for job in submitted}
    index = {job: i for i, job in enumerate(dict.fromkeys(unit.values()))}
    first = {index[unit[job]]: job for job in reversed(submitted)}
    needs: list[set[int]] = [set() for _ in index]
    for job in submitted:
        needs[index[unit[job]]].update(index[unit[dep]] for dep in workflow.dag.dependencies[job]
                                       if dep in unit and unit[dep] is not unit[job])
    return SweepRequest(tuple(job_request(first[i]) for i in range(len(index))),
                        tuple(map(frozenset, needs)), workflow.resource_settings.nodes,
                        _groupings(workflow, index))


def _train_gpu_problems(workflow: Any, facts: Any) -> list[str]:
    """One line per training point asking for more GPUs per node (its gres) than any node
    of its partition has (sinfo's Gres), naming the point, the field and both numbers."""
    lines = []
    for job in _submitted(workflow):
        if job.rule.name != "run_train_ranks":  # one GPU a point asks none per node
            continue
        per_node = gpu_count(str(job.resources.get("gres") or ""))
        name = _text(job.resources.get("slurm_partition")) or facts.default_partition
        partition = facts.partitions.get(name)
        if not per_node or partition is None or not partition.nodes:
            continue  # no GPUs asked, or a partition the general check refuses
        most = max(node.gpus for node in partition.nodes)
        if per_node > most:
            lines.append(f"run_train point {job.wildcards.point}: train.gpus_per_node: "
                         f"{per_node} GPUs per node, more than a node of partition {name!r} "
                         f"has ({most}, sinfo Gres)")
    return lines


def _without_train_gpus(problems: list[str]) -> list[str]:
    """The general check's lines less its GPU count of run_train_ranks (each point's own
    line says it)."""
    return [line for line in problems
            if not (line.startswith("gpu: ") and "(rule run_train_ranks)" in line)]


def _settings(workflow: Any) -> RunSettings:
    executor = workflow.executor_settings
    return RunSettings(qos=_text(getattr(executor, "qos", None)),
                       no_account=bool(getattr(executor, "no_account", False)))


def _write_report(path: str, document: dict[str, Any]) -> None:
    with atomic_open(path) as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")


def _preflight(workflow: Any, logger: Any, executor: str) -> None:
    """Check the jobs against the cluster; refuse the run (exit 2) on any problem."""
    from snakemake.exceptions import WorkflowError

    report = os.environ.get(PREFLIGHT_REPORT)
    if executor != "slurm":
        if report:
            _write_report(report, {"problems": [
                f"executor: {executor!r} is not slurm: there is no cluster to check "
                "(give a profile with `executor: slurm`)"]})
            raise WorkflowError("hpcmem preflight: done, nothing submitted")
        return
    requests, settings, sweep = _requests(workflow), _settings(workflow), _sweep(workflow)
    try:
        facts = cluster_facts(getpass.getuser())
        problems = check(requests, settings, facts, _group_requests(workflow), sweep)
        points = _train_gpu_problems(workflow, facts)
        problems = [*points, *(_without_train_gpus(problems) if points else problems)]
    except SlurmCommandError as error:
        facts, problems = None, [f"slurm: the cluster did not answer: {error}"]
    summary = summary_line(requests, settings, facts, sweep) if facts and not problems else None
    if report:
        _write_report(report, {"problems": problems, "summary": summary})
        raise WorkflowError("hpcmem preflight: done, nothing submitted")
    if problems:
        refuse(*(f"hpcmem preflight: {line}" for line in problems),
               f"hpcmem preflight: {len(problems)} problem(s) above: nothing was submitted; "
               "fix the profile (or the sweep) and run again", logger=logger)
    logger.info(f"hpcmem preflight: {summary}")


def _on_signal(signum: int, frame: Any) -> None:
    """SIGINT or SIGTERM (or the watchdog's SIGINT): stop as Ctrl-C does, once; Snakemake
    then cancels the run's jobs. Later signals are ignored first thing, so that neither
    they nor the watchdog interrupt the cancelling (no lock is taken here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _state.ended_because is None:
        _state.ended_because = f"{signal.Signals(signum).name} received"
    raise KeyboardInterrupt


def _on_stuck(stuck: list[StuckJob], logger: Any) -> None:
    """The watchdog's call (from its thread): name the job, then interrupt the main thread;
    nothing when the run is ending already."""
    if _state.ended_because is not None:
        return
    more = f" (and {len(stuck) - 1} more jobs)" if len(stuck) > 1 else ""
    _state.ended_because = f"{stuck[0].describe()}{more}"
    logger.error(f"hpcmem watchdog: {_state.ended_because}: ending the run")
    os.kill(os.getpid(), signal.SIGINT)


def _executor(workflow: Any) -> Any:
    """The slurm executor plugin's instance running this workflow's jobs. Snakemake has no
    public accessor for it: a Snakemake without one fails here, loudly."""
    return workflow.scheduler._executor


def _one_node_only(workflow: Any, executor: str) -> None:
    """Without Slurm every point runs on this one machine: refuse the run before any job
    when a point asks for more nodes."""
    asked = {(_number(job.resources.get("nodes")) or 1, job.rule.name)
             for job in workflow.dag.needrun_jobs()}
    nodes, rule = max(asked, default=(1, ""))
    if nodes > 1:
        key = "train.nodes" if rule.startswith("run_train") else "collectives.nodes"
        refuse(
            f"{REFUSED}config {key}: {nodes}: the {executor} executor runs "
            "every point on this one machine (accepted here: 1); multi-node points need a "
            "profile with `executor: slurm`")


def on_start(workflow: Any, logger: Any, run_id: str, journal: str) -> None:
    """``onstart``: preflight, the jobs' name, each submission noted in ``journal``
    (:mod:`hpcmem.workflow.submissions`), SIGTERM as Ctrl-C and the watchdog (slurm
    executor); without Slurm, a multi-node point is refused before any job."""
    plugin = workflow.executor_plugin
    executor = plugin.name if plugin is not None else "local"
    _preflight(workflow, logger, executor)
    if executor != "slurm":
        _one_node_only(workflow, executor)
        return
    executor_plugin = _executor(workflow)
    job_name = name_jobs(executor_plugin, bool(workflow.executor_settings.jobname_prefix),
                         run_id)
    logger.info(f"hpcmem: the Slurm jobs of this run are named {job_name}")
    note_submissions(executor_plugin, journal, logger)
    retry_on_nodes_up(executor_plugin, logger)
    cancelled_jobs_fail(executor_plugin, logger)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    Watchdog(job_name, lambda stuck: _on_stuck(stuck, logger), WATCH_INTERVAL).start()


def rerun_hint(default: str) -> str:
    """How :func:`on_error` says to redo the rest: the caller's :data:`RERUN_HINT`, else
    ``default`` (the command line's own). Read when the workflow starts, so that a hint
    that is not one line of printable text is refused before any job, naming the
    variable."""
    hint = os.environ.get(RERUN_HINT)
    if hint is None:
        return default
    if not (hint.isprintable() and 0 < len(hint) <= _HINT_LIMIT):
        raise refused(RERUN_HINT, hint, "is not one line of printable text",
                      f"1 to {_HINT_LIMIT} printable characters: how to redo the rest of "
                      "an ended run")
    return hint


def on_error(logger: Any, rerun_hint: str) -> None:
    """``onerror``: last, why the run ended (repeated where hpcmem ended it), and how to go
    on."""
    why = (f"the run was ended: {_state.ended_because}" if _state.ended_because is not None
           else "the run failed")
    logger.error(f"hpcmem: {why}. Finished points are kept: {rerun_hint}")

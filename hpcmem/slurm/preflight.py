"""Whether a run's Slurm jobs can start: partitions, accounts, QOS, node sizes and limits.

Each rule's jobs are described by a :class:`JobRequest`, what sbatch would be
asked for, each Snakemake group (rules submitted together as one Slurm job) by a
:class:`GroupRequest`, and the whole run by a :class:`SweepRequest`
(:mod:`hpcmem.slurm.requests`). :func:`check` compares them with what the cluster offers the user
(:class:`~hpcmem.slurm.facts.ClusterFacts`) and returns one line per problem,
naming the profile setting, its value, the rules that use it and what the cluster
accepts: a job Slurm would reject, or leave pending for ever, and a run that would queue
more jobs at once than its QOS or association allows (:mod:`hpcmem.slurm.limit_checks`),
are found before anything is submitted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from hpcmem.slurm.facts import ClusterFacts, PartitionFacts
from hpcmem.slurm.limit_checks import job_findings, limit_chains, queued_chains, sweep_findings
from hpcmem.slurm.requests import Grouping, GroupRequest, JobRequest, RunSettings, SweepRequest

__all__ = ["GroupRequest", "Grouping", "JobRequest", "RunSettings", "SweepRequest", "check",
           "summary_line"]


#: how a problem line about a job's runtime begins
_RUNTIME = "runtime: "


class _Problems:
    """Problem lines, each listing the rules it concerns once."""

    def __init__(self) -> None:
        self._rules: dict[tuple[str, str], list[str]] = {}
        #: (head, tail, group label): each group's own line, even when two say the same
        self._groups: dict[tuple[str, str, str], None] = {}

    def add(self, head: str, tail: str, rule: str | None = None) -> None:
        rules = self._rules.setdefault((head, tail), [])
        if rule is not None and rule not in rules:
            rules.append(rule)

    def add_new(self, found: _Problems, group: GroupRequest, runtime_fix: str = "") -> None:
        """The problems ``found`` for ``group``'s combined job that its rules alone do not
        have already, naming the group; ``runtime_fix`` follows each about its runtime."""
        for head, tail in found._rules:
            if (head, tail) not in self._rules:
                fix = runtime_fix if head.startswith(_RUNTIME) else ""
                self._groups.setdefault((head, f"{tail}{fix}", group.label))

    def about_runtime(self) -> bool:
        """Whether a problem is the job's runtime (past MaxTime or a MaxWall)."""
        return any(head.startswith(_RUNTIME) for head, _ in self._rules)

    def __len__(self) -> int:
        return len(self._rules) + len(self._groups)

    def lines(self) -> list[str]:
        lines = []
        for (head, tail), rules in self._rules.items():
            if rules:
                label = "rule" if len(rules) == 1 else "rules"
                head = f"{head} ({label} {', '.join(sorted(rules))})"
            lines.append(f"{head} {tail}")
        lines += [f"{head} ({group}) {tail}" for head, tail, group in self._groups]
        return lines


def _listed(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def _effective_account(request: JobRequest, settings: RunSettings, facts: ClusterFacts
                       ) -> str | None:
    if request.account and not settings.no_account:
        return re.split(r"[,\s]+", request.account.strip())[0].lower()
    return facts.default_account  # what Slurm charges a job submitted without -A


def _allowed_qos(facts: ClusterFacts, account: str, partition: str) -> frozenset[str] | None:
    """QOS the user's association for ``account`` on ``partition`` allows; None if none."""
    association = facts.association(account, partition)
    return association.qos if association else None


def _check_partition(request: JobRequest, facts: ClusterFacts, problems: _Problems
                     ) -> PartitionFacts | None:
    name = request.partition or facts.default_partition
    if name is None:
        problems.add("slurm_partition: not set", f"and cluster {facts.name!r} has no default "
                     f"partition (partitions: {_listed(facts.partitions)})", request.rule)
        return None
    partition = facts.partitions.get(name)
    if partition is None:
        problems.add(f"slurm_partition: {name!r}", f"is not a partition of cluster "
                     f"{facts.name!r} (partitions: {_listed(facts.partitions)})", request.rule)
        return None
    if not partition.state.startswith("UP"):
        problems.add(f"slurm_partition: {name!r}", f"is {partition.state}, not UP: its jobs "
                     "would pend until an administrator brings it up", request.rule)
    return partition


def _check_account(request: JobRequest, settings: RunSettings, facts: ClusterFacts,
                   partition: PartitionFacts | None, problems: _Problems) -> str | None:
    account = _effective_account(request, settings, facts)
    if settings.no_account or not facts.knows_associations:
        return account
    if account is None:
        if "associations" in facts.enforce:
            problems.add("slurm_account: not set", f"and user {facts.user!r} has no default "
                         f"account on cluster {facts.name!r}", request.rule)
        return None
    setting = f"slurm_account: {account!r}" if request.account else f"default account {account!r}"
    if account not in facts.accounts():
        problems.add(setting, f"is not an account of user {facts.user!r} on cluster "
                     f"{facts.name!r} (accounts: {_listed(facts.accounts())})", request.rule)
        return None
    if partition is None:
        return account
    allowed = partition.allow_accounts
    if (allowed is not None and account not in allowed) or account in partition.deny_accounts:
        problems.add(setting, f"may not submit to partition {partition.name!r} "
                     f"(AllowAccounts={_listed(allowed or ['ALL'])}, "
                     f"DenyAccounts={_listed(partition.deny_accounts)})", request.rule)
    elif _allowed_qos(facts, account, partition.name) is None:
        own = {a.partition for a in facts.associations if a.account == account}
        problems.add(setting, f"has no association with partition {partition.name!r} "
                     f"(its partitions: {_listed(own)})", request.rule)
    return account


def _check_qos(request: JobRequest, settings: RunSettings, facts: ClusterFacts,
               account: str | None, partition: PartitionFacts | None,
               problems: _Problems) -> None:
    if request.qos and settings.qos and request.qos.lower() != settings.qos.lower():
        problems.add(f"qos: {request.qos!r}", f"is overridden by slurm-qos: {settings.qos!r} "
                     "(sbatch gets --qos twice and the last one wins): set only one",
                     request.rule)
    if not facts.knows_associations:
        return
    for setting, value, rule in (("qos", request.qos, request.rule),
                                 ("slurm-qos", settings.qos, None)):
        if not value:
            continue
        qos, head = value.lower(), f"{setting}: {value!r}"
        if qos not in facts.qos:
            problems.add(head, f"is not a QOS of cluster {facts.name!r} "
                         f"(QOS: {_listed(facts.qos)})", rule)
            continue
        allowed = _allowed_qos(facts, account, partition.name) if account and partition else None
        if allowed is not None and qos not in allowed:
            problems.add(head, f"is not allowed for user {facts.user!r} with account "
                         f"{account!r} (allowed: {_listed(allowed)})", rule)
        if partition is not None and ((partition.allow_qos is not None
                                       and qos not in partition.allow_qos)
                                      or qos in partition.deny_qos):
            problems.add(head, f"may not be used in partition {partition.name!r} "
                         f"(AllowQos={_listed(partition.allow_qos or ['ALL'])}, "
                         f"DenyQos={_listed(partition.deny_qos)})", rule)


def _features(constraint: str) -> set[str]:
    """Feature names of a ``--constraint`` expression (``hbm&flat``, ``[a|b]``, ``gpu*2``)."""
    return {word for word in re.findall(r"[A-Za-z_][\w.-]*", constraint)}


def _check_fit(request: JobRequest, partition: PartitionFacts, problems: _Problems) -> None:
    nodes, rule, name = partition.nodes, request.rule, partition.name
    if not nodes:
        problems.add(f"slurm_partition: {name!r}", "has no nodes", rule)
        return
    found = len(problems)
    most_cpus = max(node.cpus for node in nodes)
    if request.nodes > len(nodes):
        problems.add(f"nodes: {request.nodes}", f"is more nodes than partition {name!r} has "
                     f"({len(nodes)})", rule)
    if request.cpus_per_task > most_cpus:
        problems.add(f"cpus_per_task: {request.cpus_per_task}", f"is more CPUs than a node of "
                     f"partition {name!r} has (at most {most_cpus})", rule)
    elif request.tasks * request.cpus_per_task > partition.total_cpus:
        problems.add(f"tasks: {request.tasks} x cpus_per_task: {request.cpus_per_task}",
                     f"is more CPUs than partition {name!r} has ({partition.total_cpus})", rule)
    most_memory = max(node.memory_mb for node in nodes)
    if request.mem_mb is not None and request.mem_mb > most_memory:
        problems.add(f"mem_mb: {request.mem_mb}", f"is more memory than a node of partition "
                     f"{name!r} has (at most {most_memory} MB)", rule)
    most_gpus = max(node.gpus for node in nodes)
    if request.gpus > most_gpus:
        problems.add(f"gpu: {request.gpus}", f"is more GPUs than a node of partition {name!r} "
                     f"has (at most {most_gpus})", rule)
    if request.runtime_min is not None and partition.max_time_min is not None \
            and request.runtime_min > partition.max_time_min:
        problems.add(f"runtime: {request.runtime_min}", f"minutes is longer than partition "
                     f"{name!r} allows (MaxTime {partition.max_time_min} minutes)", rule)
    wanted = _features(request.constraint or "")
    offered = set().union(*(node.features for node in nodes))
    if wanted - offered:
        problems.add(f"constraint: {request.constraint!r}", f"names features no node of "
                     f"partition {name!r} has: {_listed(wanted - offered)} "
                     f"(features: {_listed(offered)})", rule)
    if len(problems) > found:
        return
    if not any(node.cpus >= request.cpus_per_task and node.gpus >= request.gpus
               and node.memory_mb >= (request.mem_mb or 0) and wanted <= node.features
               for node in nodes):
        problems.add(f"cpus_per_task: {request.cpus_per_task}, mem_mb: {request.mem_mb}, "
                     f"gpu: {request.gpus}", f"do not fit together on any one node of "
                     f"partition {name!r}", rule)


def _check_request(request: JobRequest, settings: RunSettings, facts: ClusterFacts,
                   problems: _Problems) -> None:
    """Everything about one job: partition, account, QOS, its fit, and the limits on it."""
    partition = _check_partition(request, facts, problems)
    account = _check_account(request, settings, facts, partition, problems)
    _check_qos(request, settings, facts, account, partition, problems)
    if partition is not None:
        _check_fit(request, partition, problems)
    for head, tail in job_findings(request, limit_chains(request, settings, facts, account,
                                                         partition)):
        problems.add(head, tail, request.rule)


def _check_group(group: GroupRequest, settings: RunSettings, facts: ClusterFacts,
                 problems: _Problems, point_minutes: dict[str, int],
                 grouping: Grouping | None) -> None:
    """Rules of a group that ask for different text settings (Snakemake cannot submit the
    group), else what only the combined job does not fit (a runtime summed past MaxTime or
    a QOS's MaxWall); for a job of grouped points (``grouping``), the ``group-components``
    that would fit that runtime (``point_minutes``: each rule's runtime)."""
    for setting, values in sorted(group.disagreements.items()):
        asked = "; ".join(f"{rule}: {'unset' if value is None else repr(value)}"
                          for rule, value in sorted(values.items()))
        problems.add(f"{setting}: differs within group {group.name!r} ({asked})",
                     "but a group is one Slurm job: give its rules one value, or run a "
                     "rule on its own (snakemake --groups RULE=NAME)")
    if group.combined is not None:
        found = _Problems()
        _check_request(group.combined, settings, facts, found)
        fix = ""
        if grouping is not None and found.about_runtime():
            fix = _fewer_points(group, grouping, settings, facts,
                                max(point_minutes.get(rule) or 0 for rule in group.rules))
        problems.add_new(found, group, fix)


def _fewer_points(group: GroupRequest, grouping: Grouping, settings: RunSettings,
                  facts: ClusterFacts, minutes: int) -> str:
    """How many of ``grouping``'s points of ``minutes`` each one job fits in the time limits
    its combined job goes past, as a fix to say; none when not even one does. A job's
    runtime grows with its points, so the most that fit are found by bisection."""
    assert group.combined is not None

    def fits(points: int) -> bool:
        trial = _Problems()
        _check_request(replace(group.combined, runtime_min=points * minutes), settings, facts,
                       trial)
        return not trial.about_runtime()

    low, high = 0, grouping.components - 1  # the most that fit lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return f": set group-components: {grouping.name}={low} or fewer" if low else ""


def _check_sweep(sweep: SweepRequest, settings: RunSettings, facts: ClusterFacts,
                 problems: _Problems) -> None:
    """The run's jobs together against the job count limits that apply to them."""
    chains = [limit_chains(job, settings, facts, _effective_account(job, settings, facts),
                           facts.partitions.get(job.partition or facts.default_partition or ""))
              for job in sweep.jobs]
    for head, tail in sweep_findings(sweep, chains, queued_chains(facts)):
        problems.add(head, tail)


def check(requests: Iterable[JobRequest], settings: RunSettings, facts: ClusterFacts,
          groups: Iterable[GroupRequest] = (), sweep: SweepRequest | None = None
          ) -> list[str]:
    """One line per problem that would keep a job from being accepted or from starting, or
    the run's jobs from being queued and run together (``sweep``)."""
    problems = _Problems()
    requests = list(requests)
    if facts.accounting_error:
        problems.add("sacctmgr:", f"cannot list the accounts and QOS of user {facts.user!r}: "
                     f"{facts.accounting_error}")
    for request in requests:
        _check_request(request, settings, facts, problems)
    point_minutes = {request.rule: request.runtime_min or 0 for request in requests}
    groupings = {grouping.name: grouping for grouping in sweep.groupings} if sweep else {}
    for group in groups:
        _check_group(group, settings, facts, problems, point_minutes,
                     groupings.get(group.name))
    if sweep is not None:
        _check_sweep(sweep, settings, facts, problems)
    return problems.lines()


def _submissions(sweep: SweepRequest) -> str:
    """``; 11 Slurm jobs (group points: 225 points in 9)``: what the run submits."""
    grouped = ", ".join(f"group {g.name}: {g.points} points in {len(g.jobs)}"
                        for g in sweep.groupings)
    return f"; {len(sweep.jobs)} Slurm jobs" + (f" ({grouped})" if grouped else "")


def summary_line(requests: Iterable[JobRequest], settings: RunSettings, facts: ClusterFacts,
                 sweep: SweepRequest | None = None) -> str:
    """What was checked, for a run that passed: rules, partitions, accounts and QOS, and
    the Slurm jobs of ``sweep``."""
    requests = list(requests)
    partitions = {r.partition or facts.default_partition or "?" for r in requests}
    accounts = {_effective_account(r, settings, facts) or "(none)" for r in requests}
    qos = {q for r in requests for q in (r.qos, settings.qos) if q} or {"(default)"}
    checked = "; accounts and QOS not checked: accounting is disabled" \
        if facts.accounting_disabled else ""
    if sweep is not None and facts.queued is None:
        checked += f"; your jobs queued already not counted: {facts.queue_error}"
    jobs = _submissions(sweep) if sweep is not None else ""
    return (f"{len({r.rule for r in requests})} rules fit cluster {facts.name!r}: partitions "
            f"{_listed(partitions)}; accounts {_listed(accounts)}; QOS {_listed(qos)}{jobs}"
            f"{checked}")

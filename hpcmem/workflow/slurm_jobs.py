"""What the workflow's Slurm jobs are: how they are named, and how grouped points share one.

**Names.** The slurm executor plugin names every job of a run ``[PREFIX_]<uuid>``, and
selects the run's jobs by that name in its status queries, so a job's name names its run,
never its rule or point. :func:`name_jobs` makes PREFIX ``hpcmem-<run id>``
(:func:`job_name_prefix`) where the profile or the command line gives no
``slurm-jobname-prefix`` (``tools/nightly.sh`` gives the same one itself: it finds the
night's jobs again by it). The rule and point are in the plugin's
``--comment``: ``rule_run_collectives_wildcards_<point>``, a grouped job's
``rule_<group>_<rules>``.

**Grouped points.** Snakemake sizes a group job for the jobs of it that could run side by
side (their CPUs, tasks and memory summed), but the plugin runs a group's jobs one after
another (``--jobs 1``). :func:`points_in_turn` gives each group job one
:data:`ONE_AT_A_TIME` slot (a resource local to each submitted job) and every point takes
all of it (:func:`point_slot`), so a group job asks for the most nodes, tasks and memory
of its points and the sum of their runtimes.

**Retries after a lost node.** When a job ends ``NODE_FAIL`` the plugin adds its whole node
list to ``--exclude`` for every later submission of the run, the nodes that stayed up too,
so its retry (``retries:``) is refused where the partition has no other nodes (``Requested
node configuration is not available``) and later jobs lose healthy nodes. Slurm starts
nothing on a node that is down, so :func:`retry_on_nodes_up` leaves the lost node to it:
the retry waits for nodes that are up; the nodes a site excludes
(``slurm-exclude-failed-nodes``) stay excluded.

**A job cancelled underneath the run.** sacct says ``CANCELLED by <uid>`` of a job someone
cancelled (``scancel``, an admin), which the plugin does not recognise: it would wait for the
job for ever. :func:`cancelled_jobs_fail` makes it read the state as ``CANCELLED``, one of its
failures, so the job fails like any other: under ``keep-going`` the other jobs go on, and
the run ends listing the cancelled job's unfinished points. Such a job is not retried
(``retries:``): someone stopped it on purpose, and a rerun redoes its points.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ONE_AT_A_TIME", "cancelled_jobs_fail", "job_name_prefix", "name_jobs",
           "point_slot", "points_in_turn", "read_cancelled", "retry_on_nodes_up"]

#: the resource a grouped job has 1 of and each of its points takes all of
ONE_AT_A_TIME = "one_at_a_time"
#: what the slurm executor plugin does not accept in a job-name prefix, and its most length
_NOT_ACCEPTED = re.compile(r"[^A-Za-z0-9_-]")
_PREFIX_LENGTH = 50


def job_name_prefix(run_id: str) -> str:
    """The job-name prefix of run ``run_id``: ``hpcmem-<run id>``, each character the
    plugin does not accept an ``_``, at most 50 characters.

    >>> job_name_prefix("nightly-20261201"), job_name_prefix("trial.2")
    ('hpcmem-nightly-20261201', 'hpcmem-trial_2')
    """
    return _NOT_ACCEPTED.sub("_", f"hpcmem-{run_id}")[:_PREFIX_LENGTH]


def name_jobs(executor: Any, prefix_given: bool, run_id: str) -> str:
    """The name of every Slurm job of the run, ``hpcmem-<run id>_<uuid>`` unless a prefix
    was given (``prefix_given``). Called before the first submission: the plugin names each
    job, and finds it again, by its ``run_uuid`` of the moment (a plugin without one fails
    here, loudly)."""
    if not prefix_given:
        executor.run_uuid = f"{job_name_prefix(run_id)}_{executor.run_uuid}"
    return executor.run_uuid


def points_in_turn(workflow: Any) -> None:
    """Give each submitted job one :data:`ONE_AT_A_TIME` slot (while the Snakefile is read,
    before any group job is sized)."""
    workflow.resource_scopes[ONE_AT_A_TIME] = "local"
    workflow.register_resource(ONE_AT_A_TIME, 1)


def point_slot(workflow: Any) -> Callable[[Any], int]:
    """A point's :data:`ONE_AT_A_TIME` resource: all of the slot where jobs are grouped (a
    cluster executor, or a dry run showing its jobs), none on the local executor, whose
    points run side by side as its cores allow."""
    return lambda wildcards: 1 if workflow.non_local_exec_or_dryrun else 0


class _SiteExcluded(set):
    """The plugin's nodes to exclude: a site's, kept; a lost job's node list, said and left
    to Slurm (module docstring)."""

    def __init__(self, site: set[str], logger: Any) -> None:
        super().__init__(site)
        self._logger = logger

    def add(self, nodes: str) -> None:
        self._logger.warning(f"hpcmem: a job lost a node of {nodes}: its retry runs on nodes "
                             "Slurm has up, none of them excluded")


def retry_on_nodes_up(executor: Any, logger: Any) -> None:
    """Leave a lost job's nodes to Slurm (module docstring) on the slurm executor's instance
    ``executor`` (a plugin without its node list fails here, loudly)."""
    executor._failed_nodes = _SiteExcluded(set(executor._failed_nodes), logger)


def read_cancelled(states: dict[str, str], cancelled: set[str]) -> None:
    """In the plugin's ``states`` (job id: sacct's state), make each ``CANCELLED by <uid>``
    read ``CANCELLED``, adding its job id to ``cancelled``."""
    for job_id, state in states.items():
        if state.startswith("CANCELLED by "):
            states[job_id] = "CANCELLED"
            cancelled.add(job_id)


def cancelled_jobs_fail(executor: Any, logger: Any) -> None:
    """Have the slurm executor's instance ``executor`` fail a job cancelled underneath the
    run, without retrying it (module docstring). Its plugin's status query and error report
    are wrapped: a plugin without them fails here, loudly."""
    plugin = sys.modules[type(executor).__module__]
    query, report = plugin.query_job_status, executor.report_job_error
    cancelled: set[str] = set()

    async def query_job_status(command: str, plugin_logger: Any) -> tuple[Any, Any]:
        states, took = await query(command, plugin_logger)
        read_cancelled(states or {}, cancelled)
        return states, took

    def report_job_error(job_info: Any, msg: str | None = None, **kwargs: Any) -> None:
        if job_info.external_jobid in cancelled:
            job = job_info.job
            job.attempt = job.restart_times + 1  # its retries spent: Snakemake retries none
            logger.error(f"hpcmem: Slurm job {job_info.external_jobid} was cancelled "
                         "underneath the run: it is not retried, and the run goes on without "
                         "its unfinished points")
        report(job_info, msg=msg, **kwargs)

    plugin.query_job_status = query_job_status
    executor.report_job_error = report_job_error

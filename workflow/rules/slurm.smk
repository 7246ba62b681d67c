# On the slurm executor: a preflight of every job against the cluster before the first
# submission, the run's jobs named hpcmem-<run id>_<uuid>, each submission noted in
# SLURM_JOBS (the report's job table), a watchdog that ends the run naming a job pending
# for a reason that does not clear by itself, SIGTERM handled like Ctrl-C (the run's jobs
# are cancelled), a job cancelled underneath the run failed and not retried, and a job
# that lost a node retried on the nodes Slurm has up (hpcmem/workflow/slurm_jobs.py). See hpcmem/workflow/slurm.py.
# Without Slurm these do nothing. On any executor, a run that fails or is ended lists its
# unfinished points, and why, in RUN/logs/unfinished.txt (hpcmem/workflow/unfinished.py).
# The points a profile groups (groups:, group-components:) run one at a time in their job
# (hpcmem/workflow/slurm_jobs.py).

from hpcmem.workflow import slurm as slurm_run
from hpcmem.workflow.slurm_jobs import points_in_turn
from hpcmem.workflow.unfinished import report_unfinished

points_in_turn(workflow)


onstart:
    slurm_run.on_start(workflow, logger, config["run_id"], SLURM_JOBS)


#: how to redo the rest of an ended run: the caller's (HPCMEM_RERUN_HINT), else this command's
with refuse_bad_input():
    RERUN_HINT = slurm_run.rerun_hint(
        f"rerun the same command with --config run_id={config['run_id']} to redo the rest"
    )


onerror:
    report_unfinished(workflow, logger, SLURM_JOBS, f"{RUN}/logs/unfinished.txt")
    slurm_run.on_error(logger, RERUN_HINT)

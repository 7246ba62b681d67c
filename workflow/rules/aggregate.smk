# Records -> summary (pandas) -> regression verdict -> HTML report. On a cluster these steps
# are one job (group summarise): they take seconds, and each job of its own would wait in the
# queue and for the executor's next status check. Each step's errors go to its log and to
# the terminal (hpcmem/workflow/step_output.py): a full disk that keeps the log empty still
# shows why the step failed.

import glob

from hpcmem.workflow import outcome
from hpcmem.workflow.step_output import logged

#: every Slurm job of this run, reruns included, as submitted (hpcmem/workflow/submissions.py
#: writes it; none without Slurm): the report's table of jobs, with sacct's state of each
SLURM_JOBS = f"{RUN}/logs/slurm_jobs.jsonl"


rule aggregate_results:
    group:
        "summarise"
    input:
        venv=rules.install_wheel.output.venv,
        records=get_all_records,
    output:
        summary=directory(f"{RUN}/summary"),
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/aggregate_results.log",
    params:
        hpcmem=get_hpcmem,
    shell:
        logged("{params.hpcmem:q} aggregate {input.records:q} --out {output.summary:q}")
        + "; exit $status"


rule check_regressions:
    group:
        "summarise"
    input:
        venv=rules.install_wheel.output.venv,
        summary=rules.aggregate_results.output.summary,
        references=config["check"]["references"],
    output:
        verdict=f"{RUN}/check/verdict.txt",
        verdict_json=f"{RUN}/check/verdict.json",
        status=f"{RUN}/check/exit_status",
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/check_regressions.log",
    params:
        hpcmem=get_hpcmem,
        history=config["check"]["history"],
    shell:
        # The full table goes to {output.verdict}, the short summary to the log.
        # Exit status 1 is a verdict (a regression), not a failure of this rule: it is kept in
        # {output.status} and turned into the workflow's exit status by report_verdict below.
        # Status 2 (bad input) and above fail the rule.
        logged("{params.hpcmem:q} check {input.summary:q} --references {input.references:q}"
               " --history {params.history:q} --verdict-out {output.verdict_json:q}"
               " --table-out {output.verdict:q}")
        + "; if [ $status -gt 1 ]; then exit $status; fi; echo $status > {output.status:q}"


# The native comparison points (images in use): a summary of their own for the report.
use rule aggregate_results as aggregate_native with:
    input:
        venv=rules.install_wheel.output.venv,
        records=get_native_records,
    output:
        summary=directory(f"{RUN}/native/summary"),
    log:
        f"{RUN}/logs/aggregate_native.log",


rule render_report:
    group:
        "summarise"
    input:
        venv=rules.install_wheel.output.venv,
        summary=rules.aggregate_results.output.summary,
        verdict=rules.check_regressions.output.verdict_json,
        native=lambda wildcards: rules.aggregate_native.output.summary if compare_native() else [],
    output:
        report=f"{RUN}/report/report.html",
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/render_report.log",
    params:
        hpcmem=get_hpcmem,
        native=lambda wildcards, input: ["--native", input.native] if input.native else [],
        jobs=SLURM_JOBS,
    shell:
        logged("{params.hpcmem:q} report {input.summary:q} --verdict {input.verdict:q}"
               " {params.native:q} --slurm-jobs {params.jobs:q} --out {output.report:q}")
        + "; exit $status"


onsuccess:
    # which image each benchmark used (or why it ran natively), then the verdict's summary
    # when this invocation asked for it; a regression fails the run (check.fail_on_regression)
    for line in outcome.image_lines(glob.glob(rules.build_container.output.ref.format(image="*"))):
        print(line)
    if any(job.rule.name == "check_regressions" for job in workflow.dag.jobs):
        with stop_on_error():
            outcome.report_verdict(
                verdict_json=rules.check_regressions.output.verdict_json,
                table=rules.check_regressions.output.verdict,
                report=rules.render_report.output.report,
                status=rules.check_regressions.output.status,
                run_id=config["run_id"],
                fail_on_regression=config["check"]["fail_on_regression"],
            )

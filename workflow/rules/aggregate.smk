# Records -> summary (pandas) -> HTML report and regression verdict.


rule aggregate_results:
    input:
        venv=rules.install_wheel.output.venv,
        records=get_all_records,
    output:
        summary=directory(f"{RUN}/summary"),
    container:
        CPU_IMAGE
    log:
        f"{RUN}/logs/aggregate_results.log",
    params:
        hpcmem=get_hpcmem,
    shell:
        "{params.hpcmem:q} aggregate {input.records:q} --out {output.summary:q} > {log:q} 2>&1"


rule render_report:
    input:
        venv=rules.install_wheel.output.venv,
        summary=rules.aggregate_results.output.summary,
    output:
        report=f"{RUN}/report/report.html",
    container:
        CPU_IMAGE
    log:
        f"{RUN}/logs/render_report.log",
    params:
        hpcmem=get_hpcmem,
    shell:
        "{params.hpcmem:q} report {input.summary:q} --out {output.report:q} > {log:q} 2>&1"


rule check_regressions:
    input:
        venv=rules.install_wheel.output.venv,
        summary=rules.aggregate_results.output.summary,
        references=config["check"]["references"],
    output:
        verdict=f"{RUN}/check/verdict.txt",
        status=f"{RUN}/check/exit_status",
    container:
        CPU_IMAGE
    log:
        f"{RUN}/logs/check_regressions.log",
    params:
        hpcmem=get_hpcmem,
        history=config["check"]["history"],
    shell:
        # exit status 1 is a verdict (a regression), not a failure of the rule: it is kept in
        # {output.status} for tools/run-workflow.sh and cron; 2 (bad input) and above fail the rule.
        "status=0; {params.hpcmem:q} check {input.summary:q} --references {input.references:q}"
        " --history {params.history:q} > {output.verdict:q} 2> {log:q} || status=$?;"
        " if [ $status -gt 1 ]; then exit $status; fi; echo $status > {output.status:q}"

# One GPU job per training point: model x size x Unified Memory policy x GPU budget.
# On a node without a GPU `hpcmem train --skip-if-no-gpu` writes a skipped record with its reason.


rule run_train:
    input:
        venv=rules.install_wheel.output.venv,
    output:
        records=f"{RUN}/train/{{model}}/{{params}}/{{policy}}/budget_{{budget}}.jsonl",
    container:
        GPU_IMAGE
    log:
        f"{RUN}/logs/train/{{model}}_{{params}}_{{policy}}_budget_{{budget}}.log",
    params:
        env=get_run_env,
        hpcmem=get_hpcmem,
        policy=get_policy,
        options=get_train_options,
    threads: 4
    resources:
        gpu=1,
    shell:
        "env {params.env:q} {params.hpcmem:q} train --model {wildcards.model:q}"
        " --policy {params.policy:q} {params.options:q}"
        " --skip-if-no-gpu --output {output.records:q} > {log:q} 2>&1"

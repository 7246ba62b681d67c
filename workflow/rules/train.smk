# One GPU job per training point: model x size x Unified Memory policy x GPU budget.
# On a node without a GPU `hpcmem train --skip-if-no-gpu` writes a skipped record with its reason.
# In images the job runs `apptainer exec --nv ... IMAGE hpcmem train ...`.


rule run_train:
    input:
        unpack(benchmark_inputs(gpu=True)),
    output:
        records=f"{RUN}/train/{{model}}/{{params}}/{{policy}}/budget_{{budget}}.jsonl",
    container:
        str(CONTAINERS.gpu_image)
    log:
        f"{RUN}/logs/train/{{model}}_{{params}}_{{policy}}_budget_{{budget}}.log",
    params:
        env=get_run_env,
        command=get_train_command,
    threads: 4
    resources:
        gpu=1,
    shell:
        "env {params.env:q} {params.command:q} > {log:q} 2>&1"

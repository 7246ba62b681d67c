# One GPU job per training point: model x size x Unified Memory policy x GPU budget. A point's
# folder is the swept part of its record's key (hpcmem/train/spec.py):
# <model>/params=<count>/budget=<bytes|none>/policy=<name>.
# On a node without a GPU `hpcmem train --skip-if-no-gpu` writes a skipped record with its reason.
# In images the job runs `apptainer exec --nv ... IMAGE hpcmem train ...`.


rule run_train:
    input:
        unpack(benchmark_inputs(gpu=True)),
    output:
        records=f"{RUN}/train/{{point}}.jsonl",
    wildcard_constraints:
        point=TRAIN.folder_pattern(),
    container:
        str(CONTAINERS.gpu_image)
    log:
        f"{RUN}/logs/train/{{point}}.log",
    params:
        env=commands.run_env(config, GIT_SHA),
        command=get_command(TRAIN, commands.train_command),
    threads: 4
    resources:
        gpu=1,
    shell:
        "env {params.env:q} {params.command:q} > {log:q} 2>&1"

# One job per training point: model x size x Unified Memory policy x GPU budget x GPU count
# (train.nodes x train.gpus_per_node, one rank per GPU). A point's folder is the swept part
# of its record's key (hpcmem/train/spec.py):
# <model>/params=<count>/budget=<bytes|none>/policy=<name>[/gpus=<n>], gpus only above 1.
# On a node without a GPU `hpcmem train --skip-if-no-gpu` writes a skipped record with its reason.
# A point of one GPU is run_train: one task asking one GPU (a site without GPUs sets gpu: 0),
# run in a job step as any job. A point of several GPUs (its folder ends in gpus=<n>) is
# run_train_ranks: `hpcmem train --world-size N` on each of its ranks under the launcher
# resources.mpi, srun under the Slurm executor (--nodes, --ntasks-per-node, --ntasks,
# MASTER_ADDR the job's first node and MASTER_PORT one of the job's own), else torchrun on
# this machine (one node); rank 0 writes the point's one merged record. The Slurm executor
# gets its layout as the job's nodes and tasks per node and its GPUs per node as gres
# gpu:<n> (none under train.device cpu); an mpi resource makes the plugin run the job's
# command in the batch step, where the command's own srun starts the ranks.
# In images each rank runs `apptainer exec --nv ... IMAGE hpcmem train ...`.

import os


rule run_train:
    input:
        unpack(benchmark_inputs(gpu=True)),
    output:
        records=f"{RUN}/train/{{point}}.jsonl",
    wildcard_constraints:
        point=f"(?!.*/gpus=){TRAIN.folder_pattern()}",
    container:
        str(CONTAINERS.gpu_image)
    log:
        f"{RUN}/logs/train/{{point}}.log",
    params:
        env=commands.run_env(config, GIT_SHA),
        launch=[],
        command=get_command(TRAIN, commands.train_command),
    threads: 4
    resources:
        gpu=int(config["train"]["device"] != "cpu"),
    shell:
        "env {params.env:q} {params.launch:q} {params.command:q} > {log:q} 2>&1"


use rule run_train as run_train_ranks with:
    wildcard_constraints:
        point=f"(?=.*/gpus=){TRAIN.folder_pattern()}",
    params:
        env=commands.run_env(config, GIT_SHA),
        launch=lambda wildcards, resources: commands.train_launch(
            get_layout(wildcards, TRAIN), str(resources.mpi), PYTHON),
        command=get_command(TRAIN, commands.train_command),
    resources:
        gpu=0,  # the plugin refuses gpu and a gres of GPUs together
        gres=lambda wildcards: "" if config["train"]["device"] == "cpu" else (
            f"gpu:{get_layout(wildcards, TRAIN).tasks_per_node}"),
        # srun where the Slurm executor submits the job and inside the job it runs (known
        # once the run's executor is, not when the rule is read), torchrun elsewhere
        mpi=lambda wildcards: "srun" if os.environ.get("SLURM_JOB_ID") or str(getattr(
            workflow.executor_plugin, "name", "")).startswith("slurm") else "torchrun",
        nodes=lambda wildcards: get_layout(wildcards, TRAIN).slurm_resources()["nodes"],
        tasks_per_node=lambda wildcards: get_layout(wildcards, TRAIN).slurm_resources()[
            "tasks_per_node"],

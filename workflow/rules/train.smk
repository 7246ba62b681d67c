# One job per training point: model x size x Unified Memory policy x GPU budget x GPU count
# (train.nodes x train.gpus_per_node, one rank per GPU). A point's folder is the swept part
# of its record's key (hpcmem/train/spec.py):
# <model>/params=<count>/budget=<bytes|none>/policy=<name>[/gpus=<n>], gpus only above 1.
# On a node without a GPU `hpcmem train --skip-if-no-gpu` writes a skipped record with its reason.
# A point of several GPUs runs `hpcmem train --world-size N` on each of its ranks under the
# launcher resources.mpi: "srun" in profiles/slurm (--nodes, --ntasks-per-node, --ntasks,
# MASTER_ADDR the job's first node and MASTER_PORT one of the job's own), else torchrun on
# this machine (one node); rank 0 writes the point's one merged record. The Slurm executor
# gets the layout as the job's nodes and tasks per node and the GPUs per node as gres
# gpu:<n> (none under train.device cpu).
# In images each rank runs `apptainer exec --nv ... IMAGE hpcmem train ...`.


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
        launch=lambda wildcards, resources: commands.train_launch(
            get_layout(wildcards, TRAIN), str(resources.mpi), PYTHON),
        command=get_command(TRAIN, commands.train_command),
    threads: 4
    resources:
        gpu=1,
        mpi="torchrun",
        # GPUs per node; none on the cpu device
        gres=lambda wildcards: "" if config["train"]["device"] == "cpu" else (
            f"gpu:{get_layout(wildcards, TRAIN).tasks_per_node}"),
        nodes=lambda wildcards: get_layout(wildcards, TRAIN).slurm_resources()["nodes"],
        tasks_per_node=lambda wildcards: get_layout(wildcards, TRAIN).slurm_resources()[
            "tasks_per_node"],
    shell:
        "env {params.env:q} {params.launch:q} {params.command:q} > {log:q} 2>&1"

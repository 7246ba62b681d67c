# One job per collectives point: op x buffer kind x layout (nodes x tasks per node) x
# numactl binding. A point's folder is the swept part of its records' key
# (hpcmem/collectives/spec.py): <op>/<buffer>/ranks=<R>[/nodes=<N>]/binding=<name>, the
# nodes part only on several nodes. Every rank runs under `hpcmem bind --skip-unavailable
# --name NAME BINDING --`, which applies the binding and records it under the point's name;
# a binding the node cannot provide (hbw without HBW nodes and no emulation) makes every
# point of the job a skipped record with the reason, never a missing one.
# The launcher is resources.mpi: mpiexec unless a profile sets the site's ("mpirun ..." in
# profiles/local, "srun" in profiles/slurm), with the layout's options (srun: --nodes,
# --ntasks-per-node, --ntasks; mpirun: -n); in images it starts one container per rank
# (`srun ... apptainer exec ... IMAGE hpcmem ...`). The Slurm executor gets the layout as
# the job's nodes and tasks per node. On a cluster the site profile puts the points in
# group points (groups:), group-components of them in one Slurm job: that job runs them one
# at a time (each takes the one_at_a_time slot the workflow gives a grouped job:
# hpcmem/workflow/slurm_jobs.py), asking for the most nodes, tasks and memory of its points
# and the sum of their runtimes.

from hpcmem.workflow.slurm_jobs import point_slot


rule run_collectives:
    input:
        unpack(benchmark_inputs(gpu=False)),
    output:
        records=f"{RUN}/collectives/{{point}}.jsonl",
        osu=f"{RUN}/collectives/{{point}}.osu.txt",
    wildcard_constraints:
        point=COLLECTIVES.folder_pattern(),
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/collectives/{{point}}.log",
    params:
        env=commands.run_env(config, GIT_SHA),
        launch=lambda wildcards, resources: get_layout(wildcards).launch_options(str(resources.mpi)),
        command=get_command(COLLECTIVES, commands.collectives_command),
    threads: lambda wildcards: get_layout(wildcards).ranks
    resources:
        mpi="mpiexec",
        nodes=lambda wildcards: get_layout(wildcards).slurm_resources()["nodes"],
        tasks_per_node=lambda wildcards: get_layout(wildcards).slurm_resources()["tasks_per_node"],
        one_at_a_time=point_slot(workflow),
    shell:
        # the OSU text goes to a name of this job's own (the shell's PID), so an orphan of a
        # killed run and its rerun never share a file (the records are written the same way);
        # a failed or terminated job removes it
        "tmp={output.osu:q}.$$.tmp; trap 'rm -f \"$tmp\"' EXIT; trap 'exit 143' TERM INT HUP; "
        "env {params.env:q} {resources.mpi} {params.launch:q} {params.command:q}"
        ' > "$tmp" 2> {log:q}; mv "$tmp" {output.osu:q}'


# The same points natively, when they run in an image (container.compare_native): the report
# puts both side by side with the container's overhead per op and size. Without an image
# input the command runs natively.
use rule run_collectives as run_collectives_native with:
    input:
        venv=rules.install_wheel.output.venv,
    output:
        records=f"{RUN}/native/collectives/{{point}}.jsonl",
        osu=f"{RUN}/native/collectives/{{point}}.osu.txt",
    log:
        f"{RUN}/logs/native/collectives/{{point}}.log",

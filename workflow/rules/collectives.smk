# One MPI job per collectives point: op x buffer kind x rank count x numactl binding.
# Every rank runs under `hpcmem bind BINDING --`, which applies the binding and records it.
# The launcher comes from the profile: resources.mpi ("mpirun ..." locally, "srun" on Slurm).


rule run_collectives:
    input:
        venv=rules.install_wheel.output.venv,
    output:
        records=f"{RUN}/collectives/{{op}}/{{buffer}}/ranks{{ranks}}/{{binding}}.jsonl",
        osu=f"{RUN}/collectives/{{op}}/{{buffer}}/ranks{{ranks}}/{{binding}}.osu.txt",
    container:
        CPU_IMAGE
    log:
        f"{RUN}/logs/collectives/{{op}}_{{buffer}}_ranks{{ranks}}_{{binding}}.log",
    params:
        env=get_run_env,
        hpcmem=get_hpcmem,
        binding=get_binding,
        options=get_collectives_options,
    threads: lambda wildcards: int(wildcards.ranks)
    resources:
        tasks=lambda wildcards: int(wildcards.ranks),
    shell:
        "env {params.env:q} {resources.mpi} -n {resources.tasks}"
        " {params.hpcmem:q} bind -- {params.binding:q} --"
        " {params.hpcmem:q} collectives --op {wildcards.op:q} --buffer {wildcards.buffer:q}"
        " {params.options:q} --output {output.records:q}"
        " > {output.osu:q}.tmp 2> {log:q} && mv {output.osu:q}.tmp {output.osu:q}"

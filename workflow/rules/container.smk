# Apptainer/Singularity images: one job per image a benchmark runs in, only when
# container.enabled resolves to a runtime (the benchmark rules ask for them through
# benchmark_inputs). Both images build hpcmem from the source tree inside themselves (the CPU
# image for the collectives, the GPU image for training), so the job needs no wheel of the
# host's. Images are cached in container.image_dir under a key of what they are made of, so a
# run rebuilds one only when its definition, build arguments or sources changed;
# RUN/build/images/NAME.json says which image this run uses, or why it runs natively (auto).


rule build_container:
    input:
        definition=lambda wildcards: str(CONTAINERS.image(wildcards.image).definition),
    output:
        ref=f"{RUN}/build/images/{{image}}.json",
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/build_container_{{image}}.log",
    params:
        python=PYTHON,
        script=os.path.join(workflow.basedir, "scripts", "build_container.py"),
        options=lambda wildcards: CONTAINERS.build_options(wildcards.image, SOURCE_DIR),
    threads: 2
    shell:
        "{params.python:q} {params.script:q} {params.options:q}"
        " --log {log:q} --out {output.ref:q}"

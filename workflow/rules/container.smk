# Apptainer/Singularity images (the `container_build` rule of issue 5): built only when
# container.enabled resolves to a runtime, since only then do the benchmark rules ask for them
# (benchmark_inputs). The CPU image serves run_collectives, the GPU image run_train. Images
# live in container.image_dir between runs, each with its digest in <image>.digest.json.


rule build_container:
    input:
        definition=get_container_definition,
    output:
        image=os.path.join(CONTAINERS.image_dir, "{image}.sif"),
        digest=os.path.join(CONTAINERS.image_dir, "{image}.digest.json"),
    log:
        f"{RUN}/logs/build_container_{{image}}.log",
    params:
        python=PYTHON,
        script=os.path.join(workflow.basedir, "scripts", "build_container.py"),
        runtime=CONTAINERS.runtime,
        context=SOURCE_DIR,
    threads: 4
    run:
        # a separate process: the build runs for minutes and spython changes directory
        shell(
            "{params.python:q} {params.script:q} {input.definition:q} {output.image:q}"
            " {output.digest:q} {params.runtime:q} {params.context:q} > {log:q} 2>&1"
        )

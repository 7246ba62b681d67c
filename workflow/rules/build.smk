# Build the native extensions once per run into a wheel, and install it into a per-run
# environment that every benchmark job then uses. The wheel build reuses scikit-build-core's
# CMake folder (build/<wheel tag>, as `make native` does) under the same lock, so a rebuild is
# incremental and never races an editable install. On a cluster both steps are one job
# (group build): one wait in the queue instead of two. The build runs as many compile jobs
# as the job has CPUs: its threads, or the profile's cpus_per_task (what sbatch asks for).


rule build_wheel:
    group:
        "build"
    output:
        wheelhouse=directory(f"{RUN}/build/wheelhouse"),
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/build_wheel.log",
    params:
        python=PYTHON,
        source=SOURCE_DIR,
        lock=os.path.join(SOURCE_DIR, "build", "build.lock"),
    threads: 4
    resources:
        cpus_per_task=lambda wildcards, threads: threads,
    shell:
        "mkdir -p \"$(dirname {params.lock:q})\" &&"
        " CMAKE_BUILD_PARALLEL_LEVEL={resources.cpus_per_task} flock {params.lock:q}"
        " {params.python:q} -m pip wheel --no-build-isolation --no-deps"
        " --wheel-dir {output.wheelhouse:q} {params.source:q} > {log:q} 2>&1"


rule install_wheel:
    group:
        "build"
    input:
        wheelhouse=rules.build_wheel.output.wheelhouse,
    output:
        venv=directory(f"{RUN}/build/venv"),
        manifest=f"{RUN}/build/manifest.json",
    container:
        str(CONTAINERS.cpu_image)
    log:
        f"{RUN}/logs/install_wheel.log",
    params:
        git_sha=GIT_SHA,
    script:
        "../scripts/install_wheel.py"

"""Get one image for this run: reuse the cached build, build it, or use the prebuilt one;
then write the run's reference to it (``RUN/build/images/NAME.json``).

The CPU image installs hpcmem from this run's wheel: the wheelhouse handed to the build holds
that wheel and the wheels of the packages the benchmarks import in the image, at the versions
installed here, so the image runs what the native jobs run. With ``--required`` (container.
enabled: true) a failure exits 1 naming the build log; otherwise (auto) the reference says the
benchmarks run natively and why, one line on stderr says so, and the job succeeds.

    python build_container.py --name NAME --definition DEF --image-dir DIR --runtime RUNTIME
        --context REPO --wheelhouse DIR [--build-arg K=V ...] [--prebuilt SIF] [--gpu]
        [--required] --log LOG --out REF.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from hpcmem.record.jsonl import atomic_open
from hpcmem.workflow.apptainer import runtime_version
from hpcmem.workflow.container_images import ContainerError, ImageRef, checked_image, obtain_image
from hpcmem.workflow.definitions import parse_definition

#: what `hpcmem bind` and `hpcmem collectives` import in the CPU image, besides hpcmem
IMAGE_PACKAGES = ("numpy", "mpi4py")


def image_wheelhouse(wheelhouse: Path, into: Path, log: TextIO) -> None:
    """``into`` gets this run's hpcmem wheel and binary wheels of :data:`IMAGE_PACKAGES` at
    the versions installed in the environment running the workflow."""
    wheels = sorted(wheelhouse.glob("hpcmem-*.whl"))
    if len(wheels) != 1:
        raise ContainerError(f"{wheelhouse}: expected one hpcmem wheel, found {len(wheels)}")
    shutil.copy2(wheels[0], into)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in IMAGE_PACKAGES]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
               "--no-deps", "--dest", str(into), *pins]  # fmt: skip
    log.write("+ " + " ".join(command) + "\n")
    log.flush()
    if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
        raise ContainerError(f"pip download {' '.join(pins)} failed (see the build log)")


def obtain(args: argparse.Namespace, log: TextIO) -> ImageRef:
    """The image of this run, as the options say."""
    version = runtime_version(args.runtime)
    if args.prebuilt:
        ref = ImageRef(name=args.name, gpu=args.gpu, image=args.prebuilt, runtime=args.runtime,
                       runtime_version=version, log=args.log)  # fmt: skip
        return checked_image(ref, log)
    definition = parse_definition(args.definition)
    values = dict(value.split("=", 1) for value in args.build_arg)
    with tempfile.TemporaryDirectory(prefix="hpcmem-wheelhouse-") as wheels:
        if definition.uses("WHEELHOUSE"):
            image_wheelhouse(Path(args.wheelhouse), Path(wheels), log)
            values["WHEELHOUSE"] = wheels
        return obtain_image(args.name, definition, values, image_dir=args.image_dir,
                            runtime=args.runtime, runtime_version=version,
                            context=args.context, log=log, log_path=args.log,
                            gpu=args.gpu)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Write the reference; exit 1 only when the image is required and cannot be had."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option in ("--name", "--definition", "--image-dir", "--runtime", "--context",
                   "--wheelhouse", "--log", "--out"):  # fmt: skip
        parser.add_argument(option, required=option in ("--name", "--runtime", "--out"))
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--prebuilt")
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--required", action="store_true")
    args = parser.parse_args(argv)
    with open(args.log, "w") if args.log else open("/dev/null", "w") as log:
        try:
            ref = obtain(args, log)
        except (ContainerError, OSError) as error:
            if args.required:
                print(f"hpcmem: container.enabled=true: {error}", file=sys.stderr)
                return 1
            ref = ImageRef(name=args.name, gpu=args.gpu, image=None, log=args.log,
                           reason=str(error))  # fmt: skip
            print(f"hpcmem: container.enabled=auto: {args.name} runs natively: {error}",
                  file=sys.stderr)  # fmt: skip
    with atomic_open(args.out) as handle:
        handle.write(ref.to_json())
    if ref.image:
        how = f"built in {ref.build_seconds} s" if ref.built else "cached"
        print(f"hpcmem: image {ref.name}: {ref.image} ({how}, {ref.digest})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

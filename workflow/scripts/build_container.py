"""Get one image for this run: reuse the cached build, build it, or use the prebuilt one;
then write the run's reference to it (``RUN/build/images/NAME.json``).

The images build hpcmem from the source tree (``--context``) inside themselves; ``--bind``
mounts a folder while an image builds (the wheelhouse pip installs from), and
``--download-wheels RELEASE`` makes that wheelhouse first with this host's pip, for the
Python of that Debian release (hpcmem/workflow/containers/wheelhouse.py). With ``--required``
(container.enabled: true) a failure exits 1 naming the build log; otherwise (auto) the
reference says the benchmarks run natively and why, one line on stderr says so, and the job
succeeds.

    python build_container.py --name NAME --definition DEF --image-dir DIR --runtime RUNTIME
        --context REPO [--build-arg K=V ...] [--bind SRC:DEST:ro ...]
        [--download-wheels RELEASE] [--prebuilt SIF] [--gpu] [--required] --log LOG --out REF

"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from hpcmem.record.jsonl import atomic_open
from hpcmem.workflow.containers import (
    WHEELHOUSE_MOUNT,
    ContainerError,
    ImageRef,
    checked_image,
    download_wheels,
    obtain_image,
    parse_definition,
    runtime_version,
)


def obtain(args: argparse.Namespace, log: TextIO) -> ImageRef:
    """The image of this run, as the options say."""
    version = runtime_version(args.runtime)
    if args.prebuilt:
        ref = ImageRef(name=args.name, gpu=args.gpu, image=args.prebuilt, runtime=args.runtime,
                       runtime_version=version, log=args.log)  # fmt: skip
        return checked_image(ref, log)
    values = dict(value.split("=", 1) for value in args.build_arg)
    with tempfile.TemporaryDirectory(prefix="hpcmem-wheelhouse-") as wheels:
        binds = list(args.bind)
        if args.download_wheels:
            download_wheels(Path(wheels), args.download_wheels, source_dir=Path(args.context),
                            log=log)  # fmt: skip
            binds.append(f"{wheels}:{WHEELHOUSE_MOUNT}:ro")
        return obtain_image(args.name, parse_definition(args.definition), values,
                            image_dir=args.image_dir, runtime=args.runtime,
                            runtime_version=version, context=args.context, log=log,
                            log_path=args.log, gpu=args.gpu, binds=binds)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Write the reference; exit 1 only when the image is required and cannot be had."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option in ("--name", "--definition", "--image-dir", "--runtime", "--context", "--log",
                   "--out"):  # fmt: skip
        parser.add_argument(option, required=option in ("--name", "--runtime", "--out"))
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DEST:ro")
    parser.add_argument("--download-wheels", metavar="RELEASE")
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

"""Build one image with the container runtime and record its digest next to it.

The image is built through :func:`hpcmem.workflow.containers.build_image` (spython for
``singularity``, the CLI for ``apptainer``) and appears only once complete; the digest file
``<image>.digest.json`` is written atomically after it, so a failed build leaves neither.

    python build_container.py DEFINITION IMAGE DIGEST_FILE RUNTIME CONTEXT
"""

import datetime
import json
import sys

from hpcmem.results.records import atomic_open
from hpcmem.workflow.containers import build_image


def build(definition: str, image: str, digest_file: str, runtime: str, context: str) -> dict:
    """Build ``image`` from ``definition`` and write ``digest_file``; returns what it holds."""
    digest = build_image(definition, image, runtime=runtime, context=context)
    record = {
        "image": image,
        "digest": digest,
        "definition": definition,
        "runtime": runtime,
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with atomic_open(digest_file) as handle:
        handle.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


if __name__ == "__main__":
    print(json.dumps(build(*sys.argv[1:6])), flush=True)

"""Install the run's hpcmem wheel into a per-run environment and record what was built.

The environment is a venv layered over the interpreter running the workflow: its own
site-packages holds only the wheel, and a ``.pth`` file appends the parent environment's
site-packages (numpy, mpi4py, torch, ...) after it. Path entries added by a ``.pth`` file
do not have their own ``.pth`` files processed, so an editable install of hpcmem in the
parent environment is not seen: every job imports exactly the wheel built for this run.
"""

import datetime
import hashlib
import json
import platform
import site
import socket
import subprocess
import sys
from pathlib import Path
from typing import TextIO

#: imported from the new environment to prove it runs the wheel, with its native modules
PROBE = """
import importlib, importlib.util, json, hpcmem
native = [m for m in ("hpcmem._hbw", "hpcmem._um") if importlib.util.find_spec(m)]
print(json.dumps({"module": hpcmem.__file__, "version": hpcmem.__version__, "native": native}))
"""


def only_wheel(wheelhouse: Path) -> Path:
    """The single hpcmem wheel in ``wheelhouse``; anything else is an error."""
    wheels = sorted(wheelhouse.glob("hpcmem-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"{wheelhouse}: expected one hpcmem wheel, found {len(wheels)}")
    return wheels[0]


def run(command: list[str], log: TextIO) -> str:
    """Run ``command``, logging it and its stderr; its stdout is returned."""
    log.write("+ " + " ".join(command) + "\n")
    log.flush()
    return subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=log, text=True).stdout


def install(wheelhouse: Path, venv: Path, manifest: Path, git_sha: str, log: TextIO) -> dict:
    """Create ``venv``, install the wheel into it, verify the import and write ``manifest``."""
    wheel = only_wheel(wheelhouse)
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], log)
    python = venv / "bin" / "python"
    own_site = run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], log)
    parent_sites = "".join(f"{path}\n" for path in site.getsitepackages())
    Path(own_site.strip(), "_hpcmem_parent_env.pth").write_text(parent_sites)
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], log)
    probe = json.loads(run([str(python), "-I", "-c", PROBE], log))
    if not Path(probe["module"]).resolve().is_relative_to(venv.resolve()):
        raise RuntimeError(f"the run environment imports hpcmem from {probe['module']}")
    record = {
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "size_bytes": wheel.stat().st_size,
        "hpcmem_version": probe["version"],
        "git_sha": git_sha or None,
        "native_modules": probe["native"],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "host": socket.gethostname(),
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    manifest.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


if __name__ == "__main__":
    smk = snakemake  # noqa: F821 (injected by Snakemake's script directive)
    with open(smk.log[0], "w") as log_file:
        install(
            Path(smk.input.wheelhouse),
            Path(smk.output.venv),
            Path(smk.output.manifest),
            smk.params.git_sha,
            log_file,
        )

"""One base for every hpcmem error, and `python -m hpcmem` as the `hpcmem` command."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import hpcmem
from hpcmem import HpcmemError


def _error_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in an hpcmem module, by its dotted name."""
    found = {}
    root = Path(hpcmem.__file__).parent
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # importing it runs the command
        module = importlib.import_module(".".join(parts).removesuffix(".__init__"))
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (value.__module__ == module.__name__ and issubclass(value, BaseException)
                    and not issubclass(value, Warning)):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_error_derives_from_hpcmem_error() -> None:
    classes = _error_classes()
    assert {"hpcmem.cli.UsageError", "hpcmem.hbw_native.KindUnavailableError",
            "hpcmem.node.planned.BindingError"} <= classes.keys()
    outside = [name for name, cls in sorted(classes.items()) if not issubclass(cls, HpcmemError)]
    assert outside == []


def test_python_dash_m_is_the_hpcmem_command() -> None:
    done = subprocess.run([sys.executable, "-m", "hpcmem", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hpcmem ")
    for command in ("info", "collectives", "train", "bind", "aggregate", "report", "check"):
        assert command in done.stdout
    bad = subprocess.run([sys.executable, "-m", "hpcmem", "check", "nowhere", "--references",
                          "nothing.yaml"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("hpcmem check: error: --references: nothing.yaml")

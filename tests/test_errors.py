"""One base for every hpcmem error, and `python -m hpcmem` as the `hpcmem` command."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    assert {"hpcmem.cli.UsageError", "hpcmem.hbw.native.KindUnavailableError",
            "hpcmem.node.planned.BindingError"} <= classes.keys()
    outside = [name for name, cls in sorted(classes.items()) if not issubclass(cls, HpcmemError)]
    assert outside == []


def _source_classes() -> Iterator[tuple[str, str, list[str]]]:
    """(file, class name, the last word of each base) of every class in the package's source."""
    root = Path(hpcmem.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base).rpartition(".")[2] for base in node.bases]
                yield str(path.relative_to(root.parent)), node.name, bases


def _builtin(kind: type[BaseException]) -> set[str]:
    return {name for name, value in vars(builtins).items()
            if isinstance(value, type) and issubclass(value, kind)}


def test_every_exception_class_is_named_error() -> None:
    # read from the source, so that a module needing a GPU or MPI to import is read too; a
    # base is known by its name: Python's, one of the package's own, or any named *Error
    classes = list(_source_classes())
    errors, warns = _builtin(BaseException) - _builtin(Warning), _builtin(Warning)
    grew = True
    while grew:
        before = len(errors) + len(warns)
        for _, name, bases in classes:
            if any(base in warns for base in bases):
                warns.add(name)
            elif any(base in errors or base.endswith("Error") for base in bases):
                errors.add(name)
        grew = len(errors) + len(warns) > before
    assert {"UsageError", "KindUnavailableError", "HBWFallbackWarning"} <= errors | warns
    wrong = [f"{path}: {name}" for path, name, _ in classes
             if (name in warns and not name.endswith("Warning"))
             or (name in errors and name not in warns and not name.endswith("Error"))]
    assert wrong == []


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


def test_an_unknown_option_is_refused_by_its_subcommand_with_the_closest_one(capsys) -> None:
    from hpcmem.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["info", "--jsn"])
    assert ended.value.code == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("usage: hpcmem info ")
    assert said[-1] == "hpcmem info: error: unrecognized arguments: --jsn (did you mean --json?)"

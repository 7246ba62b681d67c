"""The examples in the package's docstrings run, and print what they say they print."""

from __future__ import annotations

import doctest
import importlib
import warnings
from pathlib import Path

import pytest

import hpcmem

PACKAGE = Path(hpcmem.__file__).parent
WITH_EXAMPLES = sorted(p for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text())


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_the_package_has_examples() -> None:
    assert {"hpcmem.units", "hpcmem.hbw.arrays"} <= {_module(p) for p in WITH_EXAMPLES}


@pytest.mark.parametrize("path", WITH_EXAMPLES, ids=_module)
def test_docstring_examples(path: Path) -> None:
    module = importlib.import_module(_module(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hbw_preferred's fallback warning on a node without HBW
        result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0

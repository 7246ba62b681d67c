"""Bad input found while Snakemake reads the workflow: one line, exit status 2.

Snakemake prints an error raised in a Snakefile with the frames it passed through and
exits 1. What hpcmem refuses before any job exists (the config, its files, the image
files it names, a run folder in use) is bad input as every hpcmem command reports it:
:func:`refuse_bad_input` prints the error's one line, ``hpcmem: error: MESSAGE``, and
ends snakemake with status 2 (README's exit-status table).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hpcmem.errors import HpcmemError

__all__ = ["REFUSED", "refuse_bad_input"]

#: how the line of a refusal starts
REFUSED = "hpcmem: error: "


@contextmanager
def refuse_bad_input(prefix: str = "") -> Iterator[None]:
    """An hpcmem error raised inside ends the process: ``hpcmem: error: PREFIX MESSAGE``
    on stderr, exit status 2 (a SystemExit, which Snakemake lets through)."""
    try:
        yield
    except HpcmemError as error:
        line = " ".join(str(error).splitlines())
        print(f"{REFUSED}{prefix}{line}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None

"""Bad input found before any job: its lines, exit status 2.

Snakemake prints an error raised in a Snakefile, or in an ``onstart`` handler, with the
frames it passed through and exits 1. What hpcmem refuses before any job runs (the config,
its files, the image files it names, a run folder in use, the preflight's problems) is bad
input as every hpcmem command reports it: :func:`refuse` prints its lines and ends
snakemake with status 2 (README's exit-status table); :func:`refuse_bad_input` does so
for an hpcmem error, as one line ``hpcmem: error: MESSAGE``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from hpcmem.errors import HpcmemError

__all__ = ["REFUSED", "refuse", "refuse_bad_input"]

#: how the line of a refusal starts
REFUSED = "hpcmem: error: "


def refuse(*lines: str, logger: Any = None) -> NoReturn:
    """End the process with exit status 2 (a SystemExit, which Snakemake lets through)
    after ``lines``: through ``logger.error`` when given (Snakemake's logger, which also
    keeps them in the run's log file), else on stderr."""
    for line in lines:
        if logger is None:
            print(line, file=sys.stderr, flush=True)
        else:
            logger.error(line)
    raise SystemExit(2)


@contextmanager
def refuse_bad_input(prefix: str = "") -> Iterator[None]:
    """An hpcmem error raised inside ends the process: ``hpcmem: error: PREFIX MESSAGE``
    on stderr, exit status 2."""
    try:
        yield
    except HpcmemError as error:
        line = " ".join(str(error).splitlines())
        refuse(f"{REFUSED}{prefix}{line}")

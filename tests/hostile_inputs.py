"""Hostile inputs the tests hand hpcmem: an alias bomb, and a site's wrapper script in
front of a real tool that prints what the real one never would."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

__all__ = ["ALIAS_BOMB", "site_wrapper"]

#: nine levels of nine aliases each ("billion laughs"): 9^9 strings once expanded
ALIAS_BOMB = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]\n" for level in range(1, 9))


def site_wrapper(folder: Path, tool: str, args: str, prints: bytes) -> Path:
    """A script named ``tool`` in ``folder`` (put ``folder`` first on PATH): ``tool ARGS``
    prints ``prints``; any other call runs the real ``tool``, as a site's wrapper does."""
    real = shutil.which(tool)
    assert real is not None, f"{tool} not found: run `make setup`"
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / f"{tool}.prints"
    output.write_bytes(prints)
    script = folder / tool
    script.write_text(f'#!/bin/sh\nif [ "$*" = {shlex.quote(args)} ]; then\n'
                      f"  exec cat {shlex.quote(str(output))}\nfi\n"
                      f'exec {shlex.quote(real)} "$@"\n')
    script.chmod(0o755)
    return folder

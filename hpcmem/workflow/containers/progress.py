"""A long command's progress on stderr while its output goes to a log: each stage the command
names (Apptainer's ``INFO:`` and ``WARNING:`` lines: ``Running post scriptlet``, ``Creating
SIF file...``), and, every half minute it names none, the stage it is still in, each with
the seconds since it began; an image build of several minutes so never runs in silence."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

__all__ = ["QUIET_SECONDS", "run_logged"]

#: a line naming a stage, and the stage it names
_STAGE = re.compile(r"^(?:INFO|WARNING):\s+(.*\S)")
#: seconds without a stage before the stage under way is said again
QUIET_SECONDS = 30.0


def run_logged(command: Sequence[str], log: TextIO, what: str, *,
               cwd: str | os.PathLike[str] | None = None, stream: TextIO | None = None,
               quiet_seconds: float = QUIET_SECONDS) -> int:
    """Run ``command`` to its end, its output into ``log``, saying on ``stream`` (stderr)
    how ``what`` goes (module docstring); its exit status."""
    stream = stream or sys.stderr
    started = time.monotonic()
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", cwd=cwd)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    stage = "starting"
    while True:
        try:
            line = lines.get(timeout=quiet_seconds)
        except queue.Empty:
            _say(stream, what, f"still {stage}", started)
            continue
        if line is None:
            break
        log.write(line)
        if found := _STAGE.match(line):
            stage = found[1]
            _say(stream, what, stage, started)
    log.flush()
    return process.wait()


def _say(stream: TextIO, what: str, stage: str, started: float) -> None:
    print(f"hpcmem: {what}: {stage} ({time.monotonic() - started:.0f} s)", file=stream,
          flush=True)

"""Where a summarise step's output goes: its log, and its errors to the terminal as well.

The steps that turn records into a summary, a verdict and a report write their log under
the run folder. When that file system is full, the log stays empty and the error line that
says so (``hpcmem aggregate: error: ...: cannot write (No space left on device)``) was
lost with it: Snakemake then showed the failed step and its empty log. :func:`logged`
sends what a step prints on stderr to the log and, through ``tee``, to Snakemake's own
stderr, the terminal or the job's Slurm log, so the failure is explained where the run is
watched; stdout (a step's summary) goes to the log only.
"""

from __future__ import annotations

__all__ = ["logged"]


def logged(command: str) -> str:
    """The bash of a rule's ``shell:`` (a Snakemake format string) running ``command`` with
    stdout to ``{log}`` and stderr to ``{log}`` and to stderr; afterwards ``$status``
    holds ``command``'s exit status (tee's own is left out), for the rest of the shell.

    >>> print(logged("hpcmem aggregate {input:q}"))
    : > {log:q}; status=0; hpcmem aggregate {input:q} 2>&1 >> {log:q} | tee -a {log:q} >&2 \
|| status=${{PIPESTATUS[0]}}
    """
    # stderr into the pipe, stdout to the log; both append, so the streams interleave
    # instead of overwriting each other; the pipeline ends once tee has written all.
    # Braces that are bash's, not Snakemake's, are doubled.
    return (": > {log:q}; status=0; " + command
            + " 2>&1 >> {log:q} | tee -a {log:q} >&2 || status=${{PIPESTATUS[0]}}")

"""Training frameworks driving a :class:`hpcmem.um.UnifiedMemory`, with or without a GPU budget.

* :mod:`hpcmem.integrations.hf`: ``UnifiedMemoryTrainer``, a Hugging Face ``Trainer``;
* :mod:`hpcmem.integrations.lightning`: ``UnifiedMemoryStrategy``, a PyTorch Lightning
  ``Strategy``.

Each of them imports its framework when it is imported itself; importing this package
imports neither. A framework that is not installed raises :class:`IntegrationError`, naming
how to install it. ``docs/training-integrations.md`` says why each hooks in where it does.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hpcmem.errors import HpcmemError

__all__ = ["IntegrationError", "require"]


class IntegrationError(HpcmemError, ImportError):
    """The training framework an integration needs is not installed."""


def require(module: str, install: str) -> ModuleType:
    """``module`` imported; :class:`IntegrationError` naming ``install`` when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise IntegrationError(
            f"{module} is not installed: {install} (hpcmem.integrations needs it; {error})"
        ) from error

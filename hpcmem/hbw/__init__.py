"""NumPy arrays in high-bandwidth memory and the other memory kinds, through UMF or memkind.

:mod:`hpcmem.hbw.arrays` makes the arrays and measures where their pages are;
:mod:`hpcmem.hbw.native` loads the extension (``hpcmem._hbw``) and binds its backend to the
nodes. Importing this package loads neither: the first array does.
"""

from hpcmem.hbw.arrays import (
    HBW_KINDS,
    KINDS,
    HBWFallbackWarning,
    HBWUnavailableError,
    Placement,
    allocator,
    empty,
    empty_like,
    handler_name,
    kind_of,
    placement,
    resolve_kind,
    verify,
    zeros,
)
from hpcmem.hbw.native import BackendNotBuiltError, KindUnavailableError, backend

__all__ = [
    "HBW_KINDS",
    "KINDS",
    "BackendNotBuiltError",
    "HBWFallbackWarning",
    "HBWUnavailableError",
    "KindUnavailableError",
    "Placement",
    "allocator",
    "backend",
    "empty",
    "empty_like",
    "handler_name",
    "kind_of",
    "placement",
    "resolve_kind",
    "verify",
    "zeros",
]

"""The virtual topology a run is in, as the VM test tooling (tools/vm/) names it.

A guest booted by ``tools/vm`` exports ``HPCMEM_VM_TOPOLOGY`` (``knl-flat``,
``xeon-max-snc2``...): its NUMA layout and ACPI HMAT are real to the kernel, its bandwidth
and latency are not the hardware's, and records say so.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["VM_TOPOLOGY_ENV", "vm_topology"]

VM_TOPOLOGY_ENV = "HPCMEM_VM_TOPOLOGY"
NOTE = ("virtual machine: the NUMA layout and HMAT attributes are the firmware's description, "
        "bandwidth and latency are not the hardware's; compare no figures with real nodes")


def vm_topology() -> dict[str, Any] | None:
    """``{"name": ..., "note": ...}`` inside a tools/vm guest, else None."""
    name = os.environ.get(VM_TOPOLOGY_ENV, "").strip()
    return {"name": name, "note": NOTE} if name else None

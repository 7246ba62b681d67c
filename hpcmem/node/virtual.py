"""The virtual topology a run is in, as the VM test tooling (tools/vm/) names it.

A guest booted by ``tools/vm`` says so in its firmware: the SMBIOS system product is
``hpcmem-vm`` and its version the topology (``knl-flat``, ``xeon-max-snc2``...), which the
kernel shows in ``/sys/class/dmi/id``. Every process there sees it, whatever started it (a
Slurm job's environment is the submitter's, not the node's). Its NUMA layout and ACPI HMAT
are real to the kernel, its bandwidth and latency are not the hardware's, and records say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["DMI_ROOT", "PRODUCT", "vm_topology"]

DMI_ROOT = Path("/sys/class/dmi/id")
#: the SMBIOS system product of a tools/vm guest
PRODUCT = "hpcmem-vm"
NOTE = ("virtual machine: the NUMA layout and HMAT attributes are the firmware's description, "
        "bandwidth and latency are not the hardware's; compare no figures with real nodes")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def vm_topology(dmi: Path = DMI_ROOT) -> dict[str, Any] | None:
    """``{"name": ..., "note": ...}`` inside a tools/vm guest, else None; ``dmi``: the
    folder of the SMBIOS system fields (default this machine's)."""
    if _read(dmi / "product_name") != PRODUCT:
        return None
    name = _read(dmi / "product_version")
    return {"name": name, "note": NOTE} if name else None

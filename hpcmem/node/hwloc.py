"""NUMA node subtypes as hwloc names them (``MCDRAM`` on Xeon Phi, ``HBM`` on Xeon Max).

hwloc labels memory it recognises: KNL's MCDRAM from the processor's own tables, HBM from
the platform's memory tiers. Read once per process from ``lstopo-no-graphics --of xml``
(Debian package ``hwloc``); without lstopo there are no subtypes.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from functools import cache

__all__ = ["HBW_SUBTYPES", "hbw_nodes", "numa_subtypes", "parse_subtypes"]

#: the subtypes that are high-bandwidth memory
HBW_SUBTYPES = frozenset({"MCDRAM", "HBM"})
_LSTOPO_SECONDS = 60  # generous: a TCG guest runs it 10-20x slower than a host


def parse_subtypes(xml: str) -> dict[int, str]:
    """NUMA node id -> subtype, for the nodes an hwloc XML topology gives one."""
    root = ElementTree.fromstring(xml)
    return {
        int(node.get("os_index", "-1")): node.get("subtype", "")
        for node in root.iter("object")
        if node.get("type") == "NUMANode" and node.get("subtype")
    }


@cache
def numa_subtypes() -> dict[int, str]:
    """This machine's NUMA node subtypes ({} without lstopo or when it fails)."""
    lstopo = shutil.which("lstopo-no-graphics") or shutil.which("lstopo")
    if lstopo is None:
        return {}
    try:
        done = subprocess.run([lstopo, "--no-io", "--of", "xml", "-"], capture_output=True,
                              text=True, timeout=_LSTOPO_SECONDS)
        return parse_subtypes(done.stdout) if done.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ElementTree.ParseError):
        return {}


def hbw_nodes() -> tuple[int, ...]:
    """The nodes hwloc calls high-bandwidth memory, sorted."""
    return tuple(sorted(n for n, subtype in numa_subtypes().items() if subtype in HBW_SUBTYPES))

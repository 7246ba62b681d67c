"""Whether the registry a definition's base image comes from answers here, asked before a
build that would otherwise spend minutes before failing on it.

A ``Bootstrap: docker`` (or ``oras``) stage pulls ``From:`` out of a registry: Docker Hub
for a bare name (``nvidia/cuda:12.6.3-devel-ubuntu24.04``), else the host the reference
starts with (``nvcr.io/nvidia/cuda:...``, ``mirror.site:5000/cuda:...``). Where
``https_proxy`` (or ``HTTPS_PROXY``) is set, Apptainer goes through the proxy, so the proxy
is what must answer. One TCP connection, a few seconds at most, says so.

    >>> registry_of("nvidia/cuda:12.6.3-devel-ubuntu24.04")
    ('registry-1.docker.io', 443)
    >>> registry_of("mirror.site:5000/nvidia/cuda:12.6.3")
    ('mirror.site', 5000)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from hpcmem.workflow.containers.definitions import Definition

__all__ = ["DOCKER_HUB", "registry_of", "unreachable_base"]

#: where a reference without a registry host is pulled from
DOCKER_HUB = "registry-1.docker.io"
#: agents that pull ``From:`` out of a registry
_PULLED = frozenset({"docker", "oras"})


def registry_of(reference: str) -> tuple[str, int]:
    """The host and port a reference (``[host[:port]/]name[:tag]``) is pulled from."""
    reference = reference.split("://", 1)[-1]
    first, slash, _ = reference.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        return DOCKER_HUB, 443
    host, _, port = first.partition(":")
    return host, int(port) if port.isdigit() else 443


def _proxy(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The HTTPS proxy Apptainer would go through, or None."""
    url = environ.get("https_proxy") or environ.get("HTTPS_PROXY")
    if not url:
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return (parts.hostname, parts.port or 80) if parts.hostname else None


def unreachable_base(definition: Definition, args: Mapping[str, str], timeout: float = 5.0,
                     environ: Mapping[str, str] = os.environ) -> str | None:
    """Why a base image of ``definition`` (built with ``args``) cannot be pulled from here,
    or None when every registry it needs answers (or it pulls from none)."""
    proxy = _proxy(environ)
    for agent, base in definition.bases(args):
        if agent not in _PULLED:
            continue
        host, port = registry_of(base)
        target = proxy or (host, port)
        try:
            socket.create_connection(target, timeout=timeout).close()
        except OSError as error:
            through = f" through the proxy {target[0]}:{target[1]}" if proxy else ""
            return (f"its base image {agent}://{base} cannot be pulled from this host: "
                    f"{host}:{port}{through} did not answer ({error.strerror or error})")
    return None

"""What the workflow config must also be, beyond its schema: one line naming the key.

The schema (``workflow/schemas/config.schema.yaml``) types every value; these checks need
more than a value at a time (the names a sweep defines, the files on disk, two sizes
compared). :func:`check_config` runs them all before any job exists; the workflow turns
a :class:`ConfigError` into the one-line error Snakemake prints.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.node.planned import BINDINGS
from hpcmem.um import PRESETS
from hpcmem.units import parse_size

__all__ = ["ConfigError", "check_config", "check_folder", "check_names", "check_not_builtin",
           "check_printable", "message_size"]


class ConfigError(HpcmemError, ValueError):
    """A config the schema accepts but the run cannot use; the message names the key."""


def message_size(value: Any, key: str) -> int:
    """Bytes of a message size (8, '4K', '1M'), parsed as `hpcmem collectives` parses it;
    not a power of two stops naming ``key``."""
    size = parse_size(str(value))
    if size & (size - 1):
        raise ConfigError(f"config {key}: {value!r} is not a power of two (8, 4K, 1M, ...)")
    return size


def check_printable(value: Any, key: str = "config") -> None:
    """Stop naming the key when a string holds a control character (the schema's patterns
    end in ``$``, which Python's re also matches before a final newline)."""
    if isinstance(value, dict):
        for name, item in value.items():
            check_printable(name, key)
            check_printable(item, f"{key}.{name}" if key != "config" else name)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_printable(item, f"{key}[{index}]")
    elif isinstance(value, str) and not value.isprintable():
        raise ConfigError(f"config {key}: {value!r} contains a control character")


def check_names(key: str, names: Iterable[str], builtin: Iterable[str],
                defined: Iterable[str], defined_key: str) -> None:
    """Stop naming ``key`` when a name is neither built in nor defined under ``defined_key``."""
    accepted = (*builtin, *defined)
    for name in names:
        if name not in accepted:
            raise ConfigError(f"config {key}: {name!r} is not one of {', '.join(accepted)} "
                              f"(define new ones under {defined_key})")


def check_not_builtin(key: str, defined: Iterable[str], builtin: Iterable[str]) -> None:
    """Stop naming ``key`` when a name defined there would shadow a built-in one."""
    builtin = tuple(builtin)
    for name in defined:
        if name in builtin:
            raise ConfigError(f"config {key}: {name!r} is a built-in name (built in: "
                              f"{', '.join(builtin)}); give yours another name")


def check_folder(key: str, path: str) -> None:
    """Stop naming ``key`` when ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"config {key}: {path!r} is a file, not a folder")


def check_config(config: Mapping[str, Any]) -> None:
    """Every check of a schema-valid config, in the order a run meets them."""
    collectives, train = config["collectives"], config["train"]
    check_printable(config)
    check_folder("output_dir", config["output_dir"])
    check_folder("check.history", config["check"]["history"])
    if not (collectives["enabled"] or train["enabled"]):
        raise ConfigError("config collectives.enabled, train.enabled: both false, nothing to run")
    if message_size(collectives["min_size"], "collectives.min_size") > message_size(
            collectives["max_size"], "collectives.max_size"):
        raise ConfigError("config collectives.min_size: larger than collectives.max_size")
    check_not_builtin("collectives.custom_bindings", collectives["custom_bindings"], BINDINGS)
    check_not_builtin("train.policy_files", train["policy_files"], PRESETS)
    check_names("collectives.bindings", collectives["bindings"], BINDINGS,
                collectives["custom_bindings"], "collectives.custom_bindings")
    check_names("train.policies", train["policies"], PRESETS, train["policy_files"],
                "train.policy_files")

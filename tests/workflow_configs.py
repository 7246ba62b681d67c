"""Workflow configs as a run loads them: the given files layered in order, schema defaults
filled in (``snakemake.utils.validate``, what the workflow calls)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from snakemake.utils import update_config, validate

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def load(*files: str, extra: dict | None = None) -> dict[str, Any]:
    """The config the workflow gets from ``files`` (relative to the repository) and ``extra``."""
    config: dict[str, Any] = {}
    for name in files:
        update_config(config, yaml.safe_load((REPO / name).read_text()))
    update_config(config, copy.deepcopy(extra or {}))
    validate(config, schema=str(SCHEMA))
    return config

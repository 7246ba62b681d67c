"""The site profile's template (profiles/slurm/config.yaml): every resource default a site
sets (a line marked SITE under ``default-resources``) reaches some job, none is one that
every rule sets for itself."""

from __future__ import annotations

import re

import yaml
from conftest import REPO

TEMPLATE = REPO / "profiles" / "slurm" / "config.yaml"


def _site_defaults(text: str) -> list[str]:
    """The keys under ``default-resources`` whose line (commented out or not) says SITE."""
    block = text.split("\ndefault-resources:\n", 1)[1].split("\n\n", 1)[0]
    return [found[1] for line in block.splitlines()
            if "# SITE" in line and (found := re.match(r"\s+#?\s*(\w+):", line))]


def _submitted_rules() -> set[str]:
    """Every rule the workflow defines, but the target ``all`` (no job of its own)."""
    text = "\n".join(path.read_text() for path in (REPO / "workflow").rglob("*.smk"))
    names = re.findall(r"^rule (\w+):|^use rule \w+ as (\w+)", text, re.MULTILINE)
    return {first or second for first, second in names} - {"all"}


def test_every_site_resource_default_reaches_a_rule() -> None:
    text = TEMPLATE.read_text()
    overrides = yaml.safe_load(text)["set-resources"]
    rules = _submitted_rules()
    assert {"build_wheel", "run_collectives", "run_train_ranks", "render_report"} <= rules
    defaults = _site_defaults(text)
    assert {"slurm_partition", "slurm_account", "mem_mb", "constraint"} <= set(defaults)
    for key in defaults:
        taking = sorted(rule for rule in rules if key not in overrides.get(rule, {}))
        assert taking, f"default-resources {key}: every rule sets its own, so the SITE line " \
                       "changes nothing"


def test_every_rule_sets_its_runtime() -> None:
    overrides = yaml.safe_load(TEMPLATE.read_text())["set-resources"]
    assert all("runtime" in overrides.get(rule, {}) for rule in _submitted_rules())
    assert "runtime" not in yaml.safe_load(TEMPLATE.read_text())["default-resources"]

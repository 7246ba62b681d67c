"""benchmarks/gpu/offload_stages.sh refuses a stage it does not know, or its arguments, before
anything runs (the stages themselves need a GPU node)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "offload_stages.sh"


@pytest.mark.parametrize("args", [[], ["peer", "gemma-2b"], ["peers"], ["lean", "qwen2-1.5b"],
                                  ["7b", "12GiB"], ["tests", "extra"]])
def test_a_wrong_stage_is_refused_naming_it_and_the_stages(args, tmp_path):
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
    assert done.returncode == 2
    assert done.stderr.startswith(f"offload_stages.sh: '{' '.join(args)}' is not a stage")
    for stage in ("tests", "peers MODEL", "lean MODEL BATCH", "drift MODEL", "7b BUDGET_GIB"):
        assert f"\n  {stage} " in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran

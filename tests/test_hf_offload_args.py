"""benchmarks/gpu/hf_offload.py refuses settings it cannot run before it imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "hf_offload.py"


@pytest.mark.parametrize("variant", ["deepspeed", "deepspeed3", "fsdp2"])
def test_fp32_with_a_bf16_only_variant_is_refused_naming_both(variant: str,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "hf.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--variant", variant, "--dtype", "fp32",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert (f"error: --dtype fp32 runs with the variants cuda and hpcmem, not {variant}"
            in done.stderr.splitlines()[-1])
    assert not out.exists()  # nothing written

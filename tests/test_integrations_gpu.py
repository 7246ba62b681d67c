"""Where users train, on a real GPU: the plain loop, Hugging Face ``Trainer`` and Lightning
examples (``examples/``), each run as a user runs it, in its own process, under the hpcmem
policy without a budget and within a 2 GiB budget.

Each run must exit 0; under the budget, the strategy the example asked for (or the plan's)
ran, the GPU memory held stays within the budget, and the model never left the pools (a
trainer that moved it to the GPU would leave its 93 MB of fp32 weights outside them, where
at most 16 MiB may be); its bf16 losses agree with the run without a budget within 1%.
Marked ``gpu``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("torch")]

REPO = Path(__file__).resolve().parents[1]
#: the CUDA context, the plain buffers and the pools all count in it
BUDGET = 2 * 2**30
#: what a trainer may allocate outside the pools (its loss accumulators, logged scalars): far
#: less than the model's fp32 weights
ESCAPED_AT_MOST = 16 * 2**20
#: example -> the framework it needs (None: torch alone)
EXAMPLES = {"plain_loop": None, "hf_trainer": "transformers", "lightning_fit": "lightning"}
#: the budget runs: example, offload strategy asked for (None: planned), strategy expected
BUDGETED = [("plain_loop", None, "host_optimizer"), ("plain_loop", "streamed", "streamed"),
            ("hf_trainer", None, "host_optimizer"), ("lightning_fit", None, "host_optimizer")]


@cache
def _run(example: str, *options: str) -> dict:
    """The closing JSON line of ``examples/<example>.py OPTIONS``, run from the checkout."""
    framework = EXAMPLES[example]
    if framework and importlib.util.find_spec(framework) is None:
        pytest.skip(f"examples/{example}.py needs {framework}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, f"examples/{example}.py", *options], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("example", EXAMPLES)
def test_without_a_budget_each_type_has_its_pool(example):
    result = _run(example)
    assert result["policy"] == "hpcmem" and result["strategy"] is None
    assert result["escaped_bytes"] <= ESCAPED_AT_MOST
    assert len(result["losses"]) == 8


@pytest.mark.parametrize(("example", "asked", "expected"), BUDGETED)
def test_within_the_budget_losses_agree_with_the_run_without(example, asked, expected):
    options = ["--gpu-budget", str(BUDGET), *(["--offload", asked] if asked else [])]
    result = _run(example, *options)
    assert result["strategy"] == expected
    assert result["gpu_budget_bytes"] == BUDGET
    assert 0 < result["peak_gpu_resident_bytes"] <= BUDGET
    assert result["escaped_bytes"] <= ESCAPED_AT_MOST
    assert result["losses"] == pytest.approx(_run(example)["losses"], rel=1e-2)

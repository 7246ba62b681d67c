"""What the trainer integrations share (hpcmem.integrations, .training), without a framework:
the Offload a trainer's settings make, a rank's memory on another GPU refused, a missing
framework named with its install, and an example on a machine without a GPU
(tests/test_integrations_gpu.py runs them on one)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.integrations import IntegrationError
from hpcmem.integrations.training import check_device, trainer_offload
from hpcmem.um import BudgetError, Offload, StreamedOffload, UnifiedMemoryError

REPO = Path(__file__).resolve().parents[1]


def test_the_trainer_s_accumulation_and_autocast_make_the_offload():
    assert trainer_offload(None, micro_batches=4, bf16=True) == Offload(
        working_dtype="bfloat16", micro_batches=4)
    assert trainer_offload(None, micro_batches=1, bf16=False) == Offload()
    given = StreamedOffload(recompute=False)
    assert trainer_offload(given, micro_batches=3, bf16=True) == StreamedOffload(
        recompute=False, micro_batches=3)


def test_an_offload_naming_other_micro_batches_than_the_trainer_is_refused():
    with pytest.raises(BudgetError, match="micro_batches=2: the trainer accumulates 4"):
        trainer_offload(Offload(micro_batches=2), micro_batches=4, bf16=False)


def test_a_rank_s_memory_on_another_gpu_is_refused():
    torch = pytest.importorskip("torch")
    from cpu_memory import CpuMemory

    memory = CpuMemory()  # device 0
    with pytest.raises(UnifiedMemoryError) as refused:
        check_device(memory, torch.device("cuda", 1), "TrainingArguments.device")
    assert str(refused.value) == (
        "UnifiedMemory device=0: this rank trains on cuda:1 (TrainingArguments.device); "
        "accepted: device=1, the rank's GPU (LOCAL_RANK)")
    for device in (torch.device("cuda", 0), torch.device("cuda"), torch.device("cpu")):
        check_device(memory, device, "Trainer devices")


@pytest.mark.parametrize(("module", "missing", "install"), [
    ("hpcmem.integrations.hf", ["transformers.trainer"], "pip install transformers accelerate"),
    ("hpcmem.integrations.lightning", ["lightning.pytorch", "pytorch_lightning"],
     "pip install lightning"),
])
def test_a_missing_framework_is_named_with_how_to_install_it(monkeypatch, module, missing,
                                                             install):
    monkeypatch.delitem(sys.modules, module, raising=False)  # imported anew
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)  # None: importing it fails
    with pytest.raises(IntegrationError, match=install) as error:
        importlib.import_module(module)
    assert isinstance(error.value, ImportError)


def test_an_example_without_a_gpu_says_it_needs_one_and_exits_0():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/test_integrations_gpu.py runs the examples")
    done = subprocess.run([sys.executable, "examples/plain_loop.py"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (
        0, f"examples/plain_loop.py needs a CUDA GPU (torch {torch.__version__} sees none): "
           "nothing run\n")

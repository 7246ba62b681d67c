"""``UnifiedMemoryTrainer`` on the CPU (hpcmem.integrations.hf with the CPU stand-in of
``UnifiedMemory``): where it attaches, scopes and closes, training under a budget that agrees
with a plain ``transformers.Trainer``, the settings a budget refuses, and two data-parallel
ranks of a real ``torchrun`` (``tests/trainer_ranks.py``) training as one process on the
global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import torchrun  # noqa: E402
from cpu_memory import CpuMemory  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from test_um_data_parallel import LOSS_TOLERANCE, WEIGHT_TOLERANCE  # noqa: E402

from hpcmem.integrations.hf import UnifiedMemoryTrainer  # noqa: E402
from hpcmem.um import BudgetError  # noqa: E402

STEPS = 3
MICRO_BATCHES = 2
BUDGET = 2**30


def _model():
    torch.manual_seed(0)  # no dropout: the batch split's measuring row draws masks too
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32, use_cache=False,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _data():
    tokens = torch.randint(256, (STEPS * MICRO_BATCHES * 4, 32),
                           generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in tokens]


def _arguments(tmp_path, **overrides):
    settings = {"output_dir": str(tmp_path), "max_steps": STEPS, "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": MICRO_BATCHES, "learning_rate": 1e-3,
                "logging_steps": 1, "save_strategy": "no", "report_to": [], "max_grad_norm": 0.0,
                "use_cpu": True, "disable_tqdm": True, "seed": 0, **overrides}
    return transformers.TrainingArguments(**settings)


def _train(tmp_path, memory=None, offload=None, **overrides):
    """The logged losses, the weights after training, the trainer."""
    kwargs = {"model": _model(), "args": _arguments(tmp_path, **overrides),
              "train_dataset": _data()}
    if memory is None:
        trainer = transformers.Trainer(**kwargs)
    else:
        trainer = UnifiedMemoryTrainer(**kwargs, memory=memory, offload=offload)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, [p.detach().float() for p in trainer.model.parameters()], trainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    losses, weights, _ = _train(tmp_path_factory.mktemp("plain"))
    return losses, weights


def test_under_a_budget_it_trains_as_the_plain_trainer(tmp_path, reference):
    memory = CpuMemory(gpu_budget=BUDGET)
    losses, weights, trainer = _train(tmp_path, memory)
    # never moved by Trainer or accelerate; attached at the first step, one scope per
    # micro-batch, closed at the end (the fp32 weights back in the model)
    assert memory.events == ["attach", *["activations"] * (STEPS * MICRO_BATCHES), "close"]
    assert trainer.accelerator.device_placement is False
    offload = trainer.memory_stats["offload"]
    assert (offload["strategy"], offload["micro_batches"]) == ("host_optimizer", MICRO_BATCHES)
    assert offload["chunked_loss"]["applied"]
    assert losses == pytest.approx(reference[0], rel=1e-4)
    # the loss in chunks sums in another order (its gradients within 1e-6 of the plain
    # ones, relative to their largest); AdamW's division by the root of the second moment
    # lifts such noise in gradients near zero to about 1e-6 of a weight
    for ours, plain in zip(weights, reference[1], strict=True):
        torch.testing.assert_close(ours, plain, rtol=1e-4, atol=1e-5)


def test_without_a_budget_the_model_is_moved_inside_the_params_scope(tmp_path, reference):
    memory = CpuMemory()
    losses, _, _ = _train(tmp_path, memory)
    assert memory.events[:2] == ["params", "attach"]
    assert memory.events[2:] == ["activations"] * (STEPS * MICRO_BATCHES) + ["close"]
    assert losses == reference[0]


def test_gradient_clipping_under_the_host_optimizer_is_refused_and_the_memory_closed(tmp_path):
    memory = CpuMemory(gpu_budget=BUDGET)
    with pytest.raises(BudgetError, match=r"max_grad_norm=1\.0"):
        _train(tmp_path, memory, max_grad_norm=1.0)
    assert memory.events == ["attach", "close"]


def test_a_checkpoint_while_training_resumes_as_the_run_that_saved_it(tmp_path):
    """Saved at step 2 under a budget (fp32 weights, the host's optimizer state), resumed
    by another trainer: its last step lands on the saving run's weights."""
    _, saving, _ = _train(tmp_path, CpuMemory(gpu_budget=BUDGET), save_strategy="steps",
                          save_steps=2)
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert {p.dtype for p in saved.parameters()} == {torch.float32}
    trainer = UnifiedMemoryTrainer(model=_model(), args=_arguments(tmp_path),
                                   train_dataset=_data(), memory=CpuMemory(gpu_budget=BUDGET))
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    for ours, theirs in zip(trainer.model.parameters(), saving, strict=True):
        torch.testing.assert_close(ours.detach().float(), theirs, rtol=0, atol=1e-6)


def test_evaluation_under_a_budget_is_refused(tmp_path):
    trainer = UnifiedMemoryTrainer(model=_model(), args=_arguments(tmp_path),
                                   eval_dataset=_data()[:4], memory=CpuMemory(gpu_budget=BUDGET))
    with pytest.raises(BudgetError, match="evaluation"):
        trainer.evaluate()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """``tests/trainer_ranks.py``'s cases on two ranks, half of each batch a rank: where
    they trained, and what they returned."""
    out = tmp_path_factory.mktemp("ranks")
    done = torchrun(2, str(Path(__file__).with_name("trainer_ranks.py")), "hf", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def test_two_ranks_under_a_budget_train_as_one_process_on_the_global_batch(
        tmp_path, two_ranks, one_thread):
    """The model unwrapped (the strategy averages the gradients), the losses and the weights
    a checkpoint gathered from both ranks those of one process on the whole batch."""
    out, ranks = two_ranks
    losses, _, _ = _train(tmp_path, CpuMemory(gpu_budget=BUDGET), save_strategy="steps",
                          save_steps=2)
    assert ranks["budget"]["trained"] == "GPT2LMHeadModel"
    assert ranks["budget"]["losses"] == pytest.approx(losses, rel=LOSS_TOLERANCE)
    ours, one = (load_file(folder / "checkpoint-2" / "model.safetensors")
                 for folder in (out / "budget", tmp_path))
    assert sorted(ours) == sorted(one)
    for name, weight in one.items():
        torch.testing.assert_close(ours[name], weight, rtol=0, atol=WEIGHT_TOLERANCE)


def test_without_a_budget_two_ranks_are_trainer_s_own_ddp(two_ranks, reference):
    ranks = two_ranks[1]["none"]
    assert ranks["trained"] == "DistributedDataParallel"
    assert ranks["losses"] == pytest.approx(reference[0], rel=LOSS_TOLERANCE)


def test_two_ranks_refuse_the_streamed_strategy_in_one_line(two_ranks):
    assert two_ranks[1]["streamed"] == {"refused": (
        "offload strategy: 'streamed' (asked) runs one rank, not world size 2; accepted with "
        "data parallelism: host_optimizer")}

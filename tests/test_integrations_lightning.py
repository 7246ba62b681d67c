"""``UnifiedMemoryStrategy`` on the CPU (hpcmem.integrations.lightning with the CPU stand-in
of ``UnifiedMemory``): where it attaches, scopes and closes, training under both budget
strategies (through ``optimizer.step(closure)``) that agrees with a plain Lightning fit, the
settings a budget refuses, and ``devices=2`` under a real ``torchrun``
(``tests/trainer_ranks.py``) fitting as one process on the global batch and resuming from
its checkpoints as Lightning's DDP does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
import lightning.pytorch as pl  # noqa: E402
from conftest import torchrun  # noqa: E402
from cpu_memory import CpuMemory  # noqa: E402
from test_um_data_parallel import LOSS_TOLERANCE  # noqa: E402

from hpcmem.integrations.lightning import UnifiedMemoryStrategy  # noqa: E402
from hpcmem.train.models import TransformerShape  # noqa: E402
from hpcmem.train.networks import build  # noqa: E402
from hpcmem.um import BudgetError, offload_named  # noqa: E402

STEPS = 3
MICRO_BATCHES = 2
#: 1 MiB parameters (the embedding, the MLPs): what the streaming strategy streams
SHAPE = TransformerShape(n_layers=2, d_model=256, n_heads=4, seq_len=32, vocab=1024)
BUDGET = 2**30


class LanguageModel(pl.LightningModule):
    """hpcmem's transformer, its losses recorded."""

    def __init__(self, validate: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = build(SHAPE)
        self.losses: list[float] = []
        if validate:
            self.validation_step = lambda batch, index: self.net({"tokens": batch[0]})

    def on_train_start(self):
        self.trained = type(self.trainer.strategy.model).__name__  # this module, or a wrap

    def training_step(self, batch, index):
        loss = self.net({"tokens": batch[0]})
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _data(batch_size=4, shuffled=False):
    """The rows in order, or ``shuffled`` in the order Lightning's distributed sampler deals
    them out to the ranks (seed 0)."""
    tokens = torch.randint(SHAPE.vocab, (STEPS * MICRO_BATCHES * 4, SHAPE.seq_len + 1),
                           generator=torch.Generator().manual_seed(1))
    rows = torch.utils.data.TensorDataset(tokens)
    sampler = (torch.utils.data.DistributedSampler(rows, num_replicas=1, rank=0)
               if shuffled else None)
    return torch.utils.data.DataLoader(rows, batch_size=batch_size, sampler=sampler)


def _fit(memory=None, offload=None, validate=False, batch_size=4, shuffled=False,
         **settings):
    """The losses and the weights after fitting, and the strategy."""
    strategy = UnifiedMemoryStrategy(memory, offload) if memory is not None else "auto"
    trainer = pl.Trainer(**{
        "accelerator": "cpu", "strategy": strategy, "max_steps": STEPS,
        "accumulate_grad_batches": MICRO_BATCHES, "enable_checkpointing": False,
        "logger": False, "enable_progress_bar": False, "enable_model_summary": False,
        "num_sanity_val_steps": 0, **settings})
    module = LanguageModel(validate)
    trainer.fit(module, _data(batch_size, shuffled), _data() if validate else None)
    return module.losses, [p.detach().float() for p in module.parameters()], strategy


@pytest.fixture(scope="module")
def reference():
    losses, weights, _ = _fit()
    return losses, weights


#: the host steps with PyTorch's fused CPU kernel, which rounds otherwise: within a tenth of
#: one step's update (the learning rate) of the weights; the streamed strategy steps as
#: plain AdamW
@pytest.mark.parametrize(("strategy", "tolerance"), [("host_optimizer", 1e-4), ("streamed", 0.0)])
def test_under_a_budget_it_fits_as_plain_lightning(reference, strategy, tolerance):
    memory = CpuMemory(gpu_budget=BUDGET if strategy == "host_optimizer" else 16 * 2**20)
    losses, weights, ours = _fit(memory, offload_named(strategy))
    # never moved, attached as training starts; each micro-batch's forward and
    # backward in one scope; batches in the inputs scope; closed at the end
    assert memory.events == ["attach", *["inputs", "activations"] * (STEPS * MICRO_BATCHES),
                             "close"]
    assert ours.memory_stats["offload"]["strategy"] == strategy
    # one process: launched, grouped and wrapped as by SingleDeviceStrategy: not at all
    assert ours.launcher is None and not torch.distributed.is_initialized()
    assert ours.memory_stats["offload"]["bytes_h2d"] > 0
    assert losses == pytest.approx(reference[0], rel=tolerance)
    for mine, plain in zip(weights, reference[1], strict=True):
        torch.testing.assert_close(mine, plain, rtol=tolerance, atol=tolerance)


def test_without_a_budget_the_model_is_moved_inside_the_params_scope(reference):
    memory = CpuMemory()
    losses, _, _ = _fit(memory)
    assert memory.events[:2] == ["params", "attach"]
    assert memory.events[-1] == "close"
    assert memory.events.count("activations") == STEPS * MICRO_BATCHES
    assert losses == reference[0]


@pytest.mark.parametrize(("strategy", "tolerance"), [("host_optimizer", 1e-4), ("streamed", 0.0)])
def test_a_checkpoint_holds_and_resumes_what_plain_lightnings_does(strategy, tolerance,
                                                                   tmp_path):
    """Lightning's ModelCheckpoint under a budget holds the fp32 weights and optimizer state
    a plain fit's holds at the same step, and a fit resumed from it goes on as a plain fit
    resumed from the plain one (tolerances as above)."""
    budget = BUDGET if strategy == "host_optimizer" else 16 * 2**20

    def fit(under_budget: bool, folder: str, resume: bool = False):
        module = LanguageModel()
        saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / folder, save_top_k=-1,
                                             every_n_epochs=1)
        trainer = pl.Trainer(
            accelerator="cpu", max_steps=2, accumulate_grad_batches=MICRO_BATCHES,
            strategy=UnifiedMemoryStrategy(CpuMemory(gpu_budget=budget),
                                           offload_named(strategy))
            if under_budget else "auto", callbacks=[] if resume else [saver],
            enable_checkpointing=not resume, logger=False, enable_progress_bar=False,
            enable_model_summary=False)
        first = tmp_path / folder / "epoch=0-step=1.ckpt"
        trainer.fit(module, _one_step_an_epoch(), ckpt_path=first if resume else None)
        return [p.detach().float() for p in module.parameters()], first

    _, ours = fit(True, "budget")
    _, plain = fit(False, "plain")
    ours, plain = (torch.load(path, weights_only=False) for path in (ours, plain))
    for name, value in plain["state_dict"].items():
        assert ours["state_dict"][name].dtype == torch.float32
        torch.testing.assert_close(ours["state_dict"][name], value, rtol=tolerance,
                                   atol=tolerance)
    mine, theirs = (c["optimizer_states"][0]["state"] for c in (ours, plain))
    assert sorted(mine) == sorted(theirs)
    for index, values in theirs.items():
        for key, value in values.items():
            torch.testing.assert_close(mine[index][key].float(), value.float(),
                                       rtol=tolerance, atol=tolerance)
    resumed, _ = fit(True, "budget", resume=True)
    reference, _ = fit(False, "plain", resume=True)
    for a, b in zip(resumed, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


def _one_step_an_epoch(batch_size=4):
    """One step's micro-batches an epoch, ``batch_size`` rows each on each of the ranks that
    split the 4 rows of one process's micro-batch."""
    rows = next(iter(_data()))[0].repeat(MICRO_BATCHES, 1)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows),
                                       batch_size=batch_size)


@pytest.mark.parametrize(("settings", "refused"), [
    ({"gradient_clip_val": 1.0}, r"gradient_clip_val=1\.0"),
    ({"validate": True}, "validation"),
])
def test_settings_a_budget_cannot_honour_are_refused_and_the_memory_closed(settings, refused):
    memory = CpuMemory(gpu_budget=BUDGET)
    with pytest.raises(BudgetError, match=refused):
        _fit(memory, **settings)
    assert memory.events[-1] == "close"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """``tests/trainer_ranks.py``'s cases on ``devices=2``, half of each batch a rank."""
    out = tmp_path_factory.mktemp("ranks")
    done = torchrun(2, str(Path(__file__).with_name("trainer_ranks.py")), "lightning",
                    str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def test_two_ranks_under_a_budget_fit_as_one_process_on_the_global_batch(two_ranks,
                                                                           one_thread):
    """The module unwrapped (the strategy averages the gradients); each micro-batch's loss,
    averaged over the ranks, that of one process on the whole batch."""
    losses, _, _ = _fit(CpuMemory(gpu_budget=BUDGET), offload_named("host_optimizer"),
                        shuffled=True)
    assert two_ranks["budget"]["trained"] == "LanguageModel"
    assert two_ranks["budget"]["losses"] == pytest.approx(losses, rel=LOSS_TOLERANCE)


def test_without_a_budget_two_ranks_are_lightning_s_ddp(two_ranks, one_thread):
    losses, _, _ = _fit(shuffled=True)
    assert two_ranks["none"]["trained"] == "DistributedDataParallel"
    assert two_ranks["none"]["losses"] == pytest.approx(losses, rel=LOSS_TOLERANCE)


def test_two_ranks_resume_from_lightning_s_checkpoint_as_its_ddp_does(two_ranks):
    """A fit resumed from the first step's checkpoint (each rank's host shard gathered into
    it, each taking its own back) goes on with the losses of Lightning's DDP resumed from its
    own; both first take up the fit that saved it."""
    ours, ddp = two_ranks["resumed"]["budget"], two_ranks["resumed"]["none"]
    assert ours["saving"] == pytest.approx(ddp["saving"], rel=LOSS_TOLERANCE)
    assert len(ours["resumed"]) > MICRO_BATCHES  # an optimizer step on the restored state
    assert ours["resumed"] == pytest.approx(ddp["resumed"], rel=LOSS_TOLERANCE)
    assert ours["resumed"][0] == pytest.approx(ours["saving"][MICRO_BATCHES],
                                               rel=LOSS_TOLERANCE)


def test_two_ranks_refuse_the_streamed_strategy_in_one_line(two_ranks):
    assert two_ranks["streamed"] == {"refused": (
        "offload strategy: 'streamed' (asked) runs one rank, not world size 2; accepted with "
        "data parallelism: host_optimizer")}

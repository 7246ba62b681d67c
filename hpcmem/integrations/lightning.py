"""PyTorch Lightning under :func:`~hpcmem.um.UnifiedMemory`: ``UnifiedMemoryStrategy``.

::

    with UnifiedMemory("hpcmem", device=0, gpu_budget=8 << 30) as um:
        trainer = L.Trainer(strategy=UnifiedMemoryStrategy(um), precision="bf16-mixed",
                            max_steps=100)
        trainer.fit(module, data)   # attaches as training starts, closes at the end

A ``Strategy``, not a ``Callback``: the strategy is what moves the model to the device
(``model_to_device``, which a model larger than the GPU must skip), makes the optimizers
(``setup``), starts training (``on_train_start``, after a checkpoint's optimizer state is
restored: the model and the one optimizer are attached there; checkpoints while training
hold the fp32 weights and optimizer state, :mod:`hpcmem.um.host_optimizer.checkpoint`), runs
each micro-batch's ``training_step`` and ``backward`` (between which ``um.activations()``
is open) and tears down (the memory closes first, giving a budget's fp32 weights back to the
module). A callback's ``setup`` comes before the move, its ``on_fit_start`` after it, and its
batch hooks enclose the optimizer step too. Lightning's automatic optimization passes the
forward and backward to ``optimizer.step(closure)``; the budget strategies run the closure
first, as torch.optim does.

Data-parallel: ``devices=N``, ``num_nodes``, under Lightning's own launch, ``torchrun`` or
Slurm (each rank one GPU, its ``UnifiedMemory(device=LOCAL_RANK)``): the strategy is
Lightning's ``DDPStrategy`` (its launch, process group, distributed sampler: each rank
``batch_size`` rows of the global batch), but under a budget the module is not wrapped in
``DistributedDataParallel``: the budget strategy averages the gradients over the default
process group itself, which DDP would do a second time. Without a budget several ranks are
plain DDP, the memory choosing the pools only. One process launches nothing, joins no process
group, wraps nothing and keeps its loaders' samplers, as ``SingleDeviceStrategy``.

Subclasses ``lightning.pytorch``'s ``DDPStrategy`` (``pytorch_lightning``'s when only that is
installed): use the ``Trainer`` of the same package.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from hpcmem.integrations import IntegrationError, require
from hpcmem.integrations.training import attach, check_device, refuse_under_budget
from hpcmem.um.budget.offload import Offload
from hpcmem.um.errors import UnifiedMemoryError
from hpcmem.um.memory import MemoryScopes

try:
    pl = require("lightning.pytorch", "pip install lightning")
except IntegrationError:
    pl = require("pytorch_lightning", "pip install lightning")

__all__ = ["UnifiedMemoryStrategy"]

#: Lightning's ``precision`` for autocast to bf16, and for fp16 with a loss scaler.
BF16_AUTOCAST = "bf16-mixed"
LOSS_SCALED = "16-mixed"


class UnifiedMemoryStrategy(pl.strategies.DDPStrategy):
    """``memory``'s pools and budget on each rank's GPU (module docstring).

    ``offload`` : the budget's :class:`~hpcmem.um.budget.offload.Offload` (None: planned, bf16
        working weights under ``precision="bf16-mixed"``); its micro-batches are the
        trainer's ``accumulate_grad_batches``.
    ``kwargs`` : ``DDPStrategy``'s (used without a budget, over several ranks).

    ``memory_stats`` holds ``memory.stats()`` as training ended, before the memory closed.
    """

    def __init__(self, memory: MemoryScopes, offload: Offload | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.memory = memory
        self.offload = offload
        self.memory_stats: dict[str, Any] | None = None
        self._attached = False
        self._open = ExitStack()  # the micro-batch's scope, from training_step to backward

    @property
    def _several(self) -> bool:
        """Whether the trainer runs several ranks."""
        return self.num_nodes * self.num_processes > 1

    def _configure_launcher(self) -> None:
        """Lightning's launch of several ranks; none for one process."""
        if self._several:
            super()._configure_launcher()

    def setup_environment(self) -> None:
        """This rank's GPU (``memory``'s), then its process group (several ranks only)."""
        check_device(self.memory, self.root_device, "Trainer devices")
        super().setup_environment()

    def setup_distributed(self) -> None:
        """Lightning's process group over several ranks; one process joins none."""
        if self._several:
            super().setup_distributed()

    def configure_ddp(self) -> None:
        """``DistributedDataParallel`` over several ranks without a budget; under one the
        module stays as it is (the strategy averages the gradients over the ranks)."""
        if self._several and self.memory.gpu_budget is None:
            super().configure_ddp()

    def model_to_device(self) -> None:
        """Into the params pool; under a budget nowhere: attaching places the model."""
        if self.memory.gpu_budget is None:
            with self.memory.params():
                super().model_to_device()

    def setup(self, trainer: Any) -> None:
        """Lightning's set-up (the model moved, the optimizers made), refusing what the
        memory cannot fit with."""
        if not self._several:  # one process: the loaders as given, not Lightning's
            trainer._accelerator_connector.use_distributed_sampler = False  # shuffled shards
        fitting = trainer.state.fn == pl.trainer.states.TrainerFn.FITTING
        if not fitting:
            refuse_under_budget(self.memory, f"trainer.{trainer.state.fn.value}()",
                                "the strategies place the weights for training steps only",
                                "run it without a budget")
        super().setup(trainer)
        if fitting:
            self._check_fit(trainer)

    def _check_fit(self, trainer: Any) -> None:
        if len(self.optimizers) != 1:
            raise UnifiedMemoryError(
                f"UnifiedMemoryStrategy: configure_optimizers made {len(self.optimizers)} "
                "optimizers; the memory attaches one"
            )
        if not self.lightning_module.automatic_optimization:
            refuse_under_budget(self.memory, "automatic_optimization=False",
                                "a step's forward and backward are known apart only in "
                                "automatic optimization", "leave it on")
        if trainer.precision == LOSS_SCALED:
            refuse_under_budget(self.memory, f"precision={trainer.precision!r}",
                                "a loss scaler reads the gradients after backward, when they "
                                "have left the GPU,", "use precision='bf16-mixed'")

    def on_train_start(self) -> None:
        """The module and its optimizer attached: after a checkpoint's optimizer state is
        restored (the host optimizer takes it over), before the first batch."""
        trainer = self.lightning_module.trainer
        attach(self.memory, self.lightning_module, self.optimizers[0], offload=self.offload,
               micro_batches=trainer.accumulate_grad_batches,
               bf16=trainer.precision == BF16_AUTOCAST, clip_norm=trainer.gradient_clip_val,
               clip_option="gradient_clip_val")
        self._attached = True
        super().on_train_start()

    def batch_to_device(self, batch: Any, device: Any = None, dataloader_idx: int = 0) -> Any:
        """Lightning's transfer, into the inputs pool."""
        with self.memory.inputs():
            return super().batch_to_device(batch, device, dataloader_idx)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The forward in ``memory.activations()``, left open for the backward that follows
        (manual optimization: the whole step inside it)."""
        with ExitStack() as scope:
            scope.enter_context(self.memory.activations())
            output = super().training_step(*args, **kwargs)
            if output is not None and self.lightning_module.automatic_optimization:
                self._open = scope.pop_all()
        return output

    def backward(self, closure_loss: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """The backward, closing the scope its forward opened."""
        scope, self._open = self._open, ExitStack()
        with scope:
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """``Strategy.validation_step``; refused under a budget."""
        refuse_under_budget(self.memory, "validation",
                            "the strategies place the weights for training steps only",
                            "pass limit_val_batches=0 and validate without a budget")
        return super().validation_step(*args, **kwargs)

    def on_exception(self, exception: BaseException) -> None:
        """Close a scope the failed step left open."""
        scope, self._open = self._open, ExitStack()
        scope.__exit__(type(exception), exception, exception.__traceback__)
        super().on_exception(exception)

    def teardown(self) -> None:
        """Close the memory (a budget's fp32 weights back to the module), then Lightning's."""
        if self._attached:
            self.memory_stats = self.memory.stats()
        self.memory.close()
        super().teardown()

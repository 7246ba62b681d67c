"""Hugging Face ``Trainer`` under :func:`~hpcmem.um.UnifiedMemory`: ``UnifiedMemoryTrainer``.

::

    with UnifiedMemory("hpcmem", device=0, gpu_budget=8 << 30) as um:
        trainer = UnifiedMemoryTrainer(model=model, args=args, train_dataset=data, memory=um)
        trainer.train()          # attaches at the first step, closes the memory at the end
        trainer.save_model()     # the fp32 weights, back in host memory

A ``Trainer`` subclass, not a ``TrainerCallback``: a callback is told of events, but can
neither run a micro-batch's forward and backward (``training_step`` does both) inside
``um.activations()`` nor keep ``Trainer`` and ``accelerate`` from moving a model that does not
fit the GPU onto it (``_move_model_to_device``, ``Accelerator.device_placement``). The model
and optimizer are attached at the first ``training_step``: by then ``Trainer`` has made the
optimizer and the scheduler, ``accelerate`` has prepared them, and a checkpoint's optimizer
state is loaded (the host optimizer takes it over). Checkpoints while training
(``save_strategy``) hold the fp32 weights and optimizer state, as without a budget, and
``resume_from_checkpoint`` continues from them
(:mod:`hpcmem.um.host_optimizer.checkpoint`). The memory closes when ``train()`` returns or
raises, which gives a budget's fp32 weights back to the model.

Data-parallel ranks (``torchrun``'s variables, as ``Trainer`` reads them; each rank one GPU,
``UnifiedMemory(device=LOCAL_RANK)``) shard the data as ``Trainer`` does, so the
global batch is ``per_device_train_batch_size`` x ``world_size``. Under a budget the model
is not wrapped in ``DistributedDataParallel`` (``_wrap_model``: ``accelerate`` prepares it
for mixed precision only) and attaches over the default process group: the strategy averages
the gradients over the ranks itself, which a DDP wrap would do a second time. Checkpoints
gather the sharded state on every rank, rank 0 writing it. Without a budget several ranks
are ``Trainer``'s own DDP, the memory choosing the pools only. One process driving several
GPUs (``n_gpu > 1``, ``DataParallel``) is refused.

For a subclass of ``Trainer`` (TRL's ``SFTTrainer``, say), put :class:`UnifiedMemoryMixin`
first: ``class MyTrainer(UnifiedMemoryMixin, SFTTrainer)``.
"""

from __future__ import annotations

from typing import Any

from hpcmem.integrations import require
from hpcmem.integrations.training import attach, check_device, refuse_under_budget
from hpcmem.um.budget.offload import Offload
from hpcmem.um.errors import UnifiedMemoryError
from hpcmem.um.memory import MemoryScopes

hf_trainer = require("transformers.trainer", "pip install transformers accelerate")

__all__ = ["UnifiedMemoryMixin", "UnifiedMemoryTrainer"]


class UnifiedMemoryMixin:
    """What makes a ``Trainer`` train under ``memory`` (keyword-only, with ``offload``: the
    budget's :class:`~hpcmem.um.budget.offload.Offload`; None: planned, bf16 working weights under
    ``bf16=True``; its micro-batches are ``gradient_accumulation_steps``).

    ``memory_stats`` holds ``memory.stats()`` as training ended, before the memory closed.
    """

    def __init__(self, *args: Any, memory: MemoryScopes, offload: Offload | None = None,
                 **kwargs: Any) -> None:
        self.memory = memory
        self.offload = offload
        self.memory_stats: dict[str, Any] | None = None
        self._attached = False
        super().__init__(*args, **kwargs)
        _check_arguments(self.args, memory)
        if memory.gpu_budget is not None:
            self.accelerator.device_placement = False  # the strategy places model and state

    def _move_model_to_device(self, model: Any, device: Any) -> None:
        """Into the params pool; under a budget nowhere: attaching places the model."""
        if self.memory.gpu_budget is None:
            with self.memory.params():
                super()._move_model_to_device(model, device)

    def _wrap_model(self, model: Any, training: bool = True, dataloader: Any = None) -> Any:
        """``Trainer``'s wrap; under a budget ``accelerate``'s preparation for mixed precision
        alone (``evaluation_mode``: no ``DistributedDataParallel``; ``Trainer`` then prepares
        the optimizer and leaves the prepared model): the strategy averages the gradients."""
        if self.memory.gpu_budget is None:
            return super()._wrap_model(model, training, dataloader)
        return self.accelerator.prepare_model(model, device_placement=False, evaluation_mode=True)

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """One micro-batch's forward and backward inside ``memory.activations()``."""
        if not self._attached:
            attach(self.memory, self.model, self.optimizer.optimizer,  # accelerate's wrapper
                   offload=self.offload, micro_batches=self.args.gradient_accumulation_steps,
                   bf16=self.args.bf16, clip_norm=self.args.max_grad_norm,
                   clip_option="max_grad_norm")
            self._attached = True
        with self.memory.activations():
            return super().training_step(model, inputs, *args, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """``Trainer._save`` (rank 0 writes), every rank joining the gather of the weights."""
        if self._gathering() and state_dict is None:
            self.model.state_dict()
        super()._save(output_dir, state_dict)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """``Trainer``'s (rank 0 writes), every rank joining the gather of the optimizer
        state."""
        if self._gathering():
            self.optimizer.state_dict()
        super()._save_optimizer_and_scheduler(output_dir)

    def _gathering(self) -> bool:
        """Whether this rank writes nothing while its state dicts gather the ranks' shards
        (under a budget, attached, not the writing rank): it must call them as rank 0 does."""
        return (self._attached and self.memory.gpu_budget is not None
                and not self.args.should_save)

    def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.prediction_step``; refused under a budget."""
        refuse_under_budget(self.memory, "evaluation",
                            "the strategies place the weights for training steps only",
                            "set eval_strategy='no' and evaluate without a budget")
        return super().prediction_step(*args, **kwargs)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; the memory closes when it returns or raises."""
        try:
            return super().train(*args, **kwargs)
        finally:
            if self._attached:
                self.memory_stats = self.memory.stats()
            self.memory.close()


class UnifiedMemoryTrainer(UnifiedMemoryMixin, hf_trainer.Trainer):
    """``transformers.Trainer`` under :func:`~hpcmem.um.UnifiedMemory` (module docstring)."""


def _check_arguments(args: Any, memory: MemoryScopes) -> None:
    """Refuse ``TrainingArguments`` the job's memory cannot train with."""
    if args.n_gpu > 1:
        raise UnifiedMemoryError(
            f"UnifiedMemoryTrainer n_gpu={args.n_gpu}: one GPU a process is accepted; set "
            "CUDA_VISIBLE_DEVICES to one device, or start a rank per GPU (torchrun, srun)"
        )
    check_device(memory, args.device, "TrainingArguments.device")
    if args.fp16:
        refuse_under_budget(memory, "fp16=True", "a loss scaler reads the gradients after "
                            "backward, when they have left the GPU,", "train with bf16=True")

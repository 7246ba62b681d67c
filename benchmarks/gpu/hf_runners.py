"""Each variant of ``hf_offload.py``: its set-up and its timed steps (``hf_steps``), on one
process or, where ``args.launch`` says so, as one rank of a data-parallel run."""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

from hf_models import transformer_blocks
from hf_steps import plain_step, timed

__all__ = ["LEARNING_RATE", "WEIGHT_DECAY", "ZENFLOW", "ZERO", "hpcmem_offload", "run",
           "torchao_settings", "zero_config"]

LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
ZERO = {  # each DeepSpeed variant's zero_optimization
    "deepspeed": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                  "offload_optimizer": {"device": "cpu", "pin_memory": True}},
    "deepspeed3": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                   "offload_param": {"device": "cpu", "pin_memory": True},
                   "offload_optimizer": {"device": "cpu", "pin_memory": True}},
}
#: ZenFlow's settings, as DeepSpeed's ZenFlow tutorial gives them
ZENFLOW = {"topk_ratio": 0.05, "select_strategy": "auto", "select_interval": "auto",
           "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}
ZERO["zenflow"] = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                   "zenflow": ZENFLOW}


def zero_config(args: argparse.Namespace) -> dict[str, Any]:
    """The ``zero_optimization`` of a DeepSpeed variant: ``ZERO``'s, with ZenFlow's
    ``pt_reserved_cores_perc`` where ``--zenflow-pt-cores`` sets it."""
    zero = copy.deepcopy(ZERO[args.variant])  # ZERO stays as it is
    if args.variant == "zenflow" and args.zenflow_pt_cores is not None:
        zero["zenflow"]["pt_reserved_cores_perc"] = float(args.zenflow_pt_cores)
    return zero


def torchao_settings(accumulate: int) -> dict[str, Any]:
    """``CPUOffloadOptimizer``'s keyword arguments besides the learning rate and weight
    decay: fused CPU AdamW, and the gradients freed on the GPU once copied to the host, which
    its documentation recommends but which gradient accumulation cannot use."""
    return {"fused": True, "offload_gradients": accumulate == 1}


def run_cuda(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """The model on the GPU, fused AdamW; over several ranks wrapped in DDP, its gradients
    averaged once a step (``no_sync`` on the micro-batches before the last)."""
    import torch

    vocab = model.config.vocab_size
    model = model.cuda()
    if args.checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    no_sync = None
    if args.launch is not None:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[torch.cuda.current_device()])
        no_sync = model.no_sync
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=WEIGHT_DECAY, fused=True)
    step = plain_step(model, optimizer, autocast=args.dtype == "bf16", no_sync=no_sync)
    return timed(args, step, vocab)


def run_torchao(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """torchao's ``CPUOffloadOptimizer`` as its documentation shows it: the model on the GPU,
    each parameter's AdamW step on the host (fused CPU AdamW), gradients copied out as the
    backward pass makes them; bf16 autocast as ``cuda``."""
    import torch
    import torchao
    from torchao.optim import CPUOffloadOptimizer

    model = model.cuda()
    if args.checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    settings = torchao_settings(args.accumulate)
    optimizer = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=LEARNING_RATE,
                                    weight_decay=WEIGHT_DECAY, **settings)
    result = timed(args, plain_step(model, optimizer), model.config.vocab_size)
    return {**result, "torchao": {"version": torchao.__version__,
                                  "optimizer": "CPUOffloadOptimizer(torch.optim.AdamW)",
                                  **settings}}


def _one_rank() -> None:
    """The environment of a one-rank process group on this host, where none is set."""
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, value)


def run_deepspeed(args: argparse.Namespace, model: Any, zero: dict[str, Any]
                  ) -> dict[str, Any]:
    """DeepSpeed with ``zero`` as its ``zero_optimization`` (``ZERO``), bf16, its AdamW on the
    host (DeepSpeedCPUAdam), the engine accumulating over the micro-batches. The model is
    built before ``deepspeed.initialize``: ZeRO-3 partitions it there, without zero.Init."""
    _one_rank()
    import deepspeed

    if args.checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.accumulate,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": LEARNING_RATE, "weight_decay": WEIGHT_DECAY}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)

    def step(micro_batches):  # the engine scales each loss and steps at the last one
        total = 0.0
        for ids in micro_batches:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            total = loss.detach() / len(micro_batches) + total
        return total

    return {**timed(args, step, model.config.vocab_size), "deepspeed": deepspeed.__version__,
            "zero": config["zero_optimization"]}


def run_fsdp2(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """FSDP2 over the ranks (a one-rank NCCL process group of its own for one process, destroyed
    at the end): ``fully_shard`` on each transformer block, then the root, the shards on the
    host (``CPUOffloadPolicy(pin_memory=True)``), gathered to the GPU in bf16 and the
    gradients reduced in fp32 (``MixedPrecisionPolicy``); AdamW steps the host's fp32
    parameters."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    own_group = args.launch is None
    if own_group:
        _one_rank()
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    try:
        if args.checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        policies = {"offload_policy": CPUOffloadPolicy(pin_memory=True),
                    "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                      reduce_dtype=torch.float32)}
        blocks = transformer_blocks(model)
        for block in blocks:
            fully_shard(block, **policies)
        fully_shard(model, **policies)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                      weight_decay=WEIGHT_DECAY)
        step = plain_step(model, optimizer, autocast=False)
        result = timed(args, step, model.config.vocab_size)
    finally:
        if own_group:
            dist.destroy_process_group()
    return {**result, "fsdp": {"blocks": len(blocks),
                               "block": type(blocks[0]).__name__ if blocks else None,
                               "offload_policy": "CPUOffloadPolicy(pin_memory=True)",
                               "mp_policy": "param bfloat16, reduce float32"}}


def hpcmem_offload(args: argparse.Namespace) -> Any:
    """The offload value ``attach`` gets: ``--strategy``'s, else the plan's strategy unless a
    host-optimizer option names that one."""
    from hpcmem.um import offload_named

    working = "bfloat16" if args.dtype == "bf16" else "float32"
    return offload_named(args.strategy, working_dtype=working, micro_batches=args.accumulate,
                         threads=args.host_threads, gpu_share=args.gpu_share,
                         host_kernel=args.host_kernel, delayed_update=args.delayed_update,
                         state_dtype=args.state_dtype)


def run_hpcmem(args: argparse.Namespace, model: Any, budget: int) -> dict[str, Any]:
    """``attach`` under ``gpu_budget=budget`` on this process's GPU; over the ranks, the
    default NCCL group's data parallelism (given even with one rank: its collectives run)."""
    import torch
    import torch.distributed as dist

    from hpcmem.um import UnifiedMemory

    if args.checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=WEIGHT_DECAY)
    offload = hpcmem_offload(args)
    used = {}  # the device's used memory (cudaMemGetInfo): everything, the context included
    group = dist.group.WORLD if args.launch is not None else None
    device = torch.cuda.current_device()
    with UnifiedMemory("hpcmem", device=device, gpu_budget=budget) as um:
        um.attach(model, optimizer, offload=offload, process_group=group)
        used["after_attach"] = _device_used()
        step = plain_step(model, optimizer, scope=um.activations,
                          autocast=args.dtype == "bf16")
        result = timed(args, step, model.config.vocab_size, stage=um.stage,
                       warmed=um.reset_stats)
        used["after_steps"] = _device_used()
        stats = um.stats()
    return {**result, "offload": offload.to_record(), "memory": stats,
            "device_used_bytes": used}


def run(args: argparse.Namespace, model: Any, budget: int | None) -> dict[str, Any]:
    """The timed steps of ``args.variant``."""
    if args.variant in ZERO:
        return run_deepspeed(args, model, zero_config(args))
    if args.variant == "torchao":
        return run_torchao(args, model)
    if args.variant == "fsdp2":
        return run_fsdp2(args, model)
    if args.variant == "hpcmem":
        return run_hpcmem(args, model, budget)
    if args.variant == "megatrain":
        from hf_megatrain import run_megatrain  # MegaTrain's sources only where it runs

        return run_megatrain(args, model)
    return run_cuda(args, model)


def _device_used() -> int:
    import torch

    free, total = torch.cuda.mem_get_info(torch.cuda.current_device())
    return total - free

"""Hugging Face causal LMs beyond the GPU: hpcmem's budget against DeepSpeed and FSDP2 offload.

One variant per process (``--variant``), so nothing one leaves (allocator caches, the CUDA
context, DeepSpeed's process group) reaches the next; ``run.sh``'s ``hf-offload`` group
interleaves them. The model is built from a ``transformers`` config with random weights
(nothing is downloaded); every variant trains it on the same random tokens with AdamW
(lr 1e-4, weight decay 0.01) for ``--warmup`` + ``--steps`` steps, each step timed to a
device synchronisation:

* ``cuda``: the model on the GPU, fused AdamW, bf16 autocast: the unconstrained step;
* ``deepspeed``: ZeRO stage 2 with ``offload_optimizer: cpu`` (DeepSpeedCPUAdam), bf16,
  with Hugging Face gradient checkpointing (``--checkpointing``, on by default);
* ``deepspeed3``: ZeRO stage 3 with ``offload_param`` and ``offload_optimizer: cpu`` (pinned),
  otherwise as ``deepspeed``: the parameters too live on the host between uses;
* ``fsdp2``: PyTorch FSDP2 on a one-rank process group, ``fully_shard`` on every transformer
  block, then the root, with ``CPUOffloadPolicy(pin_memory=True)`` and bf16 parameters
  (``MixedPrecisionPolicy``, fp32 reduction), ``torch.optim.AdamW`` stepping the host's
  parameters, with Hugging Face gradient checkpointing (on by default);
* ``zenflow``: DeepSpeed ZenFlow, as its tutorial configures it: ZeRO stage 2 with
  ``offload_optimizer: cpu`` (pinned) and ``zero_optimization.zenflow`` (``ZENFLOW``: the top
  5% of gradient columns stepped on the GPU at once, the rest accumulated and stepped by the
  CPU every 4 steps, overlapped with the next ones), bf16, Hugging Face gradient
  checkpointing. Its update is delayed, not exact; DeepSpeed takes its gradient accumulation
  from ``update_interval``, so it runs one micro-batch per step (``--accumulate 1``);
  ``--zenflow-pt-cores`` is its ``pt_reserved_cores_perc`` (the share of the cores kept for
  the training process; DeepSpeed's default where unset);
* ``torchao``: the model and its fp32 parameters on the GPU, bf16 autocast, torchao's
  ``CPUOffloadOptimizer`` wrapping fused CPU AdamW (``torch.optim.AdamW, fused=True``),
  ``offload_gradients=True`` as its documentation recommends (False with ``--accumulate``
  above 1, which it does not support), Hugging Face gradient checkpointing;
* ``hpcmem``: the model built on the host, ``UnifiedMemory("hpcmem", gpu_budget=B)`` and
  ``attach(model, optimizer, offload=Offload(working_dtype="bfloat16"))``, bf16 autocast.
  ``--budget-from deepspeed`` takes B from the last DeepSpeed record in ``--out`` run with
  its default checkpointing: what ZeRO-Offload reserved (``deepspeed-nockpt``: its run
  without checkpointing; any variant's name works the same way), ``--budget-scale`` a share
  of it (``--budget-from cuda --budget-scale 0.3``: 30% of what the unconstrained run held).

Each process appends one record to ``--out`` (JSON lines): the median and mean step (the
mean spans ZenFlow's update cycles where the timed steps are a multiple of its interval),
PyTorch's peak
allocated and reserved bytes, NVML's per-process peak, the losses, and for hpcmem the
strategy's per-step accounting.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from hpcmem.peers.variants import CHECKPOINTED, VARIANTS

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
#: the variants of VARIANTS this script has no runner for, and why
NOT_RUN = {"megatrain": "MegaTrain replaces the model and the training loop with its own "
                        "runtime (its CUDA extension built on the GPU node, its data "
                        "pipeline); it is not run by this script"}
MODELS = {
    "gpt2-large": ("GPT2Config", {"n_embd": 1280, "n_layer": 36, "n_head": 20,
                                  "vocab_size": 50257, "n_positions": 1024}),
    "llama-0.9b": ("LlamaConfig", {"hidden_size": 2048, "intermediate_size": 5632,
                                   "num_hidden_layers": 18, "num_attention_heads": 32,
                                   "num_key_value_heads": 4, "vocab_size": 32000,
                                   "max_position_embeddings": 1024}),
    "llama-5b": ("LlamaConfig", {"hidden_size": 4096, "intermediate_size": 11008,
                                 "num_hidden_layers": 28, "num_attention_heads": 32,
                                 "num_key_value_heads": 8, "vocab_size": 32000,
                                 "max_position_embeddings": 1024}),
    # more families, below 0.7B: each brings a layout the two above lack
    "qwen2-0.5b": ("Qwen2Config", {"hidden_size": 896, "intermediate_size": 4864,  # tied, qkv bias
                                   "num_hidden_layers": 24, "num_attention_heads": 14,
                                   "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True,
                                   "max_position_embeddings": 1024}),
    "opt-350m": ("OPTConfig", {"hidden_size": 1024, "ffn_dim": 4096,  # projections in and out
                               "num_hidden_layers": 24, "num_attention_heads": 16,
                               "word_embed_proj_dim": 512, "vocab_size": 50272,
                               "do_layer_norm_before": False,
                               "max_position_embeddings": 2048}),
    "pythia-410m": ("GPTNeoXConfig", {"hidden_size": 1024, "intermediate_size": 4096,  # parallel
                                      "num_hidden_layers": 24, "num_attention_heads": 16,
                                      "vocab_size": 50304, "rotary_pct": 0.25,
                                      "max_position_embeddings": 2048}),
    "bloom-560m": ("BloomConfig", {"hidden_size": 1024, "n_layer": 24, "n_head": 16,  # ALiBi
                                   "vocab_size": 250880}),
    "gemma-0.5b": ("GemmaConfig", {"hidden_size": 1024, "intermediate_size": 4096,  # 256k vocab
                                   "num_hidden_layers": 12, "num_attention_heads": 8,
                                   "num_key_value_heads": 1, "head_dim": 128,
                                   "vocab_size": 256000, "max_position_embeddings": 1024}),
    "mixtral-0.5b": ("MixtralConfig", {"hidden_size": 1024, "intermediate_size": 1536,  # MoE
                                       "num_hidden_layers": 8, "num_attention_heads": 16,
                                       "num_key_value_heads": 4, "num_local_experts": 8,
                                       "num_experts_per_tok": 2, "vocab_size": 32000,
                                       "max_position_embeddings": 1024}),
}


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2-large")
    parser.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per optimizer step (gradient accumulation)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="bf16: autocast and bf16 working weights; fp32: neither "
                             "(cuda and hpcmem only)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="Hugging Face gradient checkpointing (default: on for "
                             f"{', '.join(CHECKPOINTED)})")
    parser.add_argument("--budget-gib", type=float, default=None)
    parser.add_argument("--budget-from", default=None,
                        help="take the budget from the last ok record of this variant in "
                             "--out, run with that variant's default --checkpointing "
                             "(NAME-nockpt: run without it)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="the share of --budget-from's bytes to take (default: 1)")
    parser.add_argument("--host-threads", type=int, default=None,
                        help="hpcmem: the host optimizer's CPU threads (default: planned)")
    parser.add_argument("--gpu-share", type=float, default=None,
                        help="hpcmem: share of the optimizer's elements the GPU steps "
                             "(default: planned)")
    parser.add_argument("--host-kernel", choices=("native", "torch"), default=None,
                        help="hpcmem: the host optimizer's kernel (default: native where "
                             "it applies)")
    parser.add_argument("--delayed-update", action="store_true",
                        help="hpcmem: ZeRO-Offload's one-step delayed parameter update from "
                             "the fifth step on")
    parser.add_argument("--state-dtype", choices=("float32", "bfloat16"), default=None,
                        help="hpcmem: the dtype of Adam's moments in host memory (bfloat16: "
                             "rounded stochastically; default: fp32)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="profile one more step after the timed ones into this "
                             "Chrome trace (.json.gz); benchmarks/gpu/trace_gaps.py reads it")
    parser.add_argument("--zenflow-pt-cores", type=float, default=None,
                        help="zenflow: pt_reserved_cores_perc, the share of the cores kept "
                             "for the training process (default: DeepSpeed's)")
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    problem = refused(args)
    if problem:
        parser.error(problem)
    return args


def refused(args: argparse.Namespace) -> str | None:
    """Why ``args`` cannot run, or None: said before torch is imported."""
    if args.variant in NOT_RUN:
        return f"--variant {args.variant}: {NOT_RUN[args.variant]}"
    if args.dtype != "bf16" and args.variant not in ("cuda", "hpcmem"):
        return (f"--dtype {args.dtype} runs with the variants cuda and hpcmem, "
                f"not {args.variant}")
    if args.variant == "zenflow" and args.accumulate != 1:
        return ("--accumulate runs with zenflow at 1 only: DeepSpeed takes ZenFlow's gradient "
                f"accumulation from its update_interval ({ZENFLOW['update_interval']})")
    if args.zenflow_pt_cores is not None:
        if args.variant != "zenflow":
            return f"--zenflow-pt-cores runs with the variant zenflow, not {args.variant}"
        if not 0 < args.zenflow_pt_cores < 1:
            return (f"--zenflow-pt-cores {args.zenflow_pt_cores:g}: a share above 0 and "
                    "below 1 is accepted")
    return None


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


def build(name: str) -> Any:
    """The model of ``MODELS[name]``, random weights, fp32, on the host."""
    import torch
    import transformers

    torch.manual_seed(0)
    kind, fields = MODELS[name]
    config = getattr(transformers, kind)(**fields, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(config)


def batches(args: argparse.Namespace, vocab: int):
    """Pinned random token batches, the same in every variant; one buffer per micro-batch of
    a step, so no copy still in flight is overwritten before the step synchronises."""
    import torch

    generator = torch.Generator().manual_seed(1)
    ring = [torch.empty(args.batch, args.seq_len, dtype=torch.long, pin_memory=True)
            for _ in range(args.accumulate)]
    for index in itertools.count():
        buffer = ring[index % len(ring)]
        buffer.copy_(torch.randint(vocab, buffer.shape, generator=generator))
        yield buffer


def _to_gpu(batch: Any) -> Any:
    return batch.to("cuda", non_blocking=True)


ALLOCATOR_COUNTS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")


def timed(args: argparse.Namespace, step, vocab: int, stage=_to_gpu, warmed=None
          ) -> dict[str, Any]:
    """``warmup + steps`` calls of ``step(micro_batches)``, each a list of ``accumulate``
    staged batches: their wall-clock ms (``times``), ``losses`` and what PyTorch's allocator
    did in the timed steps (``allocator``); ``warmed()`` runs after the warm-up. With
    ``--trace``, one more step runs under the profiler."""
    import torch

    times, losses = [], []
    source = batches(args, vocab)
    counts = {}

    def one_step() -> None:
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step([stage(next(source)) for _ in range(args.accumulate)])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(float(loss))

    for index in range(args.warmup + args.steps):
        one_step()
        if index + 1 == args.warmup:
            if warmed is not None:
                warmed()
            counts = {k: torch.cuda.memory_stats().get(k, 0) for k in ALLOCATOR_COUNTS}
    allocator = {k: torch.cuda.memory_stats().get(k, 0) - v for k, v in counts.items()}
    if args.trace is not None:
        _profiled(one_step, args.trace)
        times.pop()  # the profiled step is slower: not one of the timed ones
    return {"times": times, "losses": losses, "allocator": allocator}


def _profiled(one_step: Callable[[], None], path: Path) -> None:
    """Run ``one_step`` under torch.profiler (CPU and CUDA) and write its Chrome trace."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        one_step()
    plain = path.with_suffix("")
    profiler.export_chrome_trace(str(plain))
    with plain.open("rb") as source, gzip.open(path, "wb") as target:
        shutil.copyfileobj(source, target)
    plain.unlink()


def plain_step(model: Any, optimizer: Any,
               scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
               autocast: bool = True) -> Any:
    """One training step of a causal LM over its micro-batches, bf16-autocast unless
    ``autocast`` is off (FSDP2 casts the parameters itself), each forward and backward inside
    ``scope`` (hpcmem's activations scope; nothing for the plain run), each loss scaled by its
    share; one optimizer step. Returns the mean loss."""
    import torch

    def step(micro_batches):
        total = 0.0
        for ids in micro_batches:
            with scope():
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                    loss = model(input_ids=ids, labels=ids).loss / len(micro_batches)
                loss.backward()
            total = loss.detach() + total
        optimizer.step()
        optimizer.zero_grad()
        return total

    return step


def run_cuda(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    import torch

    model = model.cuda()
    if args.checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=WEIGHT_DECAY, fused=True)

    return timed(args, plain_step(model, optimizer, autocast=args.dtype == "bf16"),
                 model.config.vocab_size)


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


def transformer_blocks(model: Any) -> list[Any]:
    """The elements of the model's largest ``nn.ModuleList``: its transformer blocks (GPT-2's
    ``transformer.h``, Llama's ``model.layers``)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len, default=[]))


def run_fsdp2(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """FSDP2 on a one-rank NCCL process group: ``fully_shard`` on each transformer block, then
    the root, the shards on the host (``CPUOffloadPolicy(pin_memory=True)``), gathered to the
    GPU in bf16 and the gradients reduced in fp32 (``MixedPrecisionPolicy``); AdamW steps the
    host's fp32 parameters. The process group is destroyed at the end."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    _one_rank()
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
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
        dist.destroy_process_group()
    return {**result, "fsdp": {"blocks": len(blocks),
                               "block": type(blocks[0]).__name__ if blocks else None,
                               "offload_policy": "CPUOffloadPolicy(pin_memory=True)",
                               "mp_policy": "param bfloat16, reduce float32"}}


def run_hpcmem(args: argparse.Namespace, model: Any, budget: int) -> dict[str, Any]:
    import torch

    from hpcmem.um import Offload, UnifiedMemory

    if args.checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=WEIGHT_DECAY)
    working = "bfloat16" if args.dtype == "bf16" else "float32"
    offload = Offload(working_dtype=working, micro_batches=args.accumulate,
                      threads=args.host_threads, gpu_share=args.gpu_share,
                      host_kernel=args.host_kernel, delayed_update=args.delayed_update,
                      state_dtype=args.state_dtype)
    used = {}  # the device's used memory (cudaMemGetInfo): everything, the context included
    with UnifiedMemory("hpcmem", device=0, gpu_budget=budget) as um:
        um.attach(model, optimizer, offload=offload)
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
    return run_cuda(args, model)


def _device_used() -> int:
    import torch

    free, total = torch.cuda.mem_get_info(0)
    return total - free


def _budget(args: argparse.Namespace) -> int | None:
    if args.budget_from and args.out.exists():
        variant = args.budget_from.removesuffix("-nockpt")
        checkpointing = variant in CHECKPOINTED and variant == args.budget_from
        records = [json.loads(line) for line in args.out.read_text().splitlines() if line]
        held = [r["peak_reserved_bytes"] for r in records
                if r.get("variant") == variant and r.get("status") == "ok"
                and r.get("model") == args.model
                and r.get("checkpointing") == checkpointing
                and r.get("accumulate", 1) == args.accumulate
                and r.get("dtype", "bf16") == args.dtype]
        if held:
            return int(args.budget_scale * held[-1])
    return int(args.budget_gib * 2**30) if args.budget_gib else None


def main() -> int:
    args = _args()
    if args.checkpointing is None:
        args.checkpointing = args.variant in CHECKPOINTED
    import torch
    import transformers

    from hpcmem.um.nvml import NvmlPeak

    budget = _budget(args) if args.variant == "hpcmem" else None
    record: dict[str, Any] = {
        "variant": args.variant, "model": args.model, "batch": args.batch,
        "accumulate": args.accumulate, "steps": args.warmup + args.steps, "dtype": args.dtype,
        "seq_len": args.seq_len, "checkpointing": args.checkpointing, "gpu_budget": budget,
        "repeat": args.repeat, "git": os.environ.get("HPCMEM_GIT_SHA"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["benchmarks/gpu/hf_offload.py", *sys.argv[1:]]),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    started = time.perf_counter()
    managed = None
    if args.variant == "hpcmem":
        from hpcmem.um.native import load_native

        managed = load_native().gpu_bytes
    with NvmlPeak(0, managed=managed) as nvml:
        try:
            torch.cuda.init()
            record["gpu"] = torch.cuda.get_device_name(0)
            model = build(args.model)
            record["params"] = sum(p.numel() for p in model.parameters())
            if args.variant == "hpcmem" and budget is None:
                raise SystemExit("hf_offload: hpcmem needs --budget-gib or --budget-from")
            result = run(args, model, budget)
            record["status"] = "ok"
        except Exception as error:  # the record says why; the driver goes on
            traceback.print_exc()
            record.update(status="failed", reason=f"{type(error).__name__}: {error}"[:2000],
                          budget_minimum_bytes=getattr(error, "minimum", None))
            result = {}
    times = result.pop("times", [])
    timed_steps = times[args.warmup:]
    record.update(result)
    if timed_steps:
        record["step_ms"] = {"median": statistics.median(timed_steps),
                             "mean": statistics.fmean(timed_steps),
                             "min": min(timed_steps), "max": max(timed_steps)}
    record.update(
        step_ms_all=times, seconds=time.perf_counter() - started,
        peak_allocated_bytes=torch.cuda.max_memory_allocated(0),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(0),
        nvml_peak_bytes=nvml.process_bytes, nvml_device_peak_bytes=nvml.device_bytes,
        held_peak_bytes=nvml.held_bytes,
    )
    with args.out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    gib = 2**30
    print(f"{args.model} {args.variant:9} rep {args.repeat} {record['status']}: median "
          f"{record.get('step_ms', {}).get('median', float('nan')):.1f} ms, allocated "
          f"{record['peak_allocated_bytes'] / gib:.2f} GiB, reserved "
          f"{record['peak_reserved_bytes'] / gib:.2f} GiB, NVML "
          f"{(record['nvml_peak_bytes'] or 0) / gib:.2f} GiB, held "
          f"{(record['held_peak_bytes'] or 0) / gib:.2f} GiB, budget "
          f"{(budget or 0) / gib:.2f} GiB", flush=True)
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The peers' variants: each tool ``benchmarks/gpu/hf_offload.py`` trains a model with, and
hpcmem's budget mode and plain ``cuda`` beside them, in the tables' order."""

from __future__ import annotations

__all__ = ["CHECKPOINTED", "LABELS", "TOOLS", "VARIANTS"]

#: hf_offload.py's variants, in the tables' order
VARIANTS = ("cuda", "deepspeed", "deepspeed3", "zenflow", "fsdp2", "torchao", "megatrain",
            "hpcmem")
#: the offload tools hpcmem is ranked against (``cuda`` offloads nothing)
TOOLS = ("deepspeed", "deepspeed3", "zenflow", "fsdp2", "torchao", "megatrain")
#: the variants that recompute activations (gradient checkpointing) unless told otherwise
CHECKPOINTED = ("deepspeed", "deepspeed3", "zenflow", "fsdp2", "torchao")
#: what each variant runs, as the report names it
LABELS = {
    "cuda": "cuda, no limit",
    "deepspeed": "DeepSpeed ZeRO-2 + offload_optimizer cpu",
    "deepspeed3": "DeepSpeed ZeRO-3 + offload_param and offload_optimizer cpu",
    "zenflow": "DeepSpeed ZenFlow (ZeRO-2 + offload_optimizer cpu)",
    "fsdp2": "FSDP2 + CPUOffloadPolicy",
    "torchao": "torchao CPUOffloadOptimizer",
    "megatrain": "MegaTrain, layers streamed from host memory",
    "hpcmem": "hpcmem, gpu_budget",
}

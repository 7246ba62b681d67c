"""The ``megatrain`` variant of ``hf_offload.py``: MegaTrain (github.com/DLYuanGod/MegaTrain)
training the random-init model as its own ``examples/sft/train.py`` does.

MegaTrain's ``CPUMasterModel`` wraps the Hugging Face model: its layers stay in host memory
(bf16, as its train.py loads them) and are streamed to the GPU one at a time, double-buffered;
the forward pass keeps one activation every ``checkpoint_interval`` layers and the backward
pass recomputes from it; the loss is computed in chunks of ``LOSS_CHUNK`` positions; the
gradients come back to the host through ``num_grad_slabs`` pinned slabs, and DeepSpeed's
CPU Adam (fp32 moments) steps the host's parameters. Its defaults are kept, but for what the
peers share: the batch, the sequence length, AdamW's lr and weight decay, no gradient
clipping. Nothing of it is compiled: its optional CUDA extension is not used by the model.

Its sources are imported from ``HPCMEM_MEGATRAIN_DIR`` (``run.sh`` unpacks
``.dist/megatrain.tar.gz`` there); ``HPCMEM_MEGATRAIN_COMMIT`` names their commit.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_runners import LEARNING_RATE, WEIGHT_DECAY
from hf_steps import timed

__all__ = ["LOSS_CHUNK", "import_megatrain", "left_out", "run_megatrain"]

#: positions per cross-entropy chunk, fixed in MegaTrain's forward_and_backward
LOSS_CHUNK = 128
#: the least cosine similarity of MegaTrain's logits to the Hugging Face model's own
SAME_LOGITS = 0.99


def import_megatrain(environ: Mapping[str, str]) -> Any:
    """MegaTrain's package ``infinity``, imported from ``HPCMEM_MEGATRAIN_DIR``; a
    RuntimeError naming the variable where it is unset or holds no MegaTrain."""
    folder = environ.get("HPCMEM_MEGATRAIN_DIR")
    if not folder:
        raise RuntimeError("megatrain needs HPCMEM_MEGATRAIN_DIR, the folder of MegaTrain's "
                           "sources (run.sh unpacks HPCMEM_MEGATRAIN_TARBALL, default "
                           ".dist/megatrain.tar.gz, there)")
    if not (Path(folder) / "infinity" / "__init__.py").is_file():
        raise RuntimeError(f"HPCMEM_MEGATRAIN_DIR={folder}: no MegaTrain there "
                           "(infinity/__init__.py is missing)")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import infinity

    return infinity


def left_out(model: Any, trained: list[Any]) -> list[str]:
    """The names of ``model``'s parameters that are not among ``trained`` (MegaTrain's
    ``get_parameters()``): the parts of the model its layer-by-layer pass leaves out."""
    kept = {id(p) for p in trained}
    return [name for name, p in model.named_parameters() if id(p) not in kept]


def _check_same_model(model: Any, wrapper: Any, mask_of: Any) -> float:
    """The cosine similarity of MegaTrain's logits to the model's own forward on the host,
    on a few tokens; a ValueError where MegaTrain leaves parameters out or its logits are
    another model's."""
    import torch

    missing = left_out(model, wrapper.get_parameters())
    if missing:
        raise ValueError(f"MegaTrain cannot train {type(model).__name__}: its layer-by-layer "
                         f"pass leaves out {', '.join(missing)}, so it would train another "
                         "model")
    ids = torch.randint(model.config.vocab_size, (1, 16),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = model(input_ids=ids).logits.float().flatten()
        theirs = wrapper.forward_logits(ids, mask_of(ids)).float().cpu().flatten()
    similarity = float(torch.nn.functional.cosine_similarity(own, theirs, dim=0))
    if not similarity >= SAME_LOGITS:
        raise ValueError(f"MegaTrain cannot train {type(model).__name__}: its logits' cosine "
                         f"similarity to the model's own is {similarity:.3f} (below "
                         f"{SAME_LOGITS}): its pass computes another model")
    return similarity


def _attention(model: Any, infinity: Any) -> tuple[str, Any]:
    """MegaTrain's attention: flash_attention_2 with the 2-D mask where flash-attn is
    installed (its default), else SDPA with the 4-D causal mask its multi-GPU workers build
    for any other attention. Returns the implementation and ``mask_of(ids)``."""
    import torch

    if importlib.util.find_spec("flash_attn") is not None:
        model.set_attn_implementation("flash_attention_2")
        return "flash_attention_2", torch.ones_like
    model.set_attn_implementation("sdpa")
    build = infinity.CPUMasterModel._prepare_4d_causal_mask

    def mask_of(ids: Any) -> Any:
        return build(torch.ones_like(ids, device="cuda"), torch.bfloat16, ids.shape[1])

    return "sdpa", mask_of


def _cpu_adam(parameters: list[Any]) -> Any:
    """DeepSpeed's CPU Adam (AdamW mode, fp32 moments), as MegaTrain's train.py sets it, at
    the peers' lr and weight decay; a RuntimeError where DeepSpeed is not installed."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError as error:
        raise RuntimeError("megatrain steps DeepSpeed's CPU Adam: DeepSpeed is not installed "
                           "(run.sh installs it from HPCMEM_DEEPSPEED_SDIST)") from error
    return DeepSpeedCPUAdam(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY,
                            adamw_mode=True)


def _to_bf16(model: Any) -> None:
    """The model's parameters in bf16, its buffers (rotary frequencies) as they are: what
    ``from_pretrained(torch_dtype=torch.bfloat16)`` gives MegaTrain's train.py."""
    import torch

    for parameter in model.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)


def run_megatrain(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """MegaTrain's ``CPUMasterModel`` over ``model`` (made bf16 on the host, as its train.py
    loads models), ``forward_and_backward`` on each micro-batch (their gradients summed on
    the host, as its train.py accumulates), then its CPU Adam step and the weights' sync."""
    infinity = import_megatrain(os.environ)
    import torch

    _to_bf16(model)
    attention, mask_of = _attention(model, infinity)
    config = infinity.CPUMasterConfig(
        model_name=args.model, device=torch.cuda.current_device(), dtype=torch.bfloat16,
        attn_implementation=attention, dataset_path="random tokens", batch_size=args.batch,
        max_seq_len=args.seq_len, gradient_accumulation_steps=args.accumulate,
        learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    wrapper = infinity.CPUMasterModel(model, config)
    try:
        similarity = _check_same_model(model, wrapper, mask_of)
        optimizer = _cpu_adam(wrapper.get_parameters())
        mask = mask_of(torch.empty(args.batch, args.seq_len, dtype=torch.long))

        def step(micro_batches):
            losses = [wrapper.forward_and_backward(ids, mask, ids)[0] for ids in micro_batches]
            optimizer.step()
            wrapper._sync_params_to_gpu()
            wrapper.zero_grad()
            optimizer.zero_grad()
            return sum(losses) / len(losses)

        result = timed(args, step, model.config.vocab_size)
    finally:
        wrapper.cleanup()
    return {**result, "trains_same_model": True, "megatrain": {
        "version": infinity.__version__,
        "commit": os.environ.get("HPCMEM_MEGATRAIN_COMMIT") or None,
        "checkpoint_interval": config.checkpoint_interval,
        "num_grad_slabs": config.num_grad_slabs, "loss_chunk_positions": LOSS_CHUNK,
        "attn_implementation": attention, "optimizer": "DeepSpeedCPUAdam",
        "parameter_dtype": "bfloat16", "optimizer_state_dtype": "float32",
        "accumulation": "gradients summed over the micro-batches",
        "gradient_clipping": None, "layer_groups": len(wrapper.layer_groups),
        "logits_cosine_similarity": similarity}}

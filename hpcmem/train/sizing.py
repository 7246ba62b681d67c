"""Training memory footprint, and sizing a model to a fraction of free GPU memory.

Footprint model (bytes): parameters, gradients and AdamW's two moment buffers,
all fp32 (bf16 runs use autocast over fp32 master weights, which adds the bf16
weight copies autocast keeps for backward), plus the model's activation estimate
for one step. ``--oversubscribe RATIO`` picks the largest model whose footprint
stays at or below RATIO x free GPU memory; a RATIO above ``OVERSUBSCRIBE_LIMIT``
is refused before anything touches the GPU unless oversubscription is allowed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hpcmem.errors import HpcmemError
from hpcmem.train.models import CNN_WIDTHS, CNNShape, TransformerShape, transformer_shape
from hpcmem.um.guard import ENV_ALLOW

__all__ = [
    "DTYPES",
    "OVERSUBSCRIBE_LIMIT",
    "PARAMS_TOLERANCE",
    "Footprint",
    "OversubscriptionRefusedError",
    "SizingError",
    "check_oversubscribe",
    "footprint",
    "size_for_footprint",
]

#: A --params target must be within this fraction of the shape chosen for it.
PARAMS_TOLERANCE = 0.10
#: Ratios of footprint to free GPU memory above this are refused unless allowed.
OVERSUBSCRIBE_LIMIT = 0.9
#: ``--dtype`` values -> bytes per activation element.
DTYPES = {"bf16": 2, "fp32": 4}

_FP32 = 4


class SizingError(HpcmemError, ValueError):
    """No model of the kind asked for fits the memory target."""


class OversubscriptionRefusedError(HpcmemError, ValueError):
    """A requested footprint above the limit, without oversubscription allowed."""


@dataclass(frozen=True)
class Footprint:
    """Bytes one training step needs, by kind."""

    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        """All of it, in bytes."""
        return self.params + self.grads + self.optimizer + self.activations

    def to_record(self) -> dict[str, int]:
        """The footprint as a record field (bytes, with the total)."""
        return {**asdict(self), "total": self.total}


def footprint(shape: TransformerShape | CNNShape, batch: int, dtype: str) -> Footprint:
    """Estimated bytes of training ``shape`` with AdamW at ``batch`` in ``dtype``."""
    count = shape.param_count()
    act_bytes = DTYPES[dtype]
    weight_copies = count * act_bytes if dtype != "fp32" else 0
    return Footprint(
        params=count * _FP32 + weight_copies,
        grads=count * _FP32,
        optimizer=2 * count * _FP32,
        activations=shape.activation_bytes(batch, act_bytes),
    )


def check_oversubscribe(ratio: float, allowed: bool) -> None:
    """Refuse ``ratio`` above ``OVERSUBSCRIBE_LIMIT`` unless ``allowed``; pure arithmetic.

    ``allowed`` comes from ``hpcmem.um.oversubscription_allowed`` (the flag or
    ``HPCMEM_ALLOW_OVERSUBSCRIPTION=1``).
    """
    if not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"--oversubscribe: {ratio!r} is not a positive number")
    if ratio > OVERSUBSCRIBE_LIMIT and not allowed:
        raise OversubscriptionRefusedError(
            f"--oversubscribe: {ratio:g} x free GPU memory is above the {OVERSUBSCRIBE_LIMIT} "
            "limit and was refused before any allocation (asking for more managed memory than "
            "a GPU has free can hang it); on a dedicated node pass --allow-oversubscription or "
            f"set {ENV_ALLOW}=1"
        )


def size_for_footprint(
    model: str,
    target_bytes: int,
    *,
    batch: int,
    dtype: str,
    seq_len: int,
    vocab: int,
    image_size: int,
) -> TransformerShape | CNNShape:
    """The largest ``model`` whose footprint is at most ``target_bytes``.

    Raises SizingError when even the smallest model does not fit (the activations
    of the batch alone exceed the target).
    """
    if model == "cnn":
        candidates = [CNNShape(width=w, image_size=image_size) for w in CNN_WIDTHS]
    else:
        # Bisection over the parameter target in log space: footprint grows with it.
        low, high = 1e4, 1e14
        for _ in range(60):
            middle = math.sqrt(low * high)
            shape = transformer_shape(int(middle), seq_len, vocab)
            if footprint(shape, batch, dtype).total <= target_bytes:
                low = middle
            else:
                high = middle
        candidates = [transformer_shape(int(low), seq_len, vocab)]
    fitting = [s for s in candidates if footprint(s, batch, dtype).total <= target_bytes]
    if not fitting:
        smallest = footprint(candidates[0], batch, dtype)
        raise SizingError(
            f"--oversubscribe: no {model} fits in {target_bytes / 2**30:.2f} GiB at batch {batch}: "
            f"the smallest needs {smallest.total / 2**30:.2f} GiB "
            f"({smallest.activations / 2**30:.2f} GiB of activations); lower --batch"
            + (" or --seq-len" if model == "transformer" else " or --image-size")
        )
    return max(fitting, key=lambda s: footprint(s, batch, dtype).total)

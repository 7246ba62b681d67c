"""Gradient clipping by global norm on the host (``HostOptimizerOffload(max_grad_norm=)``).

Each bucket's squared gradient norm is taken on the worker thread as the bucket lands in
host memory (its shard under data parallelism); at ``optimizer.step()`` they are summed,
over the ranks too, and every bucket is stepped with its gradient times
``max_norm / (norm + 1e-6)`` when that is below 1, as ``torch.nn.utils.clip_grad_norm_``
scales. A step whose norm is not finite is skipped, as AMP's gradient scaler and
Hugging Face's ``Trainer`` skip one: no bucket steps, the weights stay.
"""

from __future__ import annotations

import math
from typing import Any

from hpcmem.um.budget.parallel import Ranks

__all__ = ["Clip"]


class Clip:
    """Clips to ``max_norm`` over ``ranks`` (None: one rank); the last step's ``norm``."""

    def __init__(self, max_norm: float, ranks: Ranks | None) -> None:
        self.max_norm = max_norm
        self.ranks = ranks
        self.norm: float | None = None
        self.skipped = 0

    def scale(self, squares: list[float]) -> float | None:
        """The factor every gradient of the step is multiplied by, from its buckets'
        squared norms on this rank; None: the norm is not finite, the step is skipped."""
        total = math.fsum(squares)
        self.norm = math.sqrt(self.ranks.total(total) if self.ranks else total)
        if not math.isfinite(self.norm):
            self.skipped += 1
            return None
        return min(1.0, self.max_norm / (self.norm + 1e-6))

    def to_record(self) -> dict[str, Any]:
        """The bound, the last step's norm, the steps skipped."""
        return {"max_grad_norm": self.max_norm, "grad_norm": self.norm,
                "skipped_steps": self.skipped}

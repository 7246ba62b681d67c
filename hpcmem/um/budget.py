"""GPU budget arithmetic: how many bytes of room each type of data gets, and byte counts.

The streaming budget mode (:mod:`hpcmem.um.stream.plan`) gives the room its plan has left
to the types in the policy's priority order: parameters kept resident, saved activations
kept on the device. Pure arithmetic, testable without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["plan_budget"]


def plan_budget(
    budget: int,
    priority: Sequence[str],
    demand: Mapping[str, int],
    wants_gpu: Mapping[str, bool],
) -> dict[str, int]:
    """GPU bytes per type: each type in ``priority`` order takes ``min(demand, what is left)``.

    Types whose policy does not place them on the GPU get 0. A type with no known demand
    (absent from ``demand``) may take everything that is left.

    >>> plan_budget(10, ["params", "activations", "inputs"],
    ...             {"params": 6, "activations": 8, "inputs": 1},
    ...             {"params": True, "activations": True, "inputs": False})
    {'params': 6, 'activations': 4, 'inputs': 0}
    """
    if budget < 0:
        raise ValueError(f"gpu_budget: {budget} bytes must be >= 0")
    left = budget
    quotas: dict[str, int] = {}
    for type_name in priority:
        if not wants_gpu[type_name]:
            quotas[type_name] = 0
            continue
        need = demand.get(type_name)
        if need is not None and need < 0:
            raise ValueError(f"demand of {type_name}: {need} bytes must be >= 0")
        quota = left if need is None else min(need, left)
        quotas[type_name] = quota
        left -= quota
    return quotas


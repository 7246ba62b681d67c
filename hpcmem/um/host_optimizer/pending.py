"""Gradients a step has made but no optimizer has taken, across a change of strategy.

A model attached with gradients in ``.grad`` (given back by a strategy whose probe refused
the budget, :mod:`hpcmem.um.strategy`) keeps them: the step adds to them. A strategy closed
after its probe refused gives back what the step's backward made, in ``.grad``, in each
parameter's own dtype and place (fp32, host), as a model without a budget would hold it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["adopt", "refused_grads", "take"]


def take(model: Any) -> dict[Any, Any]:
    """The gradients ``model``'s parameters hold, by parameter, taken out of ``.grad``."""
    pending = {}
    for param in {id(p): p for p in model.parameters()}.values():
        if param.grad is not None:
            pending[param], param.grad = param.grad, None
    return pending


def adopt(pending: dict[Any, Any]) -> None:
    """``pending`` back into ``.grad``, in each parameter's dtype and place now."""
    for param, grad in pending.items():
        param.grad = grad.to(device=param.device, dtype=param.dtype)


def refused_grads(engine: Any) -> dict[Any, Any]:
    """The gradients of ``engine``'s first step (a :class:`~.engine.HostOptimizer` whose
    probe refused the budget; nothing was stepped), off the device, by parameter: on the
    step's last micro-batch or where micro-batches sum in host memory, those sent there (the
    rest sent there first); before it, those accumulating in ``.grad``."""
    if engine._micro < engine.offload.micro_batches and not engine.micro_sums:
        return {p: p.grad.detach().cpu() for b in engine.buckets for p in b.params
                if p.grad is not None}
    sums = engine.part_sums
    summed = {(b.index, i) for b in engine.buckets for i in range(len(b.params))
              if engine._summing and sums.holds(b.index, i)}
    engine.send_the_rest()
    if sums is not None:
        sums.end_step()  # the parts' sums are in the gradient homes
    engine.transport.synchronize()
    grads = {}
    for bucket in engine.buckets:
        home = engine.host.grads[engine._parity][bucket.index]
        for position, param in enumerate(bucket.params):
            if position not in engine._left[bucket.index] or (bucket.index, position) in summed:
                grads[param] = bucket.slot(home, position).clone()
    return grads

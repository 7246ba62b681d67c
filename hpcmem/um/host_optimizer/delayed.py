"""ZeRO-Offload's delayed parameter update on the host optimizer's worker: a bucket's job of
one step is waited for, and its weights sent up, during the next step's backward, once that
bucket's gradients are complete again (:mod:`.engine`, ``delayed_update``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcmem.um.budget.transport import Transport
from hpcmem.um.host_optimizer.worker import Stepped, Worker

__all__ = ["Delayed"]


class Delayed:
    """The jobs of the step before that are still outstanding, and the last upload of them."""

    def __init__(self, worker: Worker, transport: Transport) -> None:
        self._worker = worker
        self._transport = transport
        self._stepped: list[Stepped] = []  # jobs of the step before, waited for in this one
        self._uploaded: Any = None  # the last upload of this step

    def catch_up(self, index: int) -> Any:
        """Bucket ``index``'s job of the step before: waited for, its weights sent up once
        the compute work queued so far is done; the token of that copy (None: nothing was
        outstanding)."""
        done = self._worker.wait(index)
        if done is None:
            return None
        self._stepped.append(done)
        self._uploaded = self._worker.upload(index, self._transport.mark())
        return self._uploaded

    def finish(self, gpu_buckets: Iterable[int]) -> list[Stepped]:
        """A delayed step's end: the next forward waits (on the device) for this step's
        uploads; a bucket the GPU steps next step (``gpu_buckets``) has its job of this one
        (it went back to the CPU, :meth:`.device_step.DeviceStep.release`) finished and
        uploaded now, before the GPU reads its master. The jobs of the step before, waited
        for during this one."""
        for index in gpu_buckets:
            self.catch_up(index)
        if self._uploaded is not None:
            self._transport.wait(self._uploaded)
        done, self._stepped, self._uploaded = self._stepped, [], None
        return done

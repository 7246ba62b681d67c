"""The thread that steps buckets on the CPU while backward goes on, in the order they land.

One job per bucket: wait (on this thread) for its gradient to land in host memory, step it,
and copy its updated weights to the device once the compute stream is done with the old
working weights: those the kernel wrote in the working dtype, or the fp32 master, narrowed
on the device (``through``: a buffer of plain device memory of the master's dtype,
:mod:`.staging`; None when nothing is narrowed). Under the delayed update the job only
steps: the engine waits for it (:meth:`Worker.wait`) when the bucket's next gradients are
complete, and uploads it then (:meth:`Worker.upload`); the bucket's next job waits for that
copy before it writes what the copy reads.
Both bucket kernels release the GIL, so the step runs beside autograd's thread. The native
one has threads of its own, bound one to each of ``cpus`` (:mod:`.kernel`); PyTorch's
spreads each bucket over ``threads`` intra-op threads, set on the worker's own thread
(OpenMP's thread count is a per-thread setting: one made on the main thread does not reach
it), which is bound to ``cpus`` first, so the OpenMP threads it starts are too
(:mod:`.cores`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hpcmem.um.budget.transport import Transport
from hpcmem.um.host_optimizer.cores import pin_thread
from hpcmem.um.host_optimizer.host import HostBuckets

__all__ = ["Stepped", "Worker"]


@dataclass(frozen=True)
class Stepped:
    """One bucket's job, done: its CPU time, the token of its upload (None: the caller
    uploads it, or the copy was synchronous)."""

    index: int
    cpu_ms: float
    uploaded: Any = None


class Worker:
    """Steps buckets of ``host`` and copies them into ``device_flats`` through ``transport``
    (and ``through``), on ``threads`` CPU threads (None: PyTorch's default) bound to ``cpus``
    (None: where the scheduler puts them)."""

    def __init__(
        self, host: HostBuckets, device_flats: list[Any], transport: Transport,
        through: Any = None, threads: int | None = None, cpus: list[int] | None = None,
    ) -> None:
        self.host = host
        self.device_flats = device_flats
        self.transport = transport
        self.through = through
        self.threads = threads
        self.cpus = cpus
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcmem-host-step",
                                        initializer=self._start)
        self._jobs: dict[int, Future[Stepped]] = {}  # by bucket, in the order submitted
        self._squares: list[Future[float]] = []  # the step's gradient norms, squared

    def _start(self) -> None:
        """On the worker's thread, before its first step: its CPUs, its thread count."""
        import torch

        if self.cpus is not None:
            pin_thread(self.cpus)
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def submit(self, index: int, landed: Any, released: Any, missing: list[int], *,
               parity: int = 0, before: Any = None, scale: float = 1.0) -> None:
        """Step bucket ``index`` from its gradient buffer ``parity`` (times ``scale``) once
        ``landed`` (its last gradient copy) and ``before`` (the last copy reading its
        weights) are done, and copy it up once ``released`` (the compute work that read the
        old weights) is; None: the caller uploads it (:meth:`upload`) after :meth:`wait`."""
        if index in self._jobs:
            raise RuntimeError(f"host optimizer: bucket {index} submitted twice")
        self._jobs[index] = self._pool.submit(self._run, index, landed, released, missing,
                                              parity, before, scale)

    def call(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        """``fn(*args)`` on the worker's thread, after every job submitted before it."""
        return self._pool.submit(fn, *args)

    def measure(self, index: int, landed: Any, missing: list[int], parity: int = 0) -> None:
        """Take bucket ``index``'s squared gradient norm once ``landed`` is done (clipping:
        :meth:`squares`)."""
        self._squares.append(self._pool.submit(self._square, index, landed, missing, parity))

    def _square(self, index: int, landed: Any, missing: list[int], parity: int) -> float:
        if landed is not None:
            self.transport.settle(landed)
        return self.host.square(index, missing, parity)

    def squares(self) -> list[float]:
        """Wait for every squared norm measured since the last call; their values."""
        futures, self._squares = self._squares, []
        return [future.result() for future in futures]

    def _run(self, index: int, landed: Any, released: Any, missing: list[int], parity: int,
             before: Any, scale: float) -> Stepped:
        import torch

        for token in (before, landed):
            if token is not None:
                self.transport.settle(token)
        start = time.perf_counter()
        with torch.no_grad():
            self.host.step_bucket(index, missing, parity, scale)
        cpu_ms = (time.perf_counter() - start) * 1e3
        uploaded = None if released is None else self.upload(index, released)
        return Stepped(index, cpu_ms, uploaded)

    def upload(self, index: int, after: Any = None) -> Any:
        """Copy bucket ``index``'s updated weights into its working weights on the device,
        after ``after``; a master of another dtype by way of ``through``, in pieces of its
        size, narrowed one by one. The token of the last copy."""
        flat, master = self.device_flats[index], self.host.upload_source(index)
        if self.through is None or master.dtype == flat.dtype:
            return self.transport.upload(master, flat, after=after)
        size, token = self.through.numel(), None
        for start in range(0, flat.numel(), size):  # one stream: each piece after the last
            end = min(start + size, flat.numel())
            token = self.transport.upload(master[start:end], flat[start:end],
                                          after=after if start == 0 else None,
                                          through=self.through[: end - start])
        return token

    def wait(self, index: int) -> Stepped | None:
        """Wait for bucket ``index``'s job, if one is outstanding; its result."""
        job = self._jobs.pop(index, None)
        return None if job is None else job.result()

    def drain(self) -> list[Stepped]:
        """Wait for every outstanding job; their results, in the order submitted (the first
        job's error, if one failed)."""
        jobs, self._jobs = self._jobs, {}
        return [job.result() for job in jobs.values()]

    def close(self) -> None:
        """Finish what was submitted and stop the thread."""
        self._pool.shutdown(wait=True)

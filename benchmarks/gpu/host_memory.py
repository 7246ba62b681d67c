"""The host optimizer's memory bound: its kernel's rate alone and beside PCIe copies.

    python benchmarks/gpu/host_memory.py OUT.json [--numel N]

On the host optimizer's CPUs (the job's less the two left to launches, ``cores.py``): the
rate of a plain host copy; one bf16-in, bf16-out AdamW step of hpcmem's native kernel over
``N`` elements (28 bytes an element: master, two moments and gradient read, master, moments
and working weights written), alone; and the same while a thread keeps page-locked copies
running both ways between host and GPU, as the budget mode's copies do. Medians of 7.
Writes one JSON object; needs a CUDA GPU and the native kernel (``run.sh`` builds it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

ADAM_BYTES = 28  # per element, bf16 gradient in and bf16 working weights out
COPY_NUMEL = 128 * 2**20  # fp32 elements each way per copy


def median_seconds(run: Callable[[], object], repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Copies:
    """Page-locked copies both ways on two streams, from a thread, until stopped; the bytes
    moved in the timed span between :meth:`mark` and :meth:`stop`."""

    def __init__(self, torch) -> None:
        self.torch = torch
        self.host_in = torch.empty(COPY_NUMEL, pin_memory=True)
        self.host_out = torch.empty(COPY_NUMEL, pin_memory=True)
        self.device_in = torch.empty(COPY_NUMEL, device="cuda")
        self.device_out = torch.zeros(COPY_NUMEL, device="cuda")
        self.streams = (torch.cuda.Stream(), torch.cuda.Stream())
        self._stop = threading.Event()
        self._moved = 0
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        torch, (up, down) = self.torch, self.streams
        while not self._stop.is_set():
            with torch.cuda.stream(up):
                self.device_in.copy_(self.host_in, non_blocking=True)
            with torch.cuda.stream(down):
                self.host_out.copy_(self.device_out, non_blocking=True)
            up.synchronize()
            down.synchronize()
            self._moved += 2 * 4 * COPY_NUMEL

    def start(self) -> None:
        self._thread.start()
        time.sleep(0.3)  # both ways running before anything is timed

    def mark(self) -> None:
        self._moved, self._since = 0, time.perf_counter()

    def stop(self) -> float:
        """Stop; the rate both ways together since :meth:`mark`, GB/s."""
        moved, seconds = self._moved, time.perf_counter() - self._since
        self._stop.set()
        self._thread.join()
        return moved / seconds / 1e9


def measure(numel: int) -> dict[str, object]:
    import torch

    from hpcmem.um.host_optimizer.cores import optimizer_cpus, pin_thread
    from hpcmem.um.host_optimizer.kernel import bucket_kernel

    cpus = optimizer_cpus(None)
    pin_thread(cpus)
    torch.set_num_threads(len(cpus))
    source, target = torch.randn(numel), torch.empty(numel)
    record: dict[str, object] = {"cpus": cpus, "threads": len(cpus), "numel": numel}
    record["copy_GBps"] = 8 * numel / median_seconds(lambda: target.copy_(source)) / 1e9
    master = torch.randn(numel)
    optimizer = torch.optim.AdamW([master], lr=1e-3, fused=True)
    kernel = bucket_kernel(optimizer, torch.bfloat16, threads=len(cpus), cpus=cpus)
    grad, weights = torch.randn(numel).bfloat16(), torch.empty(numel, dtype=torch.bfloat16)
    record["host_kernel"] = kernel.name

    def step() -> None:
        kernel.step(optimizer, master, grad, weights)

    step()  # the state is made
    for name, copies in (("alone", None), ("beside_copies", Copies(torch))):
        if copies is not None:
            copies.start()
            copies.mark()
        seconds = median_seconds(step)
        record[f"adam_ms_per_1e9_{name}"] = seconds * 1e3 * 1e9 / numel
        record[f"adam_GBps_{name}"] = ADAM_BYTES * numel / seconds / 1e9
        if copies is not None:
            record["copies_GBps_both_ways_beside_adam"] = copies.stop()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--numel", type=int, default=128 * 2**20)
    args = parser.parse_args()
    record = measure(args.numel)
    print(json.dumps(record))
    args.out.write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

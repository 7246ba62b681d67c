"""Where the compute stream waits in a profiled step: its idle gaps, and what the host did.

    python benchmarks/gpu/trace_gaps.py TRACE.json.gz [--top 15]

Reads a Chrome trace from ``torch.profiler`` (``hf_offload.py --trace``). The compute stream
is the stream with the most kernel time. Between its first and last kernel, every interval
in which it runs nothing is a gap. For each gap, the operation that ends it was launched by
some host thread at some time: a launch after the gap began means the GPU waited for the
host. The report sums, over all gaps, the time each host operation (the innermost CUDA
runtime call or ATen operation on the launching thread) overlapped them, and lists the
longest gaps with the operations around them.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver", "cpu_op", "user_annotation")
#: Gaps shorter than this (µs) are launch jitter, not waiting.
MIN_GAP_US = 5.0


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def _intervals(events: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    return sorted((e["ts"], e["ts"] + e.get("dur", 0), e) for e in events)


def gaps(stream: list[tuple[float, float, dict[str, Any]]]
         ) -> list[tuple[float, float, dict[str, Any]]]:
    """Idle intervals of one stream longer than ``MIN_GAP_US``: (start, end, the event after)."""
    found, busy_until = [], stream[0][1]
    for start, end, event in stream[1:]:
        if start - busy_until > MIN_GAP_US:
            found.append((busy_until, start, event))
        busy_until = max(busy_until, end)
    return found


def innermost(host: list[tuple[float, float, dict[str, Any]]], starts: list[float], at: float,
              skip: Any) -> dict[str, Any] | None:
    """The shortest event of one thread's ``host`` events (sorted, ``starts`` their start
    times) that spans time ``at``, ``skip`` aside."""
    spanning = [e for s, t, e in host[max(0, bisect.bisect_right(starts, at) - 500):
                                      bisect.bisect_right(starts, at)]
                if s <= at <= t and e is not skip]
    return min(spanning, key=lambda e: e.get("dur", 0)) if spanning else None


def report(events: list[dict[str, Any]], top: int) -> str:
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    by_stream: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for event in gpu:
        by_stream[event["tid"]].append(event)
    compute_tid = max(by_stream, key=lambda t: sum(e.get("dur", 0) for e in by_stream[t]
                                                   if e["cat"] == "kernel"))
    stream = _intervals(by_stream[compute_tid])
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES]
    launches = {e["args"]["correlation"]: e for e in host
                if e["cat"].startswith("cuda_") and "correlation" in e.get("args", {})}
    by_thread: dict[Any, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for event in host:
        by_thread[event["tid"]].append((event["ts"], event["ts"] + event.get("dur", 0), event))
    for thread in by_thread.values():
        thread.sort(key=lambda item: item[0])
    starts = {tid: [s for s, _, _ in thread] for tid, thread in by_thread.items()}
    span = stream[-1][1] - stream[0][0]
    found = gaps(stream)
    idle = sum(t - s for s, t, _ in found)
    lines = [f"compute stream {compute_tid}: span {span / 1e3:.1f} ms, busy "
             f"{(span - idle) / 1e3:.1f} ms, idle {idle / 1e3:.1f} ms in {len(found)} gaps "
             f"> {MIN_GAP_US:.0f} us; other streams: "
             + ", ".join(f"{t}: {sum(e.get('dur', 0) for e in es) / 1e3:.1f} ms busy"
                         for t, es in by_stream.items() if t != compute_tid)]
    blame: dict[str, float] = defaultdict(float)
    late = 0.0
    rows = []
    for start, end, after in found:
        launch = launches.get(after.get("args", {}).get("correlation"))
        if launch is None:
            blame["(launch not in trace)"] += end - start
            continue
        thread = by_thread[launch["tid"]]
        lateness = max(0.0, min(launch["ts"], end) - start)
        late += lateness
        # what the launching thread was doing while the stream waited for it
        doing = innermost(thread, starts[launch["tid"]], (start + min(launch["ts"], end)) / 2,
                          launch)
        name = f"{doing['name'] if doing else 'idle host'} (tid {launch['tid']})"
        blame[name] += lateness
        blame["(launched in time: the stream waited on an event)"] += (end - start) - lateness
        rows.append((end - start, start, after["name"][:60], launch["name"], lateness, name))
    lines.append(f"of the idle time, {late / 1e3:.1f} ms the next operation was not yet launched")
    lines.append("\nidle time by what the launching thread was doing (ms):")
    for name, us in sorted(blame.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {us / 1e3:8.2f}  {name}")
    lines.append(f"\nlongest {top} gaps: µs, at ms, next GPU op, its launch, µs late, host doing")
    for dur, start, after, launch, lateness, name in sorted(rows, reverse=True)[:top]:
        lines.append(f"  {dur:8.0f} {(start - stream[0][0]) / 1e3:8.1f}  {after}  "
                     f"[{launch}] {lateness:8.0f}  {name}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(report(load(args.trace), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One rank of ``tests/test_hf_offload_dp.py``'s launch: started by ``torchrun``, it finds its
place as ``benchmarks/gpu/hf_offload.py`` does (``hf_ranks.launch_of``), hands rank-made
figures to rank 0 over gloo (``hf_ranks.gather``), and rank 0 writes the merged fields.

``torchrun --nproc-per-node N tests/hf_dp_ranks.py OUT``: rank ``r``'s step ``i`` takes
``10 * (i + 1) + r`` ms (the last rank is the slowest), its loss is ``r + i`` and its peaks
grow with ``r``; rank 0 writes ``hf_ranks.merge``'s fields and its launch as JSON to OUT.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))

import torch.distributed as dist
from hf_ranks import gather, launch_of, merge

GIB = 2**30
STEPS, WARMUP = 6, 2


def main(out: str) -> None:
    launch = launch_of(int(os.environ["WORLD_SIZE"]), os.environ)
    dist.init_process_group("gloo", rank=launch.rank, world_size=launch.world_size)
    rank = launch.rank
    mine = {"rank": rank, "status": "ok", "reason": None,
            "times": [10.0 * (i + 1) + rank for i in range(STEPS)],
            "losses": [float(rank + i) for i in range(STEPS)],
            "peak_allocated_bytes": GIB, "peak_reserved_bytes": (2 + rank) * GIB,
            "nvml_peak_bytes": (3 + rank) * GIB, "held_peak_bytes": None,
            "host_peak_bytes": (10 + rank) * GIB}
    every = gather(mine, dist.group.WORLD)
    dist.destroy_process_group()
    if rank == 0:
        merged = merge(every, warmup=WARMUP, tokens_per_step=8 * 1024, budget=4 * GIB)
        Path(out).write_text(json.dumps({"launch": launch.__dict__, "merged": merged}))


if __name__ == "__main__":
    main(sys.argv[1])

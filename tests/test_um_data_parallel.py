"""Data parallelism in the host-optimizer strategy, for real: 2 and 4 processes started as
``torchrun`` starts ranks (``tests/um_ranks.py``), gloo between them, the CPU transport,
each rank training on its slice of the same global batch as one rank trains on the whole.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from um_ranks import train  # noqa: E402

from hpcmem.um import BudgetError  # noqa: E402
from hpcmem.um.budget.parallel import Ranks  # noqa: E402
from hpcmem.um.passthrough import PassThroughMemory  # noqa: E402

RANKS_SCRIPT = Path(__file__).with_name("um_ranks.py")
#: Relative difference allowed between a step's loss on N ranks and on one. The ranks add
#: the same fp32 gradients in another order (each rank sums its rows, the reduce-scatter
#: averages the ranks): a few units in the last place of fp32 (measured: 7.6e-8 at most
#: over 2 and 4 ranks, 4 steps, 1 and 2 micro-batches), with room for another platform's
#: summation order.
LOSS_TOLERANCE = 1e-6
#: Absolute difference allowed between a weight after four steps on N ranks and on one:
#: 1% of one step's learning rate (1e-3). Adam divides each gradient by its root mean
#: square, so an element whose gradient is near ``eps`` moves by a good part of the learning
#: rate whichever way its rounding goes: weights are compared in units of the learning rate
#: (measured: 2.7e-6 at most).
WEIGHT_TOLERANCE = 1e-5
#: plain steps, accumulation, and clipping by the norm over every rank (it clips: the
#: gradients' norm is about 0.5)
CASES = [{"micro_batches": 1}, {"micro_batches": 2}, {"max_grad_norm": 0.05}]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(world: int, tmp_path: Path, cases: list[dict]) -> list[subprocess.CompletedProcess]:
    """Run ``world`` ranks of ``tests/um_ranks.py`` on ``cases``; their results."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cases": cases}))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(RANKS_SCRIPT), str(path), str(tmp_path)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r in range(world)]
    done = []
    for rank in ranks:
        stdout, stderr = rank.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(rank.args, rank.returncode, stdout, stderr))
    return done


@pytest.fixture(scope="module")
def one_rank():
    """The cases trained by one process, no process group: the reference (one thread, as
    each rank has; the tests after it get their threads back)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield [train(1, 0, **case) for case in CASES]
    finally:
        torch.set_num_threads(threads)


def _relative(ours, reference) -> float:
    return float(((ours - reference).abs().max() / reference.abs().max()).item())


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_train_as_one_rank_on_the_global_batch(world, one_rank, tmp_path):
    launched = _launch(world, tmp_path, CASES)
    for rank, result in enumerate(launched):
        assert result.returncode == 0, f"rank {rank}: {result.stderr[-2000:]}"
    for rank in range(world):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for case, ours, (losses, stats, params) in zip(CASES, results, one_rank, strict=True):
            assert _relative(torch.tensor(ours["losses"]), torch.tensor(losses)) < LOSS_TOLERANCE, (
                case, ours["losses"], losses)
            for mine, reference in zip(ours["params"], params, strict=True):
                # whole on every rank after close(): the shards gathered
                assert float((mine - reference).abs().max()) < WEIGHT_TOLERANCE, case
            offload = ours["stats"]
            assert offload["world_size"] == world and stats["world_size"] == 1
            # every rank holds 1/N of the masters, gradients and moments (padding aside)
            share = offload["host_optimizer_bytes"] * world / stats["host_optimizer_bytes"]
            assert 1 <= share < 1.05, (offload["host_optimizer_bytes"], share)
            # one reduce-scatter of the gradients, one all-gather of the weights, per step
            assert offload["bytes_communicated"] == 2 * offload["working_bytes"]
            assert stats["bytes_communicated"] == 0
            if "max_grad_norm" in case:
                assert abs(offload["clip"]["grad_norm"] / stats["clip"]["grad_norm"] - 1) < 1e-5


def test_a_checkpoint_of_two_ranks_resumes_on_two_ranks_and_on_one(one_rank, tmp_path):
    """The state dicts are whole on every rank (the shards gathered): resumed on two ranks
    or on one, the next steps' losses are the uninterrupted run's."""
    path = str(tmp_path / "checkpoint.pt")
    saved = _launch(2, tmp_path, [{"steps": 2, "save": path}])
    assert [r.returncode for r in saved] == [0, 0], saved[1].stderr[-2000:]
    reference = torch.tensor(one_rank[0][0][2:])
    resumed = _launch(2, tmp_path, [{"steps": 2, "resume": path, "skip": 2}])
    assert [r.returncode for r in resumed] == [0, 0], resumed[1].stderr[-2000:]
    ours = torch.load(tmp_path / "rank0.pt")[0]["losses"]
    assert _relative(torch.tensor(ours), reference) < LOSS_TOLERANCE, (ours, reference)
    alone, _, _ = train(1, 0, steps=2, resume=path, skip=2)
    assert _relative(torch.tensor(alone), reference) < LOSS_TOLERANCE, (alone, reference)


def test_a_group_of_one_rank_runs_the_collectives(one_rank):
    """A group given with one rank reduces and gathers (the GPU test runs NCCL so); without
    one, a default group of one rank runs none."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        losses, stats, _ = train(1, 0, process_group=dist.group.WORLD)
        _, single, _ = train(1, 0, steps=1)
    finally:
        dist.destroy_process_group()
    assert losses == one_rank[0][0]  # one rank's average is its own gradient, bit for bit
    assert stats["world_size"] == 1 and stats["bytes_communicated"] == 2 * stats["working_bytes"]
    assert single["bytes_communicated"] == 0


def test_what_several_ranks_cannot_run_is_refused_in_one_line(tmp_path):
    refusals = {
        "data parallel gpu_budget: rank 1 has 1074790400, rank 0 has 1073741824; every rank "
        "needs the same": {"budget_step": 2**20},
        "offload strategy: 'streamed' (asked) runs one rank, not world size 2; accepted with "
        "data parallelism: host_optimizer": {"strategy": "streamed"},
        "process_group backend: 'gloo' cannot reduce cuda tensors; accepted: nccl":
            {"device": "cuda"},
    }
    launched = _launch(2, tmp_path, list(refusals.values()))
    for result in launched:
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.strip().splitlines() == [f"error: {line}" for line in refusals]


def test_shards_are_equal_and_aligned():
    ranks = Ranks(group=None, rank=2, size=4, device=torch.device("cpu"))
    assert ranks.padded(1000, 64) == 1024 and ranks.padded(1024, 64) == 1024
    assert ranks.shard(1024) == (512, 768)
    with pytest.raises(ValueError, match="1001 elements do not split into 4 ranks"):
        ranks.shard(1001)


def test_the_cuda_policy_refuses_a_process_group():
    memory = PassThroughMemory("cuda")
    with pytest.raises(BudgetError, match=r"^attach: process_group needs a gpu_budget"):
        memory.attach(torch.nn.Linear(2, 2), process_group=object())

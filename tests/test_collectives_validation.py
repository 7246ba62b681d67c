"""Validation covers the timed iterations: a collective that goes wrong only while timed
(a fault injected into the real mpi4py call from its second call on) fails the point."""

from __future__ import annotations

import json
import sys

import pytest

pytestmark = pytest.mark.mpi

FAULTY = """
import dataclasses, json
from mpi4py import MPI
from hpcmem.collectives import benchmark, ops
from hpcmem.collectives.options import make_options

real = ops.OPS["allreduce"]

def bind(comm, send, recv, count, n, root, mpi):
    call = real.bind(comm, send, recv, count, n, root, mpi)
    calls = []
    array = recv[0]  # the message [array, datatype]
    def wrong_when_timed():
        call()
        calls.append(1)
        if len(calls) > 1 and comm.Get_rank() == 1 and array.size:
            array[-1] += 1  # the checked first call is right, the timed ones are not
    return wrong_when_timed

ops.OPS["allreduce"] = dataclasses.replace(real, bind=bind)
options = make_options(op="allreduce", buffer="numpy", min_size="8", max_size="16",
                       iterations="3", warmup="0", dtype="float32", numpy_hugepage=None,
                       run_id="faulty")
records = benchmark.run(MPI.COMM_WORLD, options, lambda line: None)
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps([[r["status"], r["reason"], r["validated"]] for r in records]))
"""


def test_corruption_in_the_timed_iterations_fails_the_point(mpirun):
    result = mpirun(2, sys.executable, "-c", FAULTY, timeout=120)
    assert result.returncode == 0, result.stderr
    points = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(points) == 2
    for status, reason, validated in points:
        assert (status, validated) == ("failed", False)
        assert reason.startswith("rank 1: after the timed iterations: allreduce: 1 of ")

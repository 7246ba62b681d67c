"""Hostile node lists and launcher variables fed to the real CLI under a memory limit.

Each gets one line naming the option or variable and the value, exit status 2 and nothing
written, in well under the timeout: a regression that expands ``0-999999999`` again fails
here in seconds, on the memory limit or the timeout, instead of eating the machine.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from hpcmem.node.launcher import GLOBAL_RANK_VARIABLES, LOCAL_RANK_VARIABLES

#: address space of one command: a few times what `hpcmem bind` needs (about 35 MiB resident)
MEMORY_LIMIT = 512 << 20
#: seconds: a refusal takes about 0.2 s
TIMEOUT = 5
HUGE = "0-999999999"
NOT_RANKS = ["²", "٣", "1e3", " 1", "-1", "99999999999999999999"]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _hpcmem(hpcmem_exe: str, *args: str, env: dict[str, str] | None = None):
    cleared = {*LOCAL_RANK_VARIABLES, *GLOBAL_RANK_VARIABLES, "MEMKIND_HBW_NODES"}
    full_env = {name: value for name, value in os.environ.items() if name not in cleared}
    full_env.update(env or {})
    return subprocess.run([hpcmem_exe, *args], capture_output=True, text=True, env=full_env,
                          timeout=TIMEOUT, preexec_fn=_limit_memory)  # fmt: skip


def _refused(result: subprocess.CompletedProcess, command: str, *expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"hpcmem {command}: error: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr


@pytest.mark.parametrize(
    ("binding", "what"),
    [(f"--physcpubind={HUGE}", "CPU"), (f"--cpunodebind={HUGE}", "node"),
     (f"--membind={HUGE}", "node"), (f"--interleave={HUGE}", "node"),
     (f"--preferred={HUGE}", "node"), (f"--cpunodebind=0 --membind=0,{HUGE}", "node")],
)
def test_a_huge_range_is_refused_unexpanded(hpcmem_exe: str, binding: str, what: str) -> None:
    option = binding.rpartition(" ")[2].partition("=")[0]
    value = binding.rpartition("=")[2]
    result = _hpcmem(hpcmem_exe, "bind", "--", binding, "--", "true")
    _refused(result, "bind", f"binding {option}='{value}': {what} ",
             f"does not exist ({what}s here: ")


@pytest.mark.parametrize("value", [HUGE, "0,\n9", "9" * 5000])
def test_a_hostile_hbw_variable_is_refused(hpcmem_exe: str, value: str) -> None:
    result = _hpcmem(hpcmem_exe, "bind", "hbw", "--", "true", env={"MEMKIND_HBW_NODES": value})
    _refused(result, "bind", f"MEMKIND_HBW_NODES={value!r}"[:60])  # long values are clipped


def test_info_reports_a_huge_hbw_variable(hpcmem_exe: str) -> None:
    result = _hpcmem(hpcmem_exe, "info", "--json", env={"MEMKIND_HBW_NODES": HUGE})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hbw"]["error"].startswith(
        f"MEMKIND_HBW_NODES='{HUGE}': node 1 does not exist"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("OMPI_COMM_WORLD_LOCAL_RANK", value) for value in NOT_RANKS]
    + [(name, "²") for name in LOCAL_RANK_VARIABLES[1:]],
)
def test_a_local_rank_that_is_not_a_rank(hpcmem_exe: str, name: str, value: str) -> None:
    result = _hpcmem(hpcmem_exe, "bind", "cores", "--", "true", env={name: value})
    _refused(result, "bind", f"{name}={value!r} is not a rank (accepted: ASCII digits 0-")


@pytest.mark.parametrize("value", ["٣", "-1", "99999999999999999999"])
def test_a_local_rank_option_that_is_not_a_rank(hpcmem_exe: str, value: str) -> None:
    result = _hpcmem(hpcmem_exe, "bind", "--local-rank", value, "cores", "--", "true")
    _refused(result, "bind", f"--local-rank={value!r} is not a rank")


@pytest.mark.parametrize(("name", "value"), [("OMPI_COMM_WORLD_RANK", "abc"), ("PMI_RANK", "²"),
                                             ("SLURM_PROCID", "-1")])
def test_a_global_rank_that_is_not_a_rank(hpcmem_exe: str, tmp_path: Path, name: str,
                                          value: str) -> None:
    output = tmp_path / "r.jsonl"
    result = _hpcmem(hpcmem_exe, "collectives", "--op", "foo", "--output", str(output),
                     env={name: value})  # fmt: skip
    _refused(result, "collectives", f"{name}={value!r} is not a rank")
    assert not output.exists()


def test_collectives_refuse_a_huge_hbw_variable_before_mpi(hpcmem_exe: str,
                                                           tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    result = _hpcmem(hpcmem_exe, "collectives", "--op", "allreduce", "--max-size", "8",
                     "--output", str(output), env={"MEMKIND_HBW_NODES": HUGE})  # fmt: skip
    _refused(result, "collectives", f"MEMKIND_HBW_NODES='{HUGE}': node 1 does not exist")
    assert not output.exists()


@pytest.mark.mpi
def test_collectives_refuse_a_huge_hbw_variable_on_every_rank(mpirun, hpcmem_exe: str,
                                                              tmp_path: Path) -> None:
    output = tmp_path / "r.jsonl"
    result = mpirun(2, hpcmem_exe, "collectives", "--op", "allreduce", "--max-size", "8",
                    "--output", str(output), env={"MEMKIND_HBW_NODES": HUGE}, timeout=60)
    assert result.returncode == 2 and not output.exists()
    assert result.stderr.count(f"hpcmem collectives: error: MEMKIND_HBW_NODES='{HUGE}'") == 1
    assert "Traceback" not in result.stderr and "MPI_ABORT" not in result.stderr

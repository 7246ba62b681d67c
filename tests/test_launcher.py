"""hpcmem.node.launcher: ranks read strictly from the launcher's variables."""

from __future__ import annotations

import pytest

from hpcmem.node.launcher import (
    GLOBAL_RANK_VARIABLES,
    LOCAL_RANK_VARIABLES,
    MAX_RANK,
    RankError,
    global_rank,
    local_rank,
    parse_rank,
)

#: what int() accepts or chokes on, and no launcher writes
NOT_RANKS = ["²", "٣", "1e3", " 1", "1 ", "1\n", "-1", "+1", "", "0x1", "1_0",
             str(MAX_RANK + 1), "99999999999999999999", "9" * 5000]


@pytest.mark.parametrize("text", ["0", "7", "007", str(MAX_RANK)])
def test_ranks_are_ascii_digits(text: str) -> None:
    assert parse_rank(text, name="SLURM_LOCALID") == int(text)


@pytest.mark.parametrize("text", NOT_RANKS)
def test_anything_else_is_refused_naming_the_variable_and_value(text: str) -> None:
    with pytest.raises(RankError) as error:
        parse_rank(text, name="SLURM_LOCALID")
    message = str(error.value)
    assert message.startswith("SLURM_LOCALID=") and "\n" not in message and len(message) < 400
    assert message.endswith(f"is not a rank (accepted: ASCII digits 0-{MAX_RANK})")
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("name", [*LOCAL_RANK_VARIABLES, *GLOBAL_RANK_VARIABLES])
def test_every_launcher_variable_is_read_strictly(name: str) -> None:
    read = local_rank if name in LOCAL_RANK_VARIABLES else global_rank
    assert read({name: "3"}) == 3
    with pytest.raises(RankError, match=f"^{name}='²' is not a rank"):
        read({name: "²"})


def test_the_first_variable_set_wins() -> None:
    assert local_rank({}) is None and global_rank({}) is None
    assert local_rank({"SLURM_LOCALID": "3", "PMIX_RANK": "7"}) == 3
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "SLURM_LOCALID": "x"}) == 1
    assert local_rank({"PMIX_RANK": "5"}) == 5
    assert local_rank({"MV2_COMM_WORLD_LOCAL_RANK": "2", "PMIX_RANK": "6"}) == 2
    assert local_rank({"FLUX_TASK_LOCAL_ID": "1", "PMIX_RANK": "5"}) == 1
    assert global_rank({"OMPI_COMM_WORLD_RANK": "4", "SLURM_PROCID": "2"}) == 4

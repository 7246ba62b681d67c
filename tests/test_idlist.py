"""hpcmem.node.idlist: libnuma CPU and node lists, checked against what exists before expansion."""

from __future__ import annotations

import time

import pytest

from hpcmem.node.idlist import IdListError, format_id_list, parse_id_list

FOUR = range(4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0,)), ("0-3", (0, 1, 2, 3)), ("0,2", (0, 2)), (" 1-3 ", (1, 2, 3)),
     (" 3, 1 ", (1, 3)), ("1,1", (1,)), ("0-2,1-3", (0, 1, 2, 3))],
)
def test_parse_id_list(text: str, expected: tuple[int, ...]) -> None:
    assert parse_id_list(text, name="--membind", existing=FOUR) == expected
    assert parse_id_list(format_id_list(expected), name="--membind", existing=FOUR) == expected


def test_all_is_every_existing_id() -> None:
    assert parse_id_list("all", name="--interleave", existing=[2, 0, 1]) == (0, 1, 2)


def test_ids_between_holes_are_kept_and_holes_refused() -> None:
    existing = [0, 2, 10]
    assert parse_id_list("2,0,10", name="n", existing=existing) == (0, 2, 10)
    with pytest.raises(IdListError, match=r"node 1 does not exist \(nodes here: 0,2,10\)"):
        parse_id_list("0-2", name="n", existing=existing)


@pytest.mark.parametrize("bad", ["", "x", "3-1", "-1", "!0", "0-", "1,,2", "+1", "²", "٣",
                                 "1e3", "0-99999999999"])
def test_malformed_lists_name_the_variable_value_and_forms(bad: str) -> None:
    with pytest.raises(IdListError, match=r"^MEMKIND_HBW_NODES=.*accepted: N, N-M") as error:
        parse_id_list(bad, name="MEMKIND_HBW_NODES", existing=FOUR)
    assert repr(bad) in str(error.value)
    assert isinstance(error.value, ValueError)  # callers that catch ValueError still do


@pytest.mark.parametrize(
    ("text", "missing"),
    [("0-999999999", 4), ("999999999", 999999999), ("3,9999999999", 9999999999),
     ("0-3,5-999999999", 5), (",".join(["0-3"] * 10_000) + ",4", 4)],
)
def test_ranges_beyond_what_exists_are_refused_unexpanded(text: str, missing: int) -> None:
    started = time.monotonic()
    with pytest.raises(IdListError) as error:
        parse_id_list(text, name="--physcpubind", existing=FOUR, what="CPU")
    assert time.monotonic() - started < 0.5
    assert str(error.value).endswith(f": CPU {missing} does not exist (CPUs here: 0-3)")
    assert str(error.value).startswith("--physcpubind='")


def test_a_long_value_is_clipped_in_the_message() -> None:
    text = ",".join(["0"] * 1000) + ",7"
    with pytest.raises(IdListError) as error:
        parse_id_list(text, name="--membind", existing=FOUR)
    assert "more characters)" in str(error.value) and len(str(error.value)) < 400


def test_many_overlapping_ranges_expand_once() -> None:
    started = time.monotonic()
    ids = parse_id_list(",".join(["0-8191"] * 5_000), name="cpulist", existing=range(1 << 16))
    assert ids == tuple(range(8192)) and time.monotonic() - started < 0.5


def test_format_id_list() -> None:
    assert format_id_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_id_list([]) == ""

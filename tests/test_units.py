"""Sizes in binary units and counts in decimal units: one parser each for every command."""

from __future__ import annotations

import pytest

from hpcmem.units import (
    LARGEST,
    UnitError,
    format_count,
    format_size,
    parse_count,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8", 8), ("4K", 4096), ("4k", 4096), ("1M", 1 << 20), ("1MiB", 1 << 20),
     ("2G", 2 << 30), ("40GB", 40 << 30), ("1.5K", 1536), ("1.5T", 3 << 39), (" 64K ", 65536),
     ("0", 0), (123, 123)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-8", "1.3", "0.1K", "4X", "K", "8 bytes", "1e3", -1,
                                  "\u0663K", "\u00b2", "1_000", "9" * 40])
def test_parse_size_rejects_naming_the_forms(text):
    with pytest.raises(UnitError, match=r"is not a size \(accepted: a number with optional K, M"):
        parse_size(text)


@pytest.mark.parametrize("parse", [parse_size, parse_count])
def test_a_number_beyond_int64_is_refused_naming_it(parse):
    assert parse(str(LARGEST)) == LARGEST
    for text in (str(LARGEST + 1), "99999999999T", 1 << 64):
        with pytest.raises(UnitError, match=r"is more than 2\^63 - 1, the largest (size|count)"):
            parse(text)


@pytest.mark.parametrize("text", ["9" * 5000, "1." + "5" * 5000])
def test_a_number_too_long_to_read_is_not_a_size(text):
    with pytest.raises(UnitError, match=r"is not a size") as error:
        parse_size(text)
    assert len(str(error.value)) < 500  # the text is clipped, not repeated in full


def test_positive_size():
    with pytest.raises(UnitError, match=r"^'0' is not a positive size"):
        parse_size("0", positive=True)
    assert parse_size("1", positive=True) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [("125M", 125_000_000), ("1.3B", 1_300_000_000), ("6B", 6 * 10**9), ("2k", 2000),
     ("350", 350), ("1.5G", 1_500_000_000), ("1T", 10**12)],
)
def test_parse_count(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "0", "lots", "1.5", "-3M", "1MiB", "\u0663M",
                                  "9" * 40])
def test_parse_count_rejects_naming_the_forms(text):
    with pytest.raises(UnitError, match=r"is not a positive count \(accepted: a number with"):
        parse_count(text)


def test_errors_are_value_errors():
    assert issubclass(UnitError, ValueError)


def test_format():
    assert [format_size(n) for n in (8, 4096, 1.5 * (1 << 20), 40 << 30, 2 << 40)] == [
        "8 B", "4 KiB", "1.5 MiB", "40 GiB", "2 TiB"]
    assert [format_count(n) for n in (512, 25_557_032, 125e6, 1.3e9)] == [
        "512", "25.6M", "125M", "1.3B"]

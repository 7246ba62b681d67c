"""The vocabulary of input checks (hpcmem/inputs.py): each value refused is one line naming
the field, the value (clipped) and what is accepted; hostile forms are refused fast."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hostile_inputs import ALIAS_BOMB

from hpcmem.errors import BadInputError
from hpcmem.inputs import (
    VALUE_LIMIT,
    InputError,
    decode_text,
    finite_number,
    inside,
    matching,
    refused,
    whole_number,
    yaml_mapping,
)
from hpcmem.textfiles import TextFileError


def test_every_refusal_is_one_bad_input_line() -> None:
    error = refused("--ranks", "x" * 1000, "is not a whole number", "1 to 64")
    assert isinstance(error, BadInputError) and isinstance(error, InputError)
    message = str(error)
    assert "\n" not in message and message.startswith("--ranks: 'xxx")
    assert message.endswith("is not a whole number (accepted: 1 to 64)")
    assert len(message) < VALUE_LIMIT + 100


@pytest.mark.parametrize(("value", "expected"), [
    ("42", 42), (" 7 ", 7), ("+3", 3), ("-2", -2), ("0064", 64), (12, 12),
])  # fmt: skip
def test_whole_number_accepts_ascii_digits(value, expected) -> None:
    assert whole_number(value, "n", minimum=-10, maximum=64) == expected


@pytest.mark.parametrize(("value", "problem"), [
    ("99999999999999999999", "is out of range"), ("65", "is out of range"),
    ("-11", "is out of range"), (10**30, "is out of range"), ("\u00b2", "is not a whole number"),
    ("\u0663", "is not a whole number"), ("1_000", "is not a whole number"),
    ("1.0", "is not a whole number"), ("", "is not a whole number"),
    ("0x10", "is not a whole number"), (True, "is not a whole number"),
    (2.0, "is not a whole number"), (None, "is not a whole number"),
])  # fmt: skip
def test_whole_number_refuses_naming_field_value_and_bounds(value, problem) -> None:
    with pytest.raises(InputError) as raised:
        whole_number(value, "--ranks", minimum=-10, maximum=64)
    assert str(raised.value) == (f"--ranks: {value!r} {problem} (accepted: a whole number "
                                 "from -10 to 64, in ASCII digits)")


def test_whole_number_refuses_a_huge_one_at_once() -> None:
    began = time.monotonic()
    with pytest.raises(InputError, match=r"is out of range"):  # int() would refuse 4300+ digits
        whole_number("9" * 1_000_000, "--ranks", minimum=0, maximum=2**63)
    assert time.monotonic() - began < 1


@pytest.mark.parametrize(("value", "expected"), [
    ("1.5", 1.5), ("-2e3", -2000.0), (".5", 0.5), ("3.", 3.0), (7, 7.0), (0.25, 0.25),
])  # fmt: skip
def test_finite_number_accepts_decimal_text_and_numbers(value, expected) -> None:
    assert finite_number(value, "x") == expected


@pytest.mark.parametrize(("value", "problem"), [
    ("nan", "is not a number"), ("inf", "is not a number"), ("1e999", "is not finite"),
    (float("nan"), "is not finite"), (float("-inf"), "is not finite"),
    (10**400, "is not finite"), ("\u0663.\u0665", "is not a number"), ("1_0", "is not a number"),
    (True, "is not a number"), ("11", "is out of range"), (-1, "is out of range"),
])  # fmt: skip
def test_finite_number_refuses(value, problem) -> None:
    with pytest.raises(InputError) as raised:
        finite_number(value, "threshold", minimum=0, maximum=10)
    assert str(raised.value).startswith("threshold: ")
    assert str(raised.value).endswith(f"{problem} (accepted: a finite number from 0 to 10, "
                                      "in ASCII digits)")


def test_matching_returns_the_match_or_names_what_is_accepted() -> None:
    assert matching("1-02:00:00", r"([0-9]+)-(.*)", "MaxTime", what="a time",
                    accepted="D-HH:MM:SS").groups() == ("1", "02:00:00")
    for value in ("abc", "1-02:00:00\n", 42, None):
        with pytest.raises(InputError) as raised:
            matching(value, r"([0-9]+)-(.*)", "`scontrol` MaxTime", what="a time limit",
                     accepted="D-HH:MM:SS")
        assert str(raised.value) == (f"`scontrol` MaxTime: {value!r} is not a time limit "
                                     "(accepted: D-HH:MM:SS)")


def test_inside_confines_a_path_to_its_root(tmp_path: Path) -> None:
    (tmp_path / "root" / "results").mkdir(parents=True)
    root = tmp_path / "root"
    assert inside("results/run1", root, "output_dir") == root / "results" / "run1"
    assert inside("./a/./b", root, "output_dir") == root / "a" / "b"
    for value, problem in (("../escape", f"leaves {root} ('..')"),
                           ("a/../../b", f"leaves {root} ('..')"),
                           ("/etc", "is an absolute path"), ("", "is not a path"),
                           ("a\0b", "is not a path")):
        with pytest.raises(InputError) as raised:
            inside(value, root, "HPCMEM_OUTPUT_DIR")
        assert str(raised.value) == (f"HPCMEM_OUTPUT_DIR: {value!r} {problem} (accepted: a "
                                     f"relative path inside {root}, without '..', through no "
                                     "symbolic link out of it)")


def test_inside_follows_links_out_only_when_allowed(tmp_path: Path) -> None:
    root, store = tmp_path / "root", tmp_path / "store"
    root.mkdir()
    store.mkdir()
    (root / "history").symlink_to(store)
    (root / "here").symlink_to(root / "history" / ".." / "root")  # leaves, and comes back
    with pytest.raises(InputError, match=rf"'history/db' leads out of {root} \(a symbolic "
                                         rf"link to {store}/db\)"):
        inside("history/db", root, "check.history")
    assert inside("history/db", root, "check.history", links_may_leave=True) == \
        root / "history" / "db"
    assert inside("here/x", root, "output_dir") == root / "here" / "x"


@pytest.mark.parametrize(("data", "message"), [
    (b"run_id: caf\xe9\n", r"^out: not UTF-8 text \(byte 0xe9 at offset 11\): "
                           r"near b'run_id: caf\\xe9'$"),
    (b"one\n" + b"x" * 100 + b"\xff\xfe" + b"y" * 100 + b"\n",
     r"^out: not UTF-8 text \(byte 0xff at offset 104\): near b'x{24}\\xff\\xfey{23}'$"),
    (b"\x7fELF\x02\x01\x01\x00", r"^out: not a text file \(NUL byte at offset 7\): near b'"),
])  # fmt: skip
def test_text_must_be_utf8_and_the_error_shows_what_was_there(data, message) -> None:
    with pytest.raises(TextFileError, match=message):
        decode_text(data, "out")
    assert decode_text("naïve\n".encode(), "out") == "naïve\n"


@pytest.mark.parametrize(("text", "held"), [
    ("- executor\n- slurm\n", "a YAML list"), ("just words\n", "a YAML string"),
    ("", "nothing"), ("42\n", "a YAML number"),
])  # fmt: skip
def test_yaml_mapping_names_the_file_and_what_it_holds(tmp_path: Path, text, held) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(TextFileError) as raised:
        yaml_mapping(path)
    assert str(raised.value) == (f"{path}: holds {held}, not a mapping of settings "
                                 "(key: value lines)")


def test_yaml_mapping_refuses_an_alias_bomb_at_once(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(ALIAS_BOMB)
    began = time.monotonic()
    with pytest.raises(TextFileError) as raised:
        yaml_mapping(path)
    assert time.monotonic() - began < 1
    assert str(raised.value) == f"{path}:2: not valid YAML (aliases (*name) are not accepted)"
    path.write_text("executor: slurm\njobs: 4\n")
    assert yaml_mapping(path) == {"executor": "slurm", "jobs": 4}

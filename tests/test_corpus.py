"""The bad-input corpus (tests/corpus/*/case.yaml): each case's exit code and one-line error."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml

from hpcmem.cli import main

CORPUS = Path(__file__).parent / "corpus"
RECORDS = Path(__file__).parent / "fixtures" / "records"
CASES = sorted(path.parent.name for path in CORPUS.glob("*/case.yaml"))
#: the longest error line a case may print (messages clip offending values), its paths
#: inside the case's folder counted as ``<tmp>`` (their length is the machine's)
LONGEST_LINE = 400


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("summary")
    assert main(["aggregate", str(RECORDS / "collectives"), "--out", str(out)]) == 0
    return out


def _placeholders(case: Path, tmp_path: Path, aggregated: Path) -> dict[str, str]:
    copy = shutil.copytree(case, tmp_path / "case")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (scratch / "a-file").write_text("a plain file\n")
    summary = shutil.copytree(aggregated, tmp_path / "summary")
    return {"case": str(copy), "tmp": str(scratch), "file": str(scratch / "a-file"),
            "summary": str(summary), "records": str(RECORDS)}


def test_corpus_is_not_empty() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", CASES)
def test_case(name: str, tmp_path: Path, aggregated: Path,
              capsys: pytest.CaptureFixture[str]) -> None:
    case = CORPUS / name
    spec = yaml.safe_load((case / "case.yaml").read_text())
    places = _placeholders(case, tmp_path, aggregated)
    argv = [arg.format(**places) for arg in spec["argv"]]
    started = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == spec["exit"], f"{argv}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    errors = err.splitlines()
    shown = [line.replace(str(tmp_path), "<tmp>") for line in errors]
    assert "Traceback" not in err and all(len(line) <= LONGEST_LINE for line in shown), err
    if spec["exit"] == 2:
        assert len(errors) == 1, err[-2000:]
    assert spec["message"].format(**places) in errors[0] if spec["exit"] == 2 else out + err, \
        (out[-2000:], err[-2000:])
    if "file_contains" in spec:
        path, fragment = (text.format(**places) for text in spec["file_contains"])
        assert fragment in Path(path).read_text(), Path(path).read_text()[-2000:]
    for path in spec.get("absent", []):
        assert not Path(path.format(**places)).exists(), path
    assert elapsed < 20, f"took {elapsed:.0f} s"

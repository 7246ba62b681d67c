"""``hpcmem train``: help, every bad option, the no-GPU paths, and a real end-to-end CPU run."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from hpcmem.cli import main
from hpcmem.record.jsonl import read_records
from hpcmem.results.schema import validate_record
from hpcmem.train.models import TransformerShape

torch = pytest.importorskip("torch")

#: A transformer small enough to train a few steps on this machine's CPU in about a second.
TINY = ["--device", "cpu", "--policy", "cuda", "--params", "1M", "--vocab", "256",
        "--seq-len", "32", "--batch", "2", "--steps", "2", "--warmup", "1"]

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU paths")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["train", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_documents_every_option_with_units_and_defaults(hpcmem_exe: str) -> None:
    out = subprocess.run(
        [hpcmem_exe, "train", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout
    for option in ("--model", "--params", "--batch", "--seq-len", "--vocab", "--image-size",
                   "--dtype", "--policy", "--gpu-budget", "--oversubscribe",
                   "--allow-oversubscription", "--steps", "--warmup", "--seed", "--device",
                   "--output", "--skip-if-no-gpu"):
        assert option in out, option
    for text in ("125M, 1.3B, 6B", "40G", "default: 2048", "default: 20", "default: 3",
                 "default: hpcmem", "cuda, um, hpcmem", "above 0.9 is refused before any "
                 "allocation", "HPCMEM_ALLOW_OVERSUBSCRIPTION=1", "for tests", "Exit status"):
        assert text in " ".join(out.split()), text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "rnn"], "--model: 'rnn' is not one of transformer, cnn"),
        (["--params", "lots"], "--params: 'lots' is not a positive count (accepted: a number "
                               "with optional K, M, B or T, e.g. 125M, 1.3B, 6B)"),
        (["--params", "0"], "--params: '0' is not a positive count"),
        (["--dtype", "fp16"], "--dtype: 'fp16' is not one of bf16, fp32"),
        (["--policy", "fast"], "'fast': not one of cuda, hpcmem, um, or a policy YAML file"),
        (["--gpu-budget", "lots"], "--gpu-budget: 'lots' is not a size (accepted: a number"),
        (["--gpu-budget", "0"], "--gpu-budget: '0' is not a positive size"),
        (["--policy", "cuda", "--gpu-budget", "40G"],
         "--gpu-budget: needs a Unified Memory policy (um, hpcmem or a managed YAML file); "
         "'cuda' is PyTorch's own allocator"),
        (["--batch", "0"], "--batch: 0 is not an integer >= 1"),
        (["--steps", "0"], "--steps: 0 is not an integer >= 1"),
        (["--warmup", "-1"], "--warmup: -1 is not an integer >= 0"),
        (["--seed", "-3"], "--seed: -3 is not an integer >= 0"),
        (["--seq-len", "0"], "--seq-len: 0 is not an integer >= 1"),
        (["--vocab", "1"], "--vocab: 1 is not an integer >= 2"),
        (["--model", "cnn", "--image-size", "16"], "--image-size: 16 is not an integer >= 32"),
        (["--model", "cnn", "--seq-len", "512"],
         "--seq-len: applies to --model transformer only, not cnn"),
        (["--image-size", "64"], "--image-size: applies to --model cnn only, not transformer"),
        (["--device", "tpu"], "--device: 'tpu' is not one of cuda, cuda:N, cpu"),
        (["--device", "cpu", "--policy", "um"],
         "--policy: 'um' needs a CUDA device; --device cpu (for tests) runs only with "
         "--policy cuda"),
        (["--params", "1B", "--oversubscribe", "0.5"],
         "--params and --oversubscribe: give one of them, not both"),
        (["--oversubscribe", "-1"], "--oversubscribe: -1.0 is not a positive ratio"),
        (["--oversubscribe", "nan"], "--oversubscribe: nan is not a positive ratio"),
        (["--device", "cpu", "--policy", "cuda", "--oversubscribe", "0.5"],
         "--oversubscribe: sizing to free GPU memory needs a CUDA --device"),
        (["--params", "1M", "--skip-if-no-gpu"],
         "--params: 1,000,000 is out of reach for the transformer: the nearest shape has "
         "3,400,640 parameters (the embeddings of --vocab 50304 alone need 3,219,456; "
         "accepted: a count the model can come within 10% of)"),
        (["--delayed-update"],
         "--delayed-update: applies under --gpu-budget only (it delays the host optimizer's "
         "update); give a --gpu-budget or leave it out"),
        (["--state-dtype", "bfloat16"],
         "--state-dtype: bfloat16 applies under --gpu-budget only (the moments' host "
         "homes); give a --gpu-budget or leave it out"),
        (["--state-dtype", "fp8", "--gpu-budget", "8G"],
         "--state-dtype: 'fp8' is not one of float32, bfloat16"),
        (["--model", "cnn", "--params", "50K"],
         "--params: 50,000 is out of reach for the cnn: the nearest shape has 224,492 "
         "parameters (the smallest CNN (width 4) has 224,492"),
    ],
)
def test_bad_values_get_one_line_naming_option_value_and_accepted(
    capsys: pytest.CaptureFixture[str], tmp_path, argv: list[str], message: str
) -> None:
    output = tmp_path / "r.jsonl"
    code, _out, err = _run(capsys, *argv, "--output", str(output))
    assert code == 2
    assert err.startswith("hpcmem train: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not output.exists() and list(tmp_path.iterdir()) == []


def test_bad_policy_file_names_the_field(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    policy = tmp_path / "mine.yaml"
    policy.write_text("name: mine\nparams: {preferred_location: moon}\n")
    code, _out, err = _run(capsys, "--policy", str(policy))
    assert code == 2
    assert "--policy: policy.params.preferred_location: 'moon' is not one of gpu, cpu, none" in err


def test_bad_allow_environment_value_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCMEM_ALLOW_OVERSUBSCRIPTION", "yes")
    code, _out, err = _run(capsys, *TINY)
    assert code == 2
    assert "HPCMEM_ALLOW_OVERSUBSCRIPTION: 'yes' is not one of 0, 1" in err


def test_oversubscribe_above_0_9_is_refused_before_torch_is_even_imported(tmp_path) -> None:
    script = (
        "import sys\n"
        "import hpcmem.train\n"
        "from hpcmem.cli import main\n"
        "code = main(['train', '--oversubscribe', '2', '--output', sys.argv[1]])\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    output = tmp_path / "r.jsonl"
    env = {"PATH": "/usr/bin:/bin", "HPCMEM_ALLOW_OVERSUBSCRIPTION": "0"}
    done = subprocess.run([sys.executable, "-c", script, str(output)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 2
    assert "torch imported: False" in done.stdout
    assert "--oversubscribe: 2 x free GPU memory is above the 0.9 limit and was refused " \
           "before any allocation" in done.stderr
    assert "--allow-oversubscription" in done.stderr
    assert not output.exists()


@needs_no_gpu
def test_without_a_gpu_the_command_fails_clearly(capsys, tmp_path) -> None:
    output = tmp_path / "r.jsonl"
    code, _out, err = _run(capsys, "--params", "125M", "--output", str(output))
    assert code == 1
    assert "no CUDA GPU on" in err and "--skip-if-no-gpu" in err
    assert not output.exists()


@needs_no_gpu
@pytest.mark.parametrize("extra", [[], ["--oversubscribe", "0.5"], ["--model", "cnn"]])
def test_skip_if_no_gpu_writes_a_valid_skipped_record(capsys, tmp_path, extra) -> None:
    output = tmp_path / "r.jsonl"
    code, out, _err = _run(capsys, "--policy", "hpcmem", "--skip-if-no-gpu",
                           "--output", str(output), *extra)
    assert code == 0
    assert "skipped: no CUDA GPU" in out
    [record] = read_records(output)
    assert validate_record(record) == []
    assert record["status"] == "skipped" and record["benchmark"] == "train"
    assert record["reason"].startswith("no CUDA GPU on ")
    assert record["policy"]["name"] == "hpcmem" and record["policy"]["allocator"] == "managed"
    assert record["policy"]["inputs"]["preferred_location"] == "cpu"  # the full per-type table
    assert record["model"] == (extra[1] if extra[:1] == ["--model"] else "transformer")


def _train(capsys, tmp_path, *extra: str) -> dict:
    output = tmp_path / "r.jsonl"
    code, out, _err = _run(capsys, *TINY, "--output", str(output), *extra)
    assert code == 0, out
    assert out.startswith("hpcmem train: transformer") or out.startswith("hpcmem train: cnn")
    [record] = read_records(output)
    assert validate_record(record) == []
    return record


def test_cpu_run_end_to_end_writes_a_complete_valid_record(capsys, tmp_path) -> None:
    record = _train(capsys, tmp_path)
    assert record["status"] == "ok" and record["device"] == "cpu" and record["gpu"] == "none"
    assert record["params"] == TransformerShape(**record["shape"]).param_count()
    assert abs(record["params"] / 1e6 - 1) <= 0.10
    assert record["policy"]["name"] == "cuda" and record["policy"]["allocator"] == "cuda"
    assert len(record["step_ms_all"]) == 3 and record["first_step_ms"] == record["step_ms_all"][0]
    step = record["step_ms"]
    assert 0 < step["p10"] <= step["median"] <= step["p90"]
    assert record["throughput_unit"] == "tokens/s"
    assert math.isclose(record["throughput"], 2 * 32 / (step["median"] / 1e3))
    losses = record["losses"]["first"] + record["losses"]["last"]
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(256)) < 1.0  # random init: about ln(vocab)
    assert record["torch"] == torch.__version__ and record["dtype"] == "bf16"
    assert list(tmp_path.iterdir()) == [tmp_path / "r.jsonl"]  # no temporary left behind


def test_same_seed_same_losses_other_seed_other_losses(capsys, tmp_path) -> None:
    runs = [_train(capsys, tmp_path, "--dtype", "fp32", "--steps", "1", "--seed", seed)["losses"]
            for seed in ("1", "1", "2")]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_cnn_trains_on_cpu_and_counts_images(capsys, tmp_path) -> None:
    output = tmp_path / "cnn.jsonl"
    code, out, _err = _run(capsys, "--model", "cnn", "--device", "cpu", "--policy", "cuda",
                           "--params", "230K", "--image-size", "32", "--batch", "2",
                           "--steps", "2", "--warmup", "0", "--output", str(output))
    assert code == 0, out
    [record] = read_records(output)
    assert validate_record(record) == []
    assert record["throughput_unit"] == "images/s" and record["seq_len"] is None
    assert record["shape"]["image_size"] == 32 and record["dtype"] == "fp32"
    assert json.loads(output.read_text()) == record

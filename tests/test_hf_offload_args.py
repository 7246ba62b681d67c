"""benchmarks/gpu/hf_offload.py refuses settings it cannot run before it imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "hf_offload.py"


@pytest.mark.parametrize("variant", ["deepspeed", "deepspeed3", "fsdp2"])
def test_fp32_with_a_bf16_only_variant_is_refused_naming_both(variant: str,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "hf.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--variant", variant, "--dtype", "fp32",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert (f"error: --dtype fp32 runs with the variants cuda and hpcmem, not {variant}"
            in done.stderr.splitlines()[-1])
    assert not out.exists()  # nothing written


def _script():
    """hf_offload.py as a module (it is a script, not a package's): torch stays unimported."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_offload_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refused(tmp_path: Path, *args: str) -> str:
    out = tmp_path / "hf.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert not out.exists()  # nothing written
    return done.stderr.splitlines()[-1]


def test_zenflow_with_accumulation_is_refused_naming_its_update_interval(tmp_path: Path) -> None:
    last = _refused(tmp_path, "--variant", "zenflow", "--accumulate", "8")
    assert last.endswith("error: --accumulate runs with zenflow at 1 only: DeepSpeed takes "
                         "ZenFlow's gradient accumulation from its update_interval (4)")


@pytest.mark.parametrize(("args", "said"), [
    (("--variant", "deepspeed", "--zenflow-pt-cores", "0.25"),
     "error: --zenflow-pt-cores runs with the variant zenflow, not deepspeed"),
    (("--variant", "zenflow", "--zenflow-pt-cores", "1"),
     "error: --zenflow-pt-cores 1: a share above 0 and below 1 is accepted"),
    (("--variant", "zenflow", "--zenflow-pt-cores", "0"),
     "error: --zenflow-pt-cores 0: a share above 0 and below 1 is accepted"),
])
def test_zenflow_core_share_is_checked(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    assert _refused(tmp_path, *args).endswith(said)


def test_zenflow_config_is_the_tutorials_on_zero_offload() -> None:
    script = _script()
    args = script._args(["--variant", "zenflow", "--out", "unused.jsonl"])
    zero = script.zero_config(args)
    assert zero == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                    "zenflow": {"topk_ratio": 0.05, "select_strategy": "auto",
                                "select_interval": "auto", "update_interval": 4,
                                "full_warm_up_rounds": 0, "overlap_step": True}}
    # the one ZeRO-Offload runs differs only by ZenFlow's block and the comm settings it keeps
    plain = script.zero_config(script._args(["--variant", "deepspeed", "--out", "unused.jsonl"]))
    assert plain["stage"] == zero["stage"]
    assert plain["offload_optimizer"] == zero["offload_optimizer"]
    assert "zenflow" not in plain


def test_zenflow_core_share_lands_in_its_config_and_nowhere_else() -> None:
    script = _script()
    args = script._args(["--variant", "zenflow", "--zenflow-pt-cores", "0.25",
                         "--out", "unused.jsonl"])
    assert script.zero_config(args)["zenflow"]["pt_reserved_cores_perc"] == 0.25
    assert "pt_reserved_cores_perc" not in script.ZERO["zenflow"]["zenflow"]  # a copy changed
    assert "pt_reserved_cores_perc" not in script.ZENFLOW


def test_zenflow_config_passes_deepspeeds_own_checks() -> None:
    """Where DeepSpeed is installed (the GPU machine), its ZenFlow model accepts ours."""
    config = pytest.importorskip("deepspeed.runtime.zenflow.zenflow_config")
    script = _script()
    checked = config.ZenFlowConfig(**script.ZENFLOW)
    assert checked.topk_ratio == 0.05 and checked.update_interval == 4 and checked.overlap_step


@pytest.mark.parametrize(("accumulate", "offloaded"), [(1, True), (2, False), (8, False)])
def test_torchao_offloads_gradients_unless_they_accumulate(accumulate: int,
                                                           offloaded: bool) -> None:
    assert _script().torchao_settings(accumulate) == {"fused": True,
                                                      "offload_gradients": offloaded}


@pytest.mark.parametrize("variant", ["zenflow", "torchao"])
def test_peers_are_run_by_name_and_checkpoint_by_default(variant: str) -> None:
    script = _script()
    args = script._args(["--variant", variant, "--model", "llama-0.9b", "--out", "x.jsonl"])
    assert args.variant == variant and args.checkpointing is None
    assert variant in script.CHECKPOINTED
    assert script.refused(args) is None


def test_a_variant_without_a_runner_is_refused_saying_why(tmp_path: Path) -> None:
    last = _refused(tmp_path, "--variant", "megatrain", "--model", "llama-0.9b")
    assert "error: --variant megatrain: MegaTrain replaces the model and the training loop" in last
    assert last.endswith("it is not run by this script")


def test_every_variant_but_those_refused_has_a_runner() -> None:
    script = _script()
    runners = {"cuda", "hpcmem", "fsdp2", "torchao", *script.ZERO}
    assert set(script.VARIANTS) - set(script.NOT_RUN) == runners


def test_torchao_refuses_fp32_like_the_other_peers(tmp_path: Path) -> None:
    last = _refused(tmp_path, "--variant", "torchao", "--dtype", "fp32")
    assert last.endswith("error: --dtype fp32 runs with the variants cuda and hpcmem, not torchao")

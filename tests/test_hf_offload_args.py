"""benchmarks/gpu/hf_offload.py refuses settings it cannot run before it imports torch."""

from __future__ import annotations

import os
import re
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
    (("--variant", "hpcmem"), "error: --variant hpcmem needs --budget-gib or --budget-from"),
    (("--variant", "deepspeed", "--zenflow-pt-cores", "0.25"),
     "error: --zenflow-pt-cores runs with the variant zenflow, not deepspeed"),
    (("--variant", "zenflow", "--zenflow-pt-cores", "1"),
     "error: --zenflow-pt-cores 1: a share above 0 and below 1 is accepted"),
    (("--variant", "zenflow", "--zenflow-pt-cores", "0"),
     "error: --zenflow-pt-cores 0: a share above 0 and below 1 is accepted"),
    (("--variant", "zenflow", "--strategy", "streamed", "--state-dtype", "bfloat16"),
     "error: --strategy runs with the variant hpcmem, not zenflow"),
    (("--variant", "torchao", "--state-dtype", "bfloat16"),
     "error: --state-dtype runs with the variant hpcmem, not torchao"),
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


def test_every_variant_has_a_runner() -> None:
    script = _script()
    runners = {"cuda", "hpcmem", "fsdp2", "torchao", "megatrain", *script.ZERO}
    assert set(script.VARIANTS) == runners


def test_megatrain_is_accepted_and_recomputes_on_its_own() -> None:
    script = _script()
    args = script._args(["--variant", "megatrain", "--model", "qwen2-0.5b", "--accumulate",
                         "4", "--out", "x.jsonl"])
    assert args.variant == "megatrain" and args.checkpointing is None
    assert "megatrain" not in script.CHECKPOINTED
    assert script.refused(args) is None


def test_megatrain_refuses_hugging_face_checkpointing(tmp_path: Path) -> None:
    last = _refused(tmp_path, "--variant", "megatrain", "--checkpointing")
    assert last.endswith("error: --checkpointing runs without megatrain: MegaTrain recomputes "
                         "the layers itself (every checkpoint_interval layers); "
                         "--no-checkpointing or none is accepted")


def test_megatrain_refuses_the_launchers_ranks(tmp_path: Path) -> None:
    ranks = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "29500"}
    out = tmp_path / "hf.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--variant", "megatrain",
                           "--world-size", "2", "--out", str(out)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **ranks})
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.splitlines()[-1].endswith(
        "error: --variant megatrain runs one process, not 2 ranks: MegaTrain's data "
        "parallelism is its own (GPU workers spawned by one process), not the launcher's "
        "ranks; --world-size 1 or none is accepted")


def _megatrain_runner():
    _script()  # puts benchmarks/gpu on sys.path
    import hf_megatrain

    return hf_megatrain


def test_megatrain_without_its_sources_fails_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runner = _megatrain_runner()
    args = _script()._args(["--variant", "megatrain", "--out", "x.jsonl"])
    monkeypatch.delenv("HPCMEM_MEGATRAIN_DIR", raising=False)
    with pytest.raises(RuntimeError, match=r"^megatrain needs HPCMEM_MEGATRAIN_DIR, "):
        runner.run_megatrain(args, None)
    monkeypatch.setenv("HPCMEM_MEGATRAIN_DIR", str(tmp_path))
    said = rf"^HPCMEM_MEGATRAIN_DIR={re.escape(str(tmp_path))}: no MegaTrain there"
    with pytest.raises(RuntimeError, match=said):
        runner.run_megatrain(args, None)


TARBALL = Path(__file__).resolve().parents[1] / ".dist" / "megatrain.tar.gz"


@pytest.fixture(scope="module")
def megatrain(tmp_path_factory: pytest.TempPathFactory):
    """MegaTrain's package imported from its unpacked tarball (skipped where it is absent)."""
    if not TARBALL.is_file():
        pytest.skip(f"{TARBALL.name} is absent (see benchmarks/gpu/run.sh)")
    import tarfile

    import transformers  # noqa: F401  (imported here, once, not in the first test's time)

    folder = tmp_path_factory.mktemp("megatrain")
    with tarfile.open(TARBALL) as tar:
        tar.extractall(folder, members=[m for m in tar.getmembers()
                                        if m.name.startswith("infinity/")], filter="data")
    return _megatrain_runner().import_megatrain({"HPCMEM_MEGATRAIN_DIR": str(folder)})


@pytest.mark.parametrize(("kind", "fields", "missing"), [
    ("Qwen2Config", {"num_key_value_heads": 2, "tie_word_embeddings": True}, []),
    ("LlamaConfig", {"num_key_value_heads": 2}, []),
    ("PhiConfig", {"partial_rotary_factor": 0.4},
     ["model.final_layernorm.weight", "model.final_layernorm.bias"]),
])
def test_megatrain_finds_every_parameter_but_where_it_cannot(
        megatrain, kind: str, fields: dict, missing: list[str]) -> None:
    """MegaTrain's own discovery of a tiny model's parts (on the host, as its CPUMasterModel
    starts): what it would train leaves Phi-2's final norm out, and the runner says so."""
    import transformers

    config = getattr(transformers, kind)(hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         vocab_size=128, use_cache=False, **fields)
    model = transformers.AutoModelForCausalLM.from_config(config)
    parts = megatrain.model.cpu_master._discover_model_components(model)
    wrapper = object.__new__(megatrain.CPUMasterModel)  # its parts, without its GPU buffers
    wrapper.is_vlm, wrapper.vision_encoder, wrapper.projector = False, None, None
    wrapper.embedding, wrapper.cpu_layers = parts["embedding"], parts["layers"]
    wrapper.norm, wrapper.lm_head = parts["norm"], parts["lm_head"]
    assert _megatrain_runner().left_out(model, wrapper.get_parameters()) == missing


def test_torchao_refuses_fp32_like_the_other_peers(tmp_path: Path) -> None:
    last = _refused(tmp_path, "--variant", "torchao", "--dtype", "fp32")
    assert last.endswith("error: --dtype fp32 runs with the variants cuda and hpcmem, not torchao")


def test_a_loss_that_is_not_finite_fails_the_record_naming_the_step() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from hf_steps import finite_losses
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert finite_losses({"losses": [11.2, 11.1], "status": "ok"}) == {}
    assert finite_losses({"losses": [11.2, float("nan"), float("inf")]}) == {
        "status": "failed", "losses": [11.2],
        "reason": "the loss was not finite (NaN or inf) from step 2 of 3: it did not train"}


@pytest.mark.parametrize(("strategy", "kind"), [
    (None, "Offload"), ("streamed", "StreamedOffload"), ("host_optimizer", "HostOptimizerOffload"),
])
def test_strategy_names_the_offload_value(strategy: str | None, kind: str) -> None:
    script = _script()
    named = ["--strategy", strategy] if strategy else []
    args = script._args(["--variant", "hpcmem", "--budget-gib", "24", "--state-dtype",
                         "bfloat16", *named, "--out", "unused.jsonl"])
    from hf_runners import hpcmem_offload  # on sys.path with the script

    offload = hpcmem_offload(args)
    assert type(offload).__name__ == kind
    assert offload.to_record()["strategy"] == strategy
    assert offload.state_dtype == "bfloat16"

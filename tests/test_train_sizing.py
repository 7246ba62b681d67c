"""Footprint arithmetic, sizing to a memory target, and the oversubscription refusal."""

from __future__ import annotations

import pytest

from hpcmem.train.models import CNNShape, TransformerShape
from hpcmem.train.sizing import (
    OversubscriptionRefusedError,
    check_oversubscribe,
    footprint,
    size_for_footprint,
)

GIB = 2**30


def test_footprint_is_16_bytes_per_parameter_in_fp32_plus_activations() -> None:
    shape = TransformerShape(n_layers=2, d_model=128, n_heads=2, seq_len=64, vocab=256)
    count = shape.param_count()
    fp = footprint(shape, batch=4, dtype="fp32")
    assert (fp.params, fp.grads, fp.optimizer) == (4 * count, 4 * count, 8 * count)
    assert fp.activations == shape.activation_bytes(4, 4)
    assert fp.total == 16 * count + fp.activations
    assert fp.to_record()["total"] == fp.total


def test_bf16_keeps_fp32_master_weights_and_adds_autocast_copies() -> None:
    shape = CNNShape(width=16, image_size=64)
    count = shape.param_count()
    fp32, bf16 = footprint(shape, 8, "fp32"), footprint(shape, 8, "bf16")
    assert bf16.params == 6 * count and bf16.grads == 4 * count and bf16.optimizer == 8 * count
    assert bf16.activations * 2 == fp32.activations


@pytest.mark.parametrize("model", ["transformer", "cnn"])
@pytest.mark.parametrize("target_gib", [8, 60, 126])
def test_size_for_footprint_fills_the_target_without_exceeding_it(model: str, target_gib) -> None:
    target = target_gib * GIB
    batch = 4 if model == "transformer" else 32
    shape = size_for_footprint(
        model, target, batch=batch, dtype="bf16", seq_len=2048, vocab=50304, image_size=224
    )
    total = footprint(shape, batch, "bf16").total
    assert total <= target
    assert total >= 0.85 * target  # close to the target, not merely under it


def test_an_h200_at_ratio_0_9_gets_a_multi_billion_parameter_transformer() -> None:
    free = 139 * GIB
    shape = size_for_footprint(
        "transformer", int(0.9 * free), batch=1, dtype="bf16", seq_len=2048, vocab=50304,
        image_size=0,
    )
    assert 4e9 < shape.param_count() < 8e9  # ~18 bytes/param + activations of 2K tokens
    assert isinstance(shape, TransformerShape)


def test_size_for_footprint_says_when_the_batch_alone_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"--oversubscribe: no transformer fits .* lower --batch"):
        size_for_footprint(
            "transformer", GIB, batch=64, dtype="fp32", seq_len=8192, vocab=50304, image_size=0
        )


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_ratios_up_to_0_9_pass(ratio: float) -> None:
    check_oversubscribe(ratio, allowed=False)


@pytest.mark.parametrize("ratio", [0.91, 2.0, 10.0])
def test_ratios_above_0_9_are_refused_unless_allowed(ratio: float) -> None:
    with pytest.raises(OversubscriptionRefusedError, match=r"refused before any allocation.*"
                       r"--allow-oversubscription.*HPCMEM_ALLOW_OVERSUBSCRIPTION=1"):
        check_oversubscribe(ratio, allowed=False)
    check_oversubscribe(ratio, allowed=True)


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("nan"), float("inf")])
def test_nonsense_ratios_are_rejected_even_when_allowed(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"--oversubscribe: .* is not a positive number"):
        check_oversubscribe(ratio, allowed=True)

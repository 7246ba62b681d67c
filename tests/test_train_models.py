"""Model shapes: parameter counts against real (meta-device) modules, CPU forward, estimates."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpcmem.train.data import synthetic_data  # noqa: E402
from hpcmem.train.models import (  # noqa: E402
    CNNShape,
    TransformerShape,
    cnn_shape,
    transformer_shape,
)
from hpcmem.train.networks import build  # noqa: E402


def _meta_count(shape: TransformerShape | CNNShape) -> int:
    with torch.device("meta"):
        model = build(shape)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "target", [125e6, 350e6, 1.3e9, 2.7e9, 6e9, 13e9], ids=lambda t: f"{t / 1e9:g}B"
)
def test_transformer_actual_count_within_10_percent_of_params(target: float) -> None:
    shape = transformer_shape(int(target), seq_len=2048)
    actual = _meta_count(shape)
    assert actual == shape.param_count()
    assert abs(actual / target - 1) <= 0.10
    assert shape.d_model % shape.n_heads == 0
    assert shape.d_model // shape.n_heads in (64, 128)


def test_transformer_tens_of_billions_counted_without_allocating() -> None:
    shape = transformer_shape(70_000_000_000, seq_len=4096)
    assert abs(shape.param_count() / 70e9 - 1) <= 0.10
    assert shape.n_layers > 40  # a deep model, not one enormous layer


def test_transformer_shapes_grow_with_the_target() -> None:
    small, large = transformer_shape(125_000_000, 2048), transformer_shape(6_000_000_000, 2048)
    assert large.n_layers > small.n_layers and large.d_model > small.d_model


def test_resnet50_count_matches_the_reference_architecture() -> None:
    shape = cnn_shape(None, image_size=224)
    # ResNet-50 (He et al. 2016) with 1000 classes has 25,557,032 parameters.
    assert shape.param_count() == _meta_count(shape) == 25_557_032


def test_cnn_width_follows_params() -> None:
    shape = cnn_shape(100_000_000, image_size=224)
    assert shape.param_count() == _meta_count(shape)
    assert abs(shape.param_count() / 100e6 - 1) <= 0.10


def test_bad_targets_are_rejected() -> None:
    with pytest.raises(ValueError, match="params 0 must be positive"):
        transformer_shape(0, 128)
    with pytest.raises(ValueError, match="params -5 must be positive"):
        cnn_shape(-5, 64)


def _batch(model: str, shape: TransformerShape | CNNShape, batch: int) -> dict:
    data = synthetic_data(
        model,
        batch=batch,
        seq_len=getattr(shape, "seq_len", 0),
        vocab=getattr(shape, "vocab", 0),
        image_size=getattr(shape, "image_size", 0),
        classes=1000,
        seed=0,
    )
    out = {f.name: torch.empty(f.shape, dtype=getattr(torch, f.dtype)) for f in data.fields()}
    data.fill(out)
    return out


def test_cnn_forward_and_backward_on_cpu_at_tiny_size() -> None:
    torch.manual_seed(0)
    shape = CNNShape(width=8, image_size=32)
    model = build(shape)
    loss = model(_batch("cnn", shape, 2))
    assert loss.shape == () and torch.isfinite(loss)
    # Random init over 1000 classes: the loss starts near ln(1000) = 6.9.
    assert 4.0 < loss.item() < 12.0
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_transformer_forward_is_causal() -> None:
    torch.manual_seed(0)
    shape = TransformerShape(n_layers=2, d_model=64, n_heads=1, seq_len=16, vocab=97)
    model = build(shape).eval()
    tokens = torch.randint(97, (1, 17))
    captured = []
    model.ln_f.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
    model({"tokens": tokens})
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 97
    model({"tokens": changed})
    before, after = captured
    assert torch.equal(before[0, :10], after[0, :10])  # the past ignores the future
    assert not torch.equal(before[0, 10:], after[0, 10:])


def _saved_activation_bytes(model: torch.nn.Module, batch: dict) -> int:
    """Bytes of the distinct non-parameter storages autograd saves during forward."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(batch)
    return sum(saved.values())


@pytest.mark.parametrize(
    "model,shape",
    [
        ("transformer", TransformerShape(n_layers=3, d_model=128, n_heads=2, seq_len=64,
                                         vocab=300)),
        ("cnn", CNNShape(width=8, image_size=64)),
    ],
    ids=["transformer", "cnn"],
)
def test_activation_estimate_tracks_what_autograd_saves(model: str, shape) -> None:
    torch.manual_seed(0)
    network = build(shape)
    measured = _saved_activation_bytes(network, _batch(model, shape, 4))
    estimate = shape.activation_bytes(4, act_bytes=4)
    assert 0.8 <= estimate / measured <= 1.35, (estimate, measured)


def test_the_chunked_loss_is_the_cross_entropy_and_the_same_wherever_it_runs() -> None:
    from hpcmem.train.models import loss_chunk_rows
    from hpcmem.train.networks import chunked_cross_entropy

    torch.manual_seed(0)
    vocab = 2**20 // 4  # 128 tokens per chunk at 128 MiB of fp32 logits: 3 chunks below
    rows = 3 * loss_chunk_rows(vocab) - 5
    hidden = torch.randn(rows, 16, requires_grad=True)
    head = torch.randn(16, vocab, requires_grad=True)
    targets = torch.randint(vocab, (rows,))
    loss = chunked_cross_entropy(hidden, head, targets)
    loss.backward()
    grads = hidden.grad.clone(), head.grad.clone()
    hidden.grad = head.grad = None
    plain = torch.nn.functional.cross_entropy(hidden @ head, targets)
    plain.backward()
    assert torch.allclose(loss, plain, rtol=1e-5)
    assert torch.allclose(grads[0], hidden.grad, rtol=1e-4, atol=1e-7)
    assert torch.allclose(grads[1], head.grad, rtol=1e-4, atol=1e-9)
    hidden.grad = head.grad = None
    again = chunked_cross_entropy(hidden, head, targets)
    assert torch.equal(again, loss)  # the chunking depends on shapes only

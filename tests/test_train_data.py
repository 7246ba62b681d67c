"""The synthetic data producer: batches written in place by the CPU, seeded, from its pool."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpcmem.train.data import (  # noqa: E402
    SyntheticImages,
    SyntheticTokens,
    synthetic_data,
)


def _empty(source) -> dict[str, torch.Tensor]:
    return {f.name: torch.empty(f.shape, dtype=getattr(torch, f.dtype)) for f in source.fields()}


def test_token_batches_are_windows_of_the_stream_written_in_place() -> None:
    source = SyntheticTokens(batch=3, seq_len=16, vocab=50, seed=1)
    out = _empty(source)
    address = out["tokens"].data_ptr()
    source.fill(out)
    tokens = out["tokens"]
    assert tokens.data_ptr() == address and tokens.shape == (3, 17)
    assert tokens.min() >= 0 and tokens.max() < 50
    stream = source.stream.tolist()
    for row in tokens.tolist():
        starts = [i for i in range(len(stream) - 16) if stream[i : i + 17] == row]
        assert starts, "every row is a contiguous window of the token stream"
    assert source.items() == 3 * 16


def test_each_step_gets_a_new_batch_and_the_seed_repeats_the_sequence() -> None:
    first, second = SyntheticTokens(4, 8, 1000, seed=7), SyntheticTokens(4, 8, 1000, seed=7)
    a, b = _empty(first), _empty(second)
    first.fill(a)
    second.fill(b)
    assert torch.equal(a["tokens"], b["tokens"])
    step_one = a["tokens"].clone()
    first.fill(a)
    assert not torch.equal(a["tokens"], step_one)
    other = SyntheticTokens(4, 8, 1000, seed=8)
    c = _empty(other)
    other.fill(c)
    assert not torch.equal(c["tokens"], step_one)


def test_image_batches_are_distinct_pool_samples_with_their_labels() -> None:
    source = SyntheticImages(batch=4, image_size=8, classes=10, seed=0)
    out = _empty(source)
    source.fill(out)
    images, labels = out["images"], out["labels"]
    assert images.shape == (4, 3, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (4,) and labels.dtype == torch.int64
    indices = []
    for image, label in zip(images, labels, strict=True):
        matches = [i for i in range(len(source.images)) if torch.equal(source.images[i], image)]
        assert len(matches) == 1
        assert source.labels[matches[0]] == label
        indices.append(matches[0])
    assert len(set(indices)) == 4  # a shuffled batch, no sample twice
    assert source.items() == 4


def test_field_sizes_are_the_bytes_the_step_moves() -> None:
    source = SyntheticImages(batch=2, image_size=16, classes=10, seed=0)
    sizes = {f.name: f.nbytes for f in source.fields()}
    assert sizes == {"images": 2 * 3 * 16 * 16 * 4, "labels": 2 * 8}


def test_synthetic_data_picks_the_source_for_the_model() -> None:
    tokens = synthetic_data("transformer", batch=2, seq_len=4, vocab=10, image_size=0,
                            classes=0, seed=0)
    images = synthetic_data("cnn", batch=2, seq_len=0, vocab=0, image_size=8, classes=5, seed=0)
    assert isinstance(tokens, SyntheticTokens) and isinstance(images, SyntheticImages)



@pytest.mark.parametrize("model", ["transformer", "cnn"])
def test_fill_writes_through_host_views_as_into_managed_memory(model: str) -> None:
    from hpcmem.um import host_view

    source = synthetic_data(model, batch=2, seq_len=8, vocab=100, image_size=8, classes=10,
                            seed=4)
    reference = synthetic_data(model, batch=2, seq_len=8, vocab=100, image_size=8, classes=10,
                               seed=4)
    target, expected = _empty(source), _empty(reference)
    for tensor in target.values():
        tensor.fill_(-1)
    source.fill({name: host_view(tensor) for name, tensor in target.items()})
    reference.fill(expected)
    for name, tensor in target.items():
        assert torch.equal(tensor, expected[name]), name

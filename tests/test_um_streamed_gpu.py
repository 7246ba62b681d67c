"""The streamed budget strategy on a real GPU, on models ``hpcmem train`` did not build.

Each model trains a few steps through the public ``UnifiedMemory`` API, once without a budget
and once with ``gpu_budget`` = half of the GPU-resident peak it had without one, or, where
that is below what the probe step measured as the least the model needs (the refusal names
it), 1.25 times that measured minimum. In fp32 with
deterministic kernels the losses must be equal bit for bit; every byte must stay in the
pools; the GPU-resident peak must stay within the budget + 5%, with nothing spilled to read
in place; and the mode must have moved bytes both ways. Marked ``gpu``.
"""

from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

pytestmark = pytest.mark.gpu

STEPS = 5


@pytest.fixture
def deterministic(torch):
    """Deterministic kernels (attention through the math kernel), so runs can be compared
    bit for bit; ops without a deterministic kernel warn and the test compares closely."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    with sdpa_kernel(SDPBackend.MATH):
        yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def _train(torch, build, batch, loss_of, budget, autocast=None, working_dtype=None):
    """``STEPS`` AdamW steps; the losses and ``um.stats()`` of the steps after the second;
    under ``autocast`` (a dtype's name), the streamed strategy's copies in ``working_dtype``."""
    from hpcmem.um import UnifiedMemory
    from hpcmem.um.budget.offload import StreamedOffload

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    losses = []
    with UnifiedMemory("hpcmem", device=0, gpu_budget=budget) as um:
        with um.params():
            model = build().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        # the loss as without a budget: the chunked loss, which sums in another order, is
        # tested on its own (test_um_chunked_loss_gpu.py)
        um.attach(model, optimizer, offload=StreamedOffload(
            chunked_loss=False, working_dtype=working_dtype) if budget else None)
        dtype = getattr(torch, autocast or "float32")
        for step in range(STEPS):
            inputs = [um.stage(t) for t in batch(generator)]
            with um.activations():
                with torch.autocast("cuda", dtype=dtype, enabled=autocast is not None):
                    loss = loss_of(model, *inputs)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            if step == 1:
                um.reset_stats()
        torch.cuda.synchronize()
        stats = um.stats()
        del model, optimizer, inputs, loss
    gc.collect()
    torch.cuda.empty_cache()
    return losses, stats


def _train_within_a_budget(torch, build, batch, loss_of, budget, *options):
    """``(budget, losses, stats)`` of ``_train`` under ``budget`` or, if the probe step
    refuses it, under 1.25 times the minimum it measured (tried again: the copies out a
    larger budget allows can raise the minimum)."""
    from hpcmem.um.budget import BudgetTooSmallError

    for _ in range(3):
        minimum = None
        try:
            return (budget, *_train(torch, build, batch, loss_of, budget, *options))
        except BudgetTooSmallError as refused:
            assert refused.budget == budget and refused.minimum > budget
            minimum = refused.minimum
        gc.collect()  # the refused run's model and optimizer, now that its traceback is gone
        torch.cuda.empty_cache()
        budget = int(minimum * 1.25)
    pytest.fail(f"gpu_budget: refused three times, last at {budget} bytes")


def _check(torch, build, batch, loss_of, exact=True):
    reference, free = _train(torch, build, batch, loss_of, None)
    budget, losses, stats = _train_within_a_budget(
        torch, build, batch, loss_of, free["peak_gpu_resident_bytes"] // 2
    )
    assert budget < free["peak_gpu_resident_bytes"]  # still a budget the model must stream in
    stream = stats["offload"]
    if exact:
        assert losses == reference
    else:  # max-pool backward accumulates with atomics: last bits may differ
        assert losses == pytest.approx(reference, rel=1e-4)
    assert stats["escaped_bytes"] == 0
    spilled = stats["activations"]["live_bytes"] - stats["activations"]["gpu_bytes"]
    assert spilled == 0, stats
    assert stats["peak_gpu_resident_bytes"] <= budget * 1.05, (stats, budget)
    assert stream["bytes_h2d"] > 0 and stream["bytes_d2h"] > 0, stream
    return stats


def _tokens(torch, vocab, batch, length):
    return lambda g: [torch.randint(vocab, (batch, length), generator=g)]


def test_hpcmem_transformer_with_tied_embeddings(torch, deterministic):
    from hpcmem.train.models import TransformerShape
    from hpcmem.train.networks import build

    shape = TransformerShape(n_layers=4, d_model=512, n_heads=8, seq_len=256, vocab=8192)
    _check(torch, lambda: build(shape), _tokens(torch, 8192, 8, 257),
           lambda model, tokens: model({"tokens": tokens}))


def test_bf16_working_copies_halve_the_fetches_and_train_alike(torch):
    """Under bf16 autocast, parameters fetched from bf16 copies widened on the GPU: half the
    parameters' bytes in, losses within bf16's tolerance of the fp32 homes', inside the
    budget."""
    from hpcmem.train.models import TransformerShape
    from hpcmem.train.networks import build

    shape = TransformerShape(n_layers=4, d_model=512, n_heads=8, seq_len=256, vocab=8192)
    case = (torch, lambda: build(shape), _tokens(torch, 8192, 8, 257),
            lambda model, tokens: model({"tokens": tokens}))
    _, free = _train(*case, None, "bfloat16")
    budget, copies, stats = _train_within_a_budget(
        *case, free["peak_gpu_resident_bytes"] // 2, "bfloat16", "bfloat16")
    homes, whole = _train(*case, budget, "bfloat16")  # fp32 homes at the same budget
    assert stats["offload"]["working_copies"] == "bfloat16"
    assert whole["offload"]["working_copies"] is None
    # each streamed parameter is fetched at least once a step, at half its fp32 bytes
    streamed = sum(p.numel() * 4 for p in build(shape).parameters() if p.numel() * 4 >= 2**20)
    assert whole["offload"]["bytes_h2d"] - stats["offload"]["bytes_h2d"] >= streamed / 2
    assert copies == pytest.approx(homes, rel=1e-2)
    assert stats["escaped_bytes"] == 0
    assert stats["peak_gpu_resident_bytes"] <= budget * 1.05, (stats, budget)


def test_gpt2_from_transformers_random_weights(torch, deterministic):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192,
                                     n_positions=256)
    _check(torch, lambda: transformers.GPT2LMHeadModel(config), _tokens(torch, 8192, 8, 256),
           lambda model, ids: model(input_ids=ids, labels=ids).loss)


def test_torchvision_resnet_with_batchnorm_and_inplace_relu(torch, deterministic):
    torchvision = pytest.importorskip("torchvision")
    images = lambda g: [torch.randn(32, 3, 64, 64, generator=g),  # noqa: E731
                        torch.randint(100, (32,), generator=g)]
    stats = _check(torch, lambda: torchvision.models.resnet18(num_classes=100), images,
                   lambda model, x, y: torch.nn.functional.cross_entropy(model(x), y),
                   exact=False)
    assert stats["offload"]["plan"] is not None


def test_timm_vision_transformer(torch, deterministic):
    timm = pytest.importorskip("timm")
    images = lambda g: [torch.randn(16, 3, 64, 64, generator=g),  # noqa: E731
                        torch.randint(100, (16,), generator=g)]
    _check(torch, lambda: timm.create_model("vit_small_patch16_224", pretrained=False,
                                            img_size=64, num_classes=100),
           images, lambda model, x, y: torch.nn.functional.cross_entropy(model(x), y))


def test_custom_function_and_a_module_called_twice(torch, deterministic):
    from torch import nn
    from um_functions import Square

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(4096, 512)
            self.shared = nn.Linear(512, 512)
            self.inner = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
            self.weight = nn.Parameter(torch.randn(512, 512) * 0.02)

        def forward(self, tokens):
            x = self.shared(self.embed(tokens))
            x = self.shared(x + self.inner(x))
            x = Square.apply(x, self.weight)
            return nn.functional.cross_entropy(x @ self.embed.weight.t(), tokens)

    _check(torch, Net, lambda g: [torch.randint(4096, (2048,), generator=g)],
           lambda model, tokens: model(tokens))


def test_a_budget_below_the_probe_step_is_refused_with_the_measured_minimum(torch):
    from hpcmem.train.models import TransformerShape
    from hpcmem.train.networks import build
    from hpcmem.um.budget import BudgetTooSmallError

    shape = TransformerShape(n_layers=2, d_model=512, n_heads=8, seq_len=256, vocab=8192)
    with pytest.raises(BudgetTooSmallError) as raised:
        _train(torch, lambda: build(shape), _tokens(torch, 8192, 8, 257),
               lambda model, tokens: model({"tokens": tokens}), 2**20)
    assert raised.value.budget == 2**20 and raised.value.minimum > 2**20
    gc.collect()
    torch.cuda.empty_cache()

"""The loss without whole logits (hpcmem.um.budget.chunked_loss, .causal_lm) on the CPU: the
loss and its gradients against ``F.cross_entropy`` over whole logits, and tiny Hugging Face
causal LMs trained under a budget, with and without it, under both strategies.

Tolerances: in fp32 the loss within 1e-6 relative and each gradient within 1e-5 of its
largest element (the sums run in another order); under bf16 autocast both sides round the
same bf16 logits, so the loss stays within 1e-6, and each gradient within 1e-2 of its largest
element (one bf16 rounding of the logits' gradient may fall the other way).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from cpu_memory import CpuMemory  # noqa: E402

from hpcmem.um import BudgetError, Offload  # noqa: E402
from hpcmem.um.budget import HostOptimizerOffload, StreamedOffload, offload_named  # noqa: E402
from hpcmem.um.budget.causal_lm import MAX_CHUNK_BYTES, chunk_bytes  # noqa: E402
from hpcmem.um.budget.chunked_loss import chunk_rows, linear_cross_entropy  # noqa: E402

ROWS, WIDTH, VOCAB, CHUNK = 37, 16, 300, 8  # chunks of 8 rows: the last one holds 5
GRAD_TOLERANCE = {False: 1e-5, True: 1e-2}
pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 2**30
STEPS = 3


def _inputs(bias: bool):
    torch.manual_seed(0)
    hidden = torch.randn(ROWS, WIDTH, requires_grad=True)
    weight = torch.randn(VOCAB, WIDTH, requires_grad=True)
    offset = torch.randn(VOCAB, requires_grad=True) if bias else None
    targets = torch.randint(VOCAB, (ROWS,))
    targets[[0, 9, 36]] = -100  # ignored, one of them at a chunk's first row
    return hidden, weight, offset, targets


def _grads(loss, *tensors):
    loss.backward()
    grads = [t.grad.clone() for t in tensors if t is not None]
    for t in tensors:
        if t is not None:
            t.grad = None
    return grads


def _close(ours, plain, tolerance):
    scale = plain.abs().max()
    assert (ours - plain).abs().max() <= tolerance * scale, (ours - plain).abs().max() / scale


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_the_loss_and_its_gradients_are_those_of_the_whole_logits(bias, autocast):
    hidden, weight, offset, targets = _inputs(bias)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy(hidden, weight, offset, targets, rows=CHUNK)
        plain = F.cross_entropy(F.linear(hidden, weight, offset).float(), targets,
                                reduction="sum")
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    ours = _grads(2.5 * loss, hidden, weight, offset)  # backward scales by the loss's gradient
    for mine, theirs in zip(ours, _grads(2.5 * plain, hidden, weight, offset), strict=True):
        _close(mine, theirs, GRAD_TOLERANCE[autocast])


def test_a_tied_weight_gets_both_gradients():
    torch.manual_seed(0)
    table = torch.randn(VOCAB, WIDTH, requires_grad=True)  # embedding and output head
    ids = torch.randint(VOCAB, (ROWS,))
    targets = torch.roll(ids, -1)

    def hidden():
        return torch.tanh(F.embedding(ids, table))

    ours = _grads(linear_cross_entropy(hidden(), table, None, targets, rows=CHUNK), table)
    plain = _grads(F.cross_entropy(hidden() @ table.t(), targets, reduction="sum"), table)
    _close(ours[0], plain[0], 1e-5)


def test_without_gradients_it_keeps_none_and_a_loss_of_ignored_rows_is_zero():
    hidden, weight, _, targets = _inputs(False)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, None, targets, rows=CHUNK)
    assert loss.grad_fn is None
    ignored = torch.full((ROWS,), -100)
    assert linear_cross_entropy(hidden, weight, None, ignored, rows=CHUNK).item() == 0
    with pytest.raises(ValueError, match="rows: 0 must be >= 1"):
        linear_cross_entropy(hidden, weight, None, targets, rows=0)


def test_the_chunks_follow_the_budget():
    # 151,936-token vocabulary: 600 KiB of fp32 logits a row
    assert chunk_bytes(6 * 2**30) == 96 * 2**20
    assert chunk_rows(151_936, chunk_bytes(6 * 2**30)) == 165
    assert chunk_bytes(80 * 2**30) == MAX_CHUNK_BYTES
    assert chunk_rows(151_936, MAX_CHUNK_BYTES) == 441
    assert chunk_rows(151_936, 1) == 1


def test_the_offload_value_carries_the_switch():
    assert Offload().to_record()["chunked_loss"] is None
    assert offload_named(None, chunked_loss=False) == Offload(chunked_loss=False)
    assert offload_named("streamed", chunked_loss=True) == StreamedOffload(chunked_loss=True)
    assert HostOptimizerOffload(chunked_loss=False).to_record()["chunked_loss"] is False
    with pytest.raises(BudgetError, match="offload chunked_loss: 'yes' is not true, false"):
        Offload(chunked_loss="yes")


# -- Hugging Face models under a budget ------------------------------------------------------
def _llama():
    torch.manual_seed(0)  # lm_head of 1 MiB: the streamed strategy streams it
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        use_cache=False))


def _gpt2():
    torch.manual_seed(0)  # tied: lm_head.weight is the token embedding
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=4096, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _batches(vocab: int):
    tokens = torch.randint(vocab, (STEPS, 2, 40), generator=torch.Generator().manual_seed(1))
    labels = tokens.clone()
    labels[:, 0, :6] = -100  # a prompt left out of the loss
    return list(zip(tokens, labels, strict=True))


def _train(build, offload, budget=BUDGET, check=None):
    """Losses of STEPS AdamW steps under ``budget``, and the memory's stats."""
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    with CpuMemory(gpu_budget=budget) as memory:
        memory.attach(model, optimizer, offload=offload)
        if check is not None:
            check(model, memory)
        for tokens, labels in _batches(model.config.vocab_size):
            with memory.activations():
                output = model(input_ids=tokens, labels=labels)
                output.loss.backward()
            assert (output.logits is None) == (offload.chunked_loss is not False)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(output.loss.item())
        stats = memory.stats()
    return losses, stats, model


@pytest.mark.parametrize("kind", [HostOptimizerOffload, StreamedOffload])
@pytest.mark.parametrize("build", [_llama, _gpt2])
def test_a_model_trains_as_without_the_chunks_under_both_strategies(kind, build):
    budget = 64 * 2**20  # chunks of 1 MiB of fp32 logits: 64 rows, 80 tokens a batch
    plain, _, _ = _train(build, kind(chunked_loss=False), budget)
    losses, stats, model = _train(build, kind(), budget)
    record = stats["offload"]["chunked_loss"]
    split = record.pop("batch_split")  # measured by the host optimizer only
    assert split["enabled"] is (kind is HostOptimizerOffload)
    assert record == {"applied": True, "reason": None, "chunk_bytes": 2**20, "chunk_rows": 64}
    assert losses == pytest.approx(plain, rel=1e-5)
    assert "forward" not in model.__dict__  # close() gave the forward back
    assert "forward" not in model.lm_head.__dict__ and "_loss_function" not in model.__dict__


def test_the_streamed_strategy_binds_the_head_for_the_loss():
    bound = []

    def check(model, memory):
        entry = memory.strategy.params.by_param[id(model.lm_head.weight)]
        assert not entry.resident

        def before(module, args):  # after the strategy's own hook: what the loss reads
            with torch._C.DisableTorchFunction():  # a read of our own binds nothing
                bound.append(entry.device is not None
                             and module.weight.data_ptr() == entry.device.data_ptr()
                             and entry.device.data_ptr() != entry.home.data_ptr())

        model.lm_head.register_forward_pre_hook(before)

    _train(_llama, StreamedOffload(), check=check)
    assert bound == [True] * STEPS


def test_the_output_has_no_logits_and_without_labels_the_forward_is_unchanged():
    model = _llama()
    tokens, labels = _batches(model.config.vocab_size)[0]
    plain = model(input_ids=tokens, labels=labels)
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(model, torch.optim.AdamW(model.parameters()))
        with memory.activations():
            output = model(input_ids=tokens, labels=labels)
            as_tuple = model(input_ids=tokens, labels=labels, return_dict=False)
            counted = model(input_ids=tokens, labels=labels, num_items_in_batch=torch.tensor(50))
            logits = model(input_ids=tokens).logits
    assert output.logits is None and output.loss.item() == pytest.approx(plain.loss.item())
    assert len(as_tuple) == 1 and as_tuple[0].item() == pytest.approx(plain.loss.item())
    total = F.cross_entropy(plain.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                            reduction="sum")
    assert counted.loss.item() == pytest.approx(total.item() / 50, rel=1e-6)
    assert logits.shape == (*tokens.shape, model.config.vocab_size)


def test_a_soft_capped_head_is_skipped_with_its_reason_and_refused_when_asked():
    def gemma():
        torch.manual_seed(0)
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16))

    with CpuMemory(gpu_budget=BUDGET) as memory:
        model = gemma()
        memory.attach(model, torch.optim.AdamW(model.parameters()))
        record = memory.stats()["offload"]["chunked_loss"]
    assert record["applied"] is False
    assert record["reason"] == ("config.final_logit_softcapping=30.0 changes the logits after "
                                "lm_head")
    with CpuMemory(gpu_budget=BUDGET) as memory, pytest.raises(
            BudgetError, match="chunked_loss: True does not apply to Gemma2ForCausalLM"):
        memory.attach(gemma(), None, offload=Offload(chunked_loss=True))


def test_an_unforeseen_use_of_the_logits_is_refused_by_name():
    torch.manual_seed(0)  # Granite divides its logits; at 1 its config says nothing of it
    model = transformers.GraniteForCausalLM(transformers.GraniteConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, logits_scaling=1.0))
    tokens = torch.randint(256, (1, 8))
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(model, torch.optim.AdamW(model.parameters()))
        with memory.activations(), pytest.raises(
                BudgetError, match="GraniteForCausalLM's forward applies div to the logits"):
            model(input_ids=tokens, labels=tokens)


def test_the_loss_reads_the_streamed_head_once_while_bound():
    """No read of the weight before the function is applied lets the streamed strategy drop
    it (autograd would record it in host memory): the forward fetches as often as HF's own
    head, whose one operation reads it bound."""
    def fetched(offload):
        model = _llama()
        tokens, labels = _batches(model.config.vocab_size)[0]
        with CpuMemory(gpu_budget=BUDGET) as memory:
            memory.attach(model, torch.optim.AdamW(model.parameters()), offload=offload)
            with memory.activations():
                model(input_ids=tokens, labels=labels)
            return memory.strategy.counters.fetched_on_demand

    assert fetched(StreamedOffload()) == fetched(StreamedOffload(chunked_loss=False))


class _Wrapper(torch.nn.Module):
    """A trainer's module holding a Hugging Face model (as a LightningModule does)."""

    def __init__(self, *models):
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, tokens, labels):
        return self.models[0](input_ids=tokens, labels=labels).loss


def test_the_one_causal_lm_inside_an_attached_module_gets_it():
    wrapper = _Wrapper(_llama())
    tokens, labels = _batches(4096)[0]
    plain = wrapper(tokens, labels)
    with CpuMemory(gpu_budget=BUDGET) as memory:
        memory.attach(wrapper, torch.optim.AdamW(wrapper.parameters()))
        assert memory.stats()["offload"]["chunked_loss"]["applied"]
        with memory.activations():
            assert wrapper(tokens, labels).item() == pytest.approx(plain.item(), rel=1e-6)
            assert wrapper.models[0](input_ids=tokens, labels=labels).logits is None
    with CpuMemory(gpu_budget=BUDGET) as memory:
        two = _Wrapper(_llama(), _gpt2())
        memory.attach(two, torch.optim.AdamW(two.parameters()))
        assert memory.stats()["offload"]["chunked_loss"]["reason"] == "2 causal LMs inside _Wrapper"

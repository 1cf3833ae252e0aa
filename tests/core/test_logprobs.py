"""Chunked log-probs (stages/core/logprobs.py): values, entropies and gradients equal the materialised
log-softmax to 1e-5, for any chunk size, with ignored positions, a bias, a temperature, re-indexed rows, bf16
autocast, and through a causal LM's forward (plain head swap) and a DeepSpeed-like wrapper."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.core.logprobs import IGNORE, chunked_logprobs, lm_logprobs, output_head

torch.set_num_threads(1)


def _reference(h, w, b, t, temp):
    """The slow reference: full logits, log-softmax, gather (ignored positions 0)."""
    z = torch.nn.functional.linear(h, w, b).float() / temp
    logp_all = torch.log_softmax(z, -1)
    lp = logp_all.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(t == IGNORE, 0.0)
    ent = (-(logp_all.exp() * logp_all).sum(-1)).masked_fill(t == IGNORE, 0.0)
    return lp, ent


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_full_log_softmax(chunk, bias) -> None:
    g = torch.Generator().manual_seed(chunk)
    B, K, H, V = 2, 5, 6, 11
    h = torch.randn(B, K, H, generator=g, dtype=torch.float64).float().requires_grad_()
    w = torch.randn(V, H, generator=g).requires_grad_()
    b = torch.randn(V, generator=g).requires_grad_() if bias else None
    t = torch.randint(0, V, (B, K), generator=g)
    t[0, 1] = IGNORE
    t[1, 4] = IGNORE
    weights = torch.randn(B, K, generator=g)

    def grads(fn):
        lp, ent = fn()
        (lp * weights).sum().backward()
        out = [x.grad.clone() for x in (h, w) + ((b,) if b is not None else ())]
        for x in (h, w) + ((b,) if b is not None else ()):
            x.grad = None
        return lp.detach(), ent, out

    lp_a, ent_a, g_a = grads(lambda: _reference(h, w, b, t, 0.7))
    lp_b, ent_b, g_b = grads(lambda: chunked_logprobs(h, w, b, t, temperature=0.7, entropy=True, chunk_tokens=chunk))
    assert torch.allclose(lp_a, lp_b, atol=1e-5, rtol=0)
    assert torch.allclose(ent_a.detach(), ent_b, atol=1e-5, rtol=0)
    assert float(lp_b[0, 1]) == 0.0 and float(ent_b[1, 4]) == 0.0
    for x, y in zip(g_a, g_b, strict=True):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-5)


def test_double_precision_gradcheck() -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 4, 2, 2])
    from stages.core.logprobs import ChunkedLogProbs

    def f(h, w, b):  # float64 in; the log-probs come out float32, so check in float64 via the formula's pieces
        return ChunkedLogProbs.apply(h, w, b, t, 1.3, 2, False)[0].double()

    lp = f(h, w, b)
    ref = torch.log_softmax((h @ w.T + b) / 1.3, -1).gather(-1, t[:, None]).squeeze(-1)
    assert torch.allclose(lp, ref, atol=1e-6)
    gh, gw, gb = torch.autograd.grad(lp.sum(), (h, w, b))
    rh, rw, rb = torch.autograd.grad(ref.sum(), (h, w, b))
    assert torch.allclose(gh, rh, atol=1e-6) and torch.allclose(gw, rw, atol=1e-6) and torch.allclose(gb, rb, atol=1e-6)


def test_bf16_autocast_matches_the_autocast_head() -> None:
    """Under bf16 autocast the head multiplies in bf16 (as the model's own lm_head would), then log-softmax in fp32."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 8, generator=g).requires_grad_()
    w = torch.randn(13, 8, generator=g).requires_grad_()
    t = torch.randint(0, 13, (6,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = _reference(h, w, None, t, 1.0)
        lp, _ = chunked_logprobs(h, w, None, t, chunk_tokens=4)
    assert torch.allclose(ref, lp, atol=1e-5)
    ga = torch.autograd.grad(ref.sum(), (h, w))
    gb = torch.autograd.grad(lp.sum(), (h, w))
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=2e-2, rtol=2e-2)  # bf16 matmuls in the backward, summed in another order


def _tiny_lm(tie: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tie", [True, False])
def test_through_a_causal_lm_forward(tie) -> None:
    """lm_logprobs(model, targets, logits_to_keep=K) equals log-softmax of the model's own logits, values and
    parameter gradients; the head is restored afterwards; re-indexed rows (``rows``) select the head's inputs."""
    model = _tiny_lm(tie)
    ids = torch.randint(0, 97, (3, 9))
    tgt = torch.randint(0, 97, (3, 4))
    tgt[2, 3] = IGNORE

    def run(chunked: bool):
        model.zero_grad()
        if chunked:
            _, lp, ent = lm_logprobs(model, tgt, temperature=0.8, entropy=True, chunk_tokens=5, input_ids=ids,
                                     logits_to_keep=4)
        else:
            logits = model(input_ids=ids).logits[:, -4:]
            lp, ent = _reference_from_logits(logits, tgt, 0.8)
        lp.sum().backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    a, b = run(False), run(True)
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-5)
    for n, gr in a[2].items():
        assert torch.allclose(gr, b[2][n], atol=1e-5, rtol=1e-4), n
    assert "forward" not in vars(model.lm_head)  # the head's own forward is back
    assert model(input_ids=ids).logits.shape == (3, 9, 97)
    rows = torch.tensor([0, 0, 1])
    _, lp_rows, _ = lm_logprobs(model, tgt, input_ids=ids[:2], logits_to_keep=4, rows=rows)
    _, lp_full, _ = lm_logprobs(model, tgt, input_ids=ids[rows], logits_to_keep=4)
    assert torch.allclose(lp_rows, lp_full, atol=1e-6)


def _reference_from_logits(logits, tgt, temp):
    logp_all = torch.log_softmax(logits.float() / temp, -1)
    lp = logp_all.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(tgt == IGNORE, 0.0)
    ent = (-(logp_all.exp() * logp_all).sum(-1)).masked_fill(tgt == IGNORE, 0.0)
    return lp, ent


def test_wrapper_and_non_linear_heads() -> None:
    """A wrapper with ``.module`` (a DeepSpeed engine) finds the head inside; a soft-capped head is not replaced
    (the materialised path), with the same values."""
    model = _tiny_lm()

    class Engine(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.module = m

        def forward(self, **kw):
            return self.module(**kw)

    assert output_head(Engine(model)) is model.lm_head
    ids = torch.randint(0, 97, (2, 6))
    tgt = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        _, a, _ = lm_logprobs(Engine(model), tgt, input_ids=ids)
        model.config.final_logit_softcapping = 30.0
        assert output_head(model) is None
        _, b, _ = lm_logprobs(model, tgt, input_ids=ids)  # Llama ignores the setting: the same logits
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.slow  # four fresh processes, ~5 GiB at peak (the materialised logits); .ci/slow gpu-scale runs it
def test_peak_memory_at_a_real_vocabulary_before_and_after() -> None:
    """Vocabulary 152,064 (Qwen2's), 4 outputs x 512 tokens, a 1-layer hidden-64 Qwen2: the log-prob pass (no
    gradient) and the update pass (forward with entropy, backward) of token_logprobs, each in a fresh process,
    with materialised logits (chunk 0, the code before) and chunked (256 positions): at most half the peak RSS
    above baseline, the same log-probs and gradients to 1e-5 and entropies to 1e-5 relative (float32 rounding of
    a 152k-term sum)."""
    from benchmarks.memory import compare_passes

    res = compare_passes(4, 512, 152064, chunk=256)
    for mode in ("logprobs", "update"):
        r = res[mode]
        assert r["after"]["peak_bytes"] <= 0.5 * r["before"]["peak_bytes"], r
        assert r["logprobs_max_abs_diff"] < 1e-5
    u = res["update"]
    assert u["entropy_max_abs_diff"] < 1e-5 * 12.0 and u["grad_max_rel_diff"] < 1e-5  # entropy <= log(152064) < 12
    n_logits = 4 * 512 * 152064 * 4  # one (N, T, V) float32 tensor
    assert u["before"]["peak_bytes"] > 2 * n_logits  # the code before held several of them


def test_select_cache_rows_gradients_are_the_same_at_any_thread_timing() -> None:
    """Issue 29: one prompt's KV rows copied to its G outputs (a GRPO micro-batch holding one group), with 2 threads:
    the gradient of the prompt's keys is the same bits on every run and equal to the 1-thread one, and the values
    equal transformers' batch_select_indices (whose advanced-indexing backward summed the G copies in a
    thread-timing-dependent order: 20 different gradients in 30 runs beside a busy process, torch 2.13)."""
    from transformers.cache_utils import DynamicCache

    from stages.core.logprobs import select_cache_rows

    g = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 4, 70, 64, generator=g, requires_grad=True)
    values = torch.randn(1, 4, 70, 64, generator=g, requires_grad=True)
    upstream = torch.randn(8, 4, 70, 64, generator=g)
    index = torch.zeros(8, dtype=torch.long)

    def grads() -> tuple[torch.Tensor, torch.Tensor]:
        cache = DynamicCache()
        cache.update(keys * 1.0, values * 1.0, 0)
        select_cache_rows(cache, index)
        k, v = cache.layers[0].keys, cache.layers[0].values
        keys.grad = values.grad = None
        ((k * upstream).sum() + (v * upstream).sum()).backward()
        return keys.grad.clone(), values.grad.clone(), k.detach()

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        k1, v1, rows1 = grads()
        torch.set_num_threads(2)
        for _ in range(20):
            k2, v2, rows2 = grads()
            assert torch.equal(k2, k1) and torch.equal(v2, v1)
    finally:
        torch.set_num_threads(threads)
    ref = DynamicCache()
    ref.update(keys.detach(), values.detach(), 0)
    ref.batch_select_indices(index)
    assert torch.equal(rows1, ref.layers[0].keys) and torch.equal(rows2, rows1)

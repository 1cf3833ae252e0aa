"""Top-k / top-p handled exactly (issue 31 item 3): the sampler reports the log-prob of the truncated, renormalised
distribution it drew from (``SamplingParams.logprobs_mode="processed"``), and the trainer's log-probs
(stages.core.logprobs, stages.rl.rollout.token_logprobs) renormalise over the same kept set, so the two agree.

- ``truncation_mask`` against a loop reference (top-k ties, top-p's "the tokens above already reach p" rule);
- chunked and materialised log-probs with truncation: values and gradients against a loop-built reference, any chunk;
- the hf sampler's processed log-probs equal the trainer's truncated teacher-forced ones (1e-5), and every sampled
  token lies in the kept set; the full log-probs stay those of before (logprobs_mode "full").
"""

from __future__ import annotations

import math

import pytest
import torch

from stages.core.generation import HFGenerator, SamplingParams
from stages.core.logprobs import IGNORE, chunked_logprobs, plain_head, truncation_mask
from stages.rl.rollout import token_logprobs

from .test_generation import tiny_model, tiny_prompts, tiny_tokenizer

torch.set_num_threads(1)

SETTINGS = [(0, 1.0), (0, 0.9), (0, 0.5), (5, 1.0), (20, 1.0), (10, 0.8), (1, 1.0), (0, 1e-6)]


def kept_loop(logp: list[float], top_k: int, top_p: float) -> set[int]:
    """The kept token ids of one distribution, with Python loops (the definition in truncation_mask's docstring)."""
    V = len(logp)
    ids = set(range(V))
    if 0 < top_k < V:
        kth = sorted(logp, reverse=True)[top_k - 1]
        ids = {i for i in ids if logp[i] >= kth}
    if top_p < 1.0:
        mass = sum(math.exp(logp[i]) for i in ids)
        order = sorted(ids, key=lambda i: -logp[i])
        kept, above = set(), 0.0
        for i in order:
            p = math.exp(logp[i]) / mass
            if above >= top_p:
                break
            kept.add(i)
            above += p
        ids = kept
    return ids


@pytest.mark.parametrize(("top_k", "top_p"), SETTINGS)
def test_truncation_mask_matches_the_loop_definition(top_k, top_p):
    g = torch.Generator().manual_seed(top_k * 7 + int(top_p * 100))
    logits = torch.randn(6, 40, generator=g, dtype=torch.float64) * 2
    logits[0, :5] = 3.0  # a tie at the top-k boundary
    logp = torch.log_softmax(logits, -1)
    keep = truncation_mask(logp, top_k, top_p)
    for r in range(logp.shape[0]):
        want = kept_loop(logp[r].tolist(), top_k, top_p)
        got = set(range(40)) if keep is None else set(torch.nonzero(keep[r]).flatten().tolist())
        assert got == want
        assert got  # the top token always stays


def _truncated_reference(h, w, t, temp, top_k, top_p):
    """Loops over positions: log p(y) - log sum_{kept} p, the kept set from kept_loop."""
    z = torch.nn.functional.linear(h, w).double() / temp
    out = torch.zeros(t.shape, dtype=torch.float64)
    for idx in range(t.numel()):
        b, k = divmod(idx, t.shape[1])
        if int(t[b, k]) == IGNORE:
            continue
        logp = torch.log_softmax(z[b, k], -1)
        kept = kept_loop(logp.tolist(), top_k, top_p)
        norm = torch.logsumexp(logp[sorted(kept)], 0)
        out[b, k] = logp[int(t[b, k])] - norm
    return out


@pytest.mark.parametrize(("top_k", "top_p"), SETTINGS[1:])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_truncated_logprobs_and_gradients_match_the_reference(top_k, top_p, chunk):
    g = torch.Generator().manual_seed(chunk + top_k)
    B, K, H, V = 2, 5, 6, 30
    h = torch.randn(B, K, H, generator=g, dtype=torch.float64).requires_grad_()
    w = (torch.randn(V, H, generator=g, dtype=torch.float64) * 1.5).requires_grad_()
    t = torch.randint(0, V, (B, K), generator=g)
    t[1, 2] = IGNORE
    weights = torch.randn(B, K, generator=g, dtype=torch.float64)

    def grads(fn):
        lp = fn()
        (lp * weights).sum().backward()
        out = (lp.detach().clone(), h.grad.clone(), w.grad.clone())
        h.grad = w.grad = None
        return out

    ref = grads(lambda: _truncated_reference(h, w, t, 0.7, top_k, top_p))
    got = grads(
        lambda: chunked_logprobs(h, w, None, t, temperature=0.7, chunk_tokens=chunk, top_k=top_k, top_p=top_p)[
            0
        ].double()
    )
    for a, b in zip(ref, got, strict=True):
        assert torch.allclose(a, b.to(a.dtype), atol=1e-5, rtol=1e-5)

    class Out:
        def __init__(self, logits):
            self.logits = logits

    plain = grads(
        lambda: plain_head(
            lambda: Out(torch.nn.functional.linear(h, w)), t, temperature=0.7, top_k=top_k, top_p=top_p
        )[1].double()
    )
    for a, b in zip(ref, plain, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def lm():
    tok = tiny_tokenizer()
    return tiny_model(tok), tok


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (5, 1.0), (10, 0.8), (0, 1.0)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_processed_logprobs_equal_the_trainers_truncated_ones(lm, top_k, top_p, temperature):
    model, tok = lm
    gen = HFGenerator(model, tok)
    prompts = tiny_prompts(3)
    sp = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, n=4, max_new_tokens=16, seed=3, logprobs_mode="processed"
    )
    full = gen.generate(prompts, SamplingParams(**{**sp.__dict__, "logprobs_mode": "full"}))
    outs = gen.generate(prompts, sp)
    for prompt, group, fgroup in zip(prompts, outs, full, strict=True):
        p_ids = tok(prompt)["input_ids"]
        for c, fc in zip(group, fgroup, strict=True):
            assert c.token_ids == fc.token_ids  # the mode changes what is reported, never what is sampled
            ids = torch.tensor([p_ids + c.token_ids])
            with torch.no_grad():
                lp, _ = token_logprobs(
                    model, ids, torch.ones_like(ids), len(p_ids), temperature, top_k=top_k, top_p=top_p
                )
                lp_full, _ = token_logprobs(model, ids, torch.ones_like(ids), len(p_ids), temperature)
            assert torch.allclose(lp[0], torch.tensor(c.logprobs), atol=1e-5)
            assert torch.allclose(lp_full[0], torch.tensor(fc.logprobs), atol=1e-5)
            if top_k or top_p < 1.0:  # renormalising over the kept set raises every token's log-prob
                assert all(a >= b - 1e-6 for a, b in zip(c.logprobs, fc.logprobs, strict=True))
            else:
                assert c.logprobs == fc.logprobs


def test_every_sampled_token_is_in_the_kept_set(lm):
    model, tok = lm
    gen = HFGenerator(model, tok)
    prompts = tiny_prompts(2)
    sp = SamplingParams(temperature=1.0, top_k=3, n=8, max_new_tokens=12, seed=1, logprobs_mode="processed")
    for prompt, group in zip(prompts, gen.generate(prompts, sp), strict=True):
        p_ids = tok(prompt)["input_ids"]
        for c in group:
            ids = torch.tensor([p_ids + c.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(p_ids) - 1 : -1].float()
            keep = truncation_mask(torch.log_softmax(logits, -1), 3, 1.0)
            assert bool(keep[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)].all())

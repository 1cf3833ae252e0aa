"""gspo_loss, cispo_loss and entropy_bonus (stages.rl.losses) against scalar loop references (value and gradient,
every aggregation), identities with grpo_loss, and micro-batch accumulation. TRL's implementations on the same
tensors: tests/benchmarks/test_rl_math_vs_trl.py."""

from __future__ import annotations

import math

import pytest
import torch

from stages.rl.losses import AGGREGATIONS, LossNormalizer, cispo_loss, entropy_bonus, grpo_loss, gspo_loss

torch.set_num_threads(1)


def random_batch(B=6, T=9, seed=0, per_token_adv=False, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    ref = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    shape = (B, T) if per_token_adv else (B,)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[0, 0] = 0.0  # a masked (tool-output) token inside a sequence
    mask[1] = 0.0  # a wholly excluded output
    w = torch.rand(B, T, generator=g, dtype=torch.float64) * 2  # rollout-correction weights
    return logp, old, ref, adv, mask, w


def loop_aggregate(terms, aggregation, max_len):
    """terms: one list of scalar tensors per sequence (its loss tokens)."""
    seqs = [t for t in terms if t]
    if aggregation == "seq-mean-token-mean":
        return sum(sum(t) / len(t) for t in seqs) / len(seqs)
    total = sum(sum(t) for t in seqs)
    if aggregation == "token-mean":
        return total / sum(len(t) for t in seqs)
    return total / (len(seqs) * max_len)


def clip(x, lo, hi):
    """torch.clamp on a scalar tensor: the gradient passes only inside [lo, hi]."""
    v = x.item()
    return x if lo <= v <= hi else torch.tensor(min(max(v, lo), hi), dtype=x.dtype)


def k3(logp, ref):
    d = ref - logp
    return torch.exp(d) - d - 1


def gspo_sequence_reference(logp, old, ref, adv, mask, *, eps_low, eps_high, beta, aggregation, w=None):
    """GSPO's objective written at the sequence level (per-output advantages): s_i = exp(mean_t(logp - old)) as one
    differentiable scalar per output, one clipped term per output counted once per loss token."""
    B, T = mask.shape
    terms = []
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t] != 0]
        if not toks:
            terms.append([])
            continue
        s = torch.exp(sum(logp[i, t] - old[i, t] for t in toks) / len(toks))
        a = adv[i]
        seq_term = -torch.minimum(s * a, clip(s, 1 - eps_low, 1 + eps_high) * a)
        row = []
        for t in toks:
            x = seq_term * (w[i, t] if w is not None else 1.0)
            if beta:
                x = x + beta * k3(logp[i, t], ref[i, t])
            row.append(x)
        terms.append(row)
    return loop_aggregate(terms, aggregation, T)


def gspo_token_reference(logp, old, ref, adv, mask, *, eps_low, eps_high, beta, aggregation, w=None):
    """GSPO-token: s_{i,t} = sg[s_i] * pi_t / sg[pi_t], per-token advantages, token by token."""
    B, T = mask.shape
    terms = []
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t] != 0]
        row = []
        if toks:
            s = math.exp(sum((logp[i, t] - old[i, t]).item() for t in toks) / len(toks))
            for t in toks:
                a = adv[i, t] if adv.dim() == 2 else adv[i]
                st = s * torch.exp(logp[i, t] - logp[i, t].detach())
                x = -torch.minimum(st * a, clip(st, 1 - eps_low, 1 + eps_high) * a)
                x = x * (w[i, t] if w is not None else 1.0)
                if beta:
                    x = x + beta * k3(logp[i, t], ref[i, t])
                row.append(x)
        terms.append(row)
    return loop_aggregate(terms, aggregation, T)


def cispo_reference(logp, old, ref, adv, mask, *, lo, hi, beta, aggregation, w=None):
    B, T = mask.shape
    terms = []
    for i in range(B):
        row = []
        for t in range(T):
            if mask[i, t] == 0:
                continue
            a = adv[i, t] if adv.dim() == 2 else adv[i]
            r = math.exp(logp[i, t].item() - old[i, t].item())
            rhat = min(r, hi) if lo is None else min(max(r, lo), hi)
            x = -rhat * a * logp[i, t] * (w[i, t] if w is not None else 1.0)
            if beta:
                x = x + beta * k3(logp[i, t], ref[i, t])
            row.append(x)
        terms.append(row)
    return loop_aggregate(terms, aggregation, T)


def close(fast, slow, x):
    (g_fast,) = torch.autograd.grad(fast, x)
    (g_slow,) = torch.autograd.grad(slow, x)
    assert abs(fast.item() - slow.item()) < 1e-10
    assert torch.allclose(g_fast, g_slow, atol=1e-10, rtol=0)
    assert g_fast.abs().sum() > 0
    return g_fast


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gspo_matches_the_sequence_level_objective(aggregation, weighted):
    clipped = []
    for seed in range(4):
        logp, old, ref, adv, mask, w = random_batch(seed=seed, spread=0.05)
        # the sequence-level form broadcasts one term over the output's tokens: only uniform weights per output
        # leave it equal to the token form
        w = w[:, :1].expand_as(w).contiguous() if weighted else None
        kw = dict(beta=0.04, aggregation=aggregation)
        loss, m = gspo_loss(logp, old, ref, adv, mask, clip_eps=0.02, clip_eps_high=0.03, is_weights=w, **kw)
        ref_loss = gspo_sequence_reference(logp, old, ref, adv, mask, eps_low=0.02, eps_high=0.03, w=w, **kw)
        g = close(loss, ref_loss, logp)
        assert torch.all(g[mask == 0] == 0)
        clipped.append(m["clip_frac_low"] + m["clip_frac_high"])
    assert 0 < max(clipped) < 1  # the clip is active on some outputs and not on others


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_token_matches_loop_with_per_token_advantages_and_weights(aggregation):
    for seed in range(3):
        logp, old, ref, adv, mask, w = random_batch(seed=seed, per_token_adv=True, spread=0.05)
        kw = dict(beta=0.04, aggregation=aggregation)
        loss, _ = gspo_loss(logp, old, ref, adv, mask, clip_eps=0.02, clip_eps_high=0.03, is_weights=w, **kw)
        close(loss, gspo_token_reference(logp, old, ref, adv, mask, eps_low=0.02, eps_high=0.03, w=w, **kw), logp)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("bounds", [(None, 1.2), (0.9, 1.1), (None, 5.0)])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_cispo_matches_loop_reference(aggregation, bounds, per_token_adv):
    lo, hi = bounds
    for seed in range(3):
        logp, old, ref, adv, mask, w = random_batch(seed=seed, per_token_adv=per_token_adv)
        kw = dict(beta=0.04, aggregation=aggregation)
        loss, m = cispo_loss(logp, old, ref, adv, mask, min_ratio=lo, max_ratio=hi, is_weights=w, **kw)
        close(loss, cispo_reference(logp, old, ref, adv, mask, lo=lo, hi=hi, w=w, **kw), logp)
        if hi < 2:
            assert m["clip_frac_high"] > 0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_entropy_bonus_matches_loop(aggregation):
    logp, _, _, _, mask, _ = random_batch(seed=3)
    h = (-logp * 0.7).detach().requires_grad_(True)  # any differentiable (B, T) entropy
    term, m = entropy_bonus(h, mask, coef=0.01, aggregation=aggregation)
    rows = [[h[i, t] for t in range(mask.shape[1]) if mask[i, t] != 0] for i in range(mask.shape[0])]
    slow = -0.01 * loop_aggregate(rows, aggregation, mask.shape[1])
    close(term, slow, h)
    assert m["entropy_bonus"] == pytest.approx(term.item()) and m["entropy"] == pytest.approx(-term.item() / 0.01)
    zero, _ = entropy_bonus(h, mask, coef=0.0, aggregation=aggregation)
    assert zero.item() == 0.0


def test_gspo_equals_grpo_when_every_output_has_one_token():
    """|o_i| = 1: the sequence ratio is the token ratio, GSPO is GRPO (value and gradient)."""
    logp, old, ref, adv, _, _ = random_batch(B=8, T=1, seed=5)
    mask = torch.ones(8, 1, dtype=torch.float64)
    kw = dict(clip_eps=0.1, clip_eps_high=0.2, beta=0.04, aggregation="token-mean")
    a, _ = gspo_loss(logp, old, ref, adv, mask, **kw)
    b, _ = grpo_loss(logp, old, ref, adv, mask, **kw)
    close(a, b, logp)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_policy_gradients_equal_grpo(aggregation):
    """pi_old = pi_theta: GSPO (per-output advantages, seq-mean-token-mean) and CISPO (any aggregation) give GRPO's
    gradient, -A grad logp aggregated."""
    logp, _, ref, adv, mask, _ = random_batch(seed=6)
    old = logp.detach().clone()
    (g_grpo,) = torch.autograd.grad(
        grpo_loss(logp, old, ref, adv, mask, clip_eps=0.2, beta=0.04, aggregation=aggregation)[0], logp
    )
    (g_cispo,) = torch.autograd.grad(
        cispo_loss(logp, old, ref, adv, mask, max_ratio=1.2, beta=0.04, aggregation=aggregation)[0], logp
    )
    assert torch.allclose(g_cispo, g_grpo, atol=1e-12)
    (g_gspo,) = torch.autograd.grad(
        gspo_loss(logp, old, ref, adv, mask, clip_eps=0.2, beta=0.04, aggregation=aggregation)[0], logp
    )
    assert torch.allclose(g_gspo, g_grpo, atol=1e-12)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_microbatch_accumulation_equals_one_batch(aggregation):
    B, T = 10, 7
    logp, old, ref, adv, mask, w = random_batch(B=B, T=T, seed=7)
    h = (-logp * 0.5).detach()
    norm = LossNormalizer.from_mask(mask, max_len=12)

    def total(lp, ent, idx):
        a, _ = gspo_loss(
            lp,
            old[idx],
            ref[idx],
            adv[idx],
            mask[idx],
            clip_eps=0.2,
            beta=0.04,
            aggregation=aggregation,
            normalizer=norm,
            is_weights=w[idx],
        )
        b, _ = cispo_loss(
            lp,
            old[idx],
            ref[idx],
            adv[idx],
            mask[idx],
            max_ratio=1.3,
            beta=0.04,
            aggregation=aggregation,
            normalizer=norm,
            is_weights=w[idx],
        )
        c, _ = entropy_bonus(ent, mask[idx], coef=0.01, aggregation=aggregation, normalizer=norm)
        return a + b + c

    lp, ent = logp.detach().clone().requires_grad_(True), h.clone().requires_grad_(True)
    full = total(lp, ent, torch.arange(B))
    g_full = torch.autograd.grad(full, [lp, ent])
    acc = [torch.zeros_like(logp), torch.zeros_like(h)]
    s = 0.0
    for idx in torch.arange(B).chunk(3):
        lp_k, ent_k = logp.detach()[idx].clone().requires_grad_(True), h[idx].clone().requires_grad_(True)
        part = total(lp_k, ent_k, idx)
        gk = torch.autograd.grad(part, [lp_k, ent_k])
        acc[0][idx] += gk[0]
        acc[1][idx] += gk[1]
        s += part.item()
    assert abs(s - full.item()) < 1e-10
    assert torch.allclose(acc[0], g_full[0], atol=1e-10) and torch.allclose(acc[1], g_full[1], atol=1e-10)


def test_bad_arguments():
    logp, old, ref, adv, mask, _ = random_batch()
    with pytest.raises(ValueError, match="ref_logprobs"):
        gspo_loss(logp, old, None, adv, mask, clip_eps=0.2, beta=0.04)
    with pytest.raises(ValueError, match="min_ratio"):
        cispo_loss(logp, old, None, adv, mask, min_ratio=2.0, max_ratio=1.0, beta=0.0)
    with pytest.raises(ValueError, match="shapes"):
        entropy_bonus(logp[:, :-1], mask, coef=0.1)

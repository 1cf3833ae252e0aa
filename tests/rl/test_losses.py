"""grpo_loss against a loop-based reference (value and gradient, every aggregation), hand-computed
cases, and micro-batch gradient accumulation."""

from __future__ import annotations

import math

import pytest
import torch

from stages.rl.losses import AGGREGATIONS, LossNormalizer, grpo_loss, k3_kl

torch.set_num_threads(1)


def slow_reference(logp, old, ref, adv, mask, *, clip_eps, clip_eps_high, beta, aggregation, max_len=None):
    """Python loops over sequences and tokens, one scalar at a time (no vectorised reductions)."""
    B, T = mask.shape
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    L = T if max_len is None else max_len
    seq_terms = []
    tok_terms = []
    for i in range(B):
        toks = []
        for t in range(T):
            if mask[i, t] == 0:
                continue
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            rho = torch.exp(logp[i, t] - old[i, t])
            c = min(max(rho.item(), 1 - clip_eps), 1 + eps_hi)
            # clip keeps the gradient only inside the interval, as torch.clamp does
            clipped = rho if 1 - clip_eps <= rho.item() <= 1 + eps_hi else torch.tensor(c, dtype=logp.dtype)
            obj = torch.minimum(rho * a, clipped * a)
            term = -obj
            if beta != 0:
                d = ref[i, t] - logp[i, t]
                term = term + beta * (torch.exp(d) - d - 1)
            toks.append(term)
        if toks:
            s = toks[0]
            for x in toks[1:]:
                s = s + x
            seq_terms.append((s, len(toks)))
            tok_terms.extend(toks)
    n_seq = len(seq_terms)
    if aggregation == "seq-mean-token-mean":
        total = seq_terms[0][0] / seq_terms[0][1]
        for s, n in seq_terms[1:]:
            total = total + s / n
        return total / n_seq
    total = tok_terms[0]
    for x in tok_terms[1:]:
        total = total + x
    if aggregation == "token-mean":
        return total / len(tok_terms)
    return total / (n_seq * L)


def random_batch(B=6, T=9, seed=0, per_token_adv=False, off_policy=True):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = (logp.detach() + (torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3 if off_policy else 0))
    ref = logp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) if per_token_adv else torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[0, 0] = 0.0  # a masked (tool-output-like) token inside a sequence
    mask[1] = 0.0  # a wholly excluded output
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("clip_eps_high", [None, 0.28])
def test_value_and_gradient_match_loop_reference(aggregation, per_token_adv, clip_eps_high):
    for seed in range(3):
        logp, old, ref, adv, mask = random_batch(seed=seed, per_token_adv=per_token_adv)
        kw = dict(clip_eps=0.2, clip_eps_high=clip_eps_high, beta=0.04, aggregation=aggregation)
        loss, _ = grpo_loss(logp, old, ref, adv, mask, **kw)
        (g_fast,) = torch.autograd.grad(loss, logp)
        ref_loss = slow_reference(logp, old, ref, adv, mask, **kw)
        (g_slow,) = torch.autograd.grad(ref_loss, logp)
        assert abs(loss.item() - ref_loss.item()) < 1e-6
        assert torch.allclose(g_fast, g_slow, atol=1e-6, rtol=0)
        assert g_fast.abs().sum() > 0  # the comparison is not trivially between zeros
        assert torch.all(g_fast[mask == 0] == 0)  # masked tokens get no gradient, from loss or KL


def test_dr_grpo_uses_max_len_from_normalizer():
    logp, old, ref, adv, mask = random_batch(seed=5)
    kw = dict(clip_eps=0.2, clip_eps_high=None, beta=0.04, aggregation="seq-mean-token-sum-norm")
    loss, _ = grpo_loss(logp, old, ref, adv, mask, normalizer=LossNormalizer.from_mask(mask, max_len=64), **kw)
    ref_loss = slow_reference(logp, old, ref, adv, mask, max_len=64, **kw)
    assert abs(loss.item() - ref_loss.item()) < 1e-9


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_equal_rewards_give_zero_policy_gradient(aggregation):
    """All-equal rewards -> advantages 0 -> with beta = 0 the loss and its gradient are exactly 0."""
    from stages.rl.advantages import outcome_advantages

    logp, old, ref, _, mask = random_batch(seed=1)
    adv = outcome_advantages(torch.full((1, 6), 0.7, dtype=torch.float64)).advantages[0]
    assert torch.all(adv == 0)
    loss, m = grpo_loss(logp, old, None, adv, mask, clip_eps=0.2, beta=0.0, aggregation=aggregation)
    (g,) = torch.autograd.grad(loss, logp)
    assert loss.item() == 0.0 and torch.all(g == 0)
    assert m["kl"] == 0.0


def test_hand_computed_single_token():
    """B=1, T=1: logp=log 0.5, old=log 0.25 -> rho=2, A=1, eps=0.2 -> clipped 1.2; loss = -1.2 + beta*k3."""
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.float64)
    loss, m = grpo_loss(logp, old, ref, torch.tensor([1.0], dtype=torch.float64), mask, clip_eps=0.2, beta=0.1)
    k3 = 0.5 - math.log(0.5) - 1  # pi_ref/pi = 0.5
    assert abs(loss.item() - (-1.2 + 0.1 * k3)) < 1e-12
    assert m["clip_frac_high"] == 1.0 and m["clip_frac_low"] == 0.0
    (g,) = torch.autograd.grad(loss, logp)
    # surrogate is clipped (no gradient); d/dlogp of k3 = -exp(ref-logp) + 1 = 0.5
    assert abs(g.item() - 0.1 * 0.5) < 1e-12


def test_hand_computed_two_sequences_aggregations():
    """On-policy (rho = 1), beta = 0: per-token loss is -A. Seq 0: 2 tokens, A=1; seq 1: 1 token, A=-2."""
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    out = {}
    for agg in AGGREGATIONS:
        loss, _ = grpo_loss(logp, logp.detach(), None, adv, mask, clip_eps=0.2, beta=0.0, aggregation=agg)
        out[agg] = loss.item()
    assert out["seq-mean-token-mean"] == pytest.approx(((-1 - 1) / 2 + 2 / 1) / 2)  # 0.5
    assert out["token-mean"] == pytest.approx((-1 - 1 + 2) / 3)  # 0
    assert out["seq-mean-token-sum-norm"] == pytest.approx((-1 - 1 + 2) / (2 * 3))  # 0


def test_ratio_exactly_one_on_policy():
    logp, _, ref, adv, mask = random_batch(seed=2)
    loss, m = grpo_loss(logp, logp.detach().clone(), ref, adv, mask, clip_eps=0.2, beta=0.04)
    assert m["ratio_mean"] == 1.0
    assert m["clip_frac_low"] == 0.0 and m["clip_frac_high"] == 0.0
    # on-policy the policy term equals -(seq-mean of the per-sequence token mean of A)
    keep = mask.sum(-1) > 0
    assert m["pg_loss"] == pytest.approx(-(adv[keep]).mean().item(), abs=1e-12)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("k", [2, 3, 5])
def test_microbatch_accumulation_equals_one_batch(aggregation, k):
    B, T = 10, 7
    logp, old, ref, adv, mask = random_batch(B=B, T=T, seed=7)
    norm = LossNormalizer.from_mask(mask, max_len=12)
    kw = dict(clip_eps=0.2, clip_eps_high=0.3, beta=0.04, aggregation=aggregation)
    full, _ = grpo_loss(logp, old, ref, adv, mask, normalizer=norm, **kw)
    (g_full,) = torch.autograd.grad(full, logp)
    g_acc = torch.zeros_like(logp)
    total = 0.0
    for idx in torch.arange(B).chunk(k):
        lp = logp.detach()[idx].clone().requires_grad_(True)
        part, _ = grpo_loss(lp, old[idx], ref[idx], adv[idx], mask[idx], normalizer=norm, **kw)
        part.backward()
        g_acc[idx] += lp.grad
        total += part.item()
    assert abs(total - full.item()) < 1e-6
    assert torch.allclose(g_acc, g_full, atol=1e-6, rtol=0)


def test_microbatch_without_global_normalizer_differs():
    """The normaliser matters: per-micro-batch token-mean counts give a different gradient (the TRL/verl bug)."""
    logp, old, ref, adv, mask = random_batch(B=10, T=7, seed=7)
    kw = dict(clip_eps=0.2, beta=0.04, aggregation="token-mean")
    full, _ = grpo_loss(logp, old, ref, adv, mask, **kw)
    (g_full,) = torch.autograd.grad(full, logp)
    g_acc = torch.zeros_like(logp)
    chunks = torch.arange(10).chunk(2)
    for idx in chunks:
        lp = logp.detach()[idx].clone().requires_grad_(True)
        part, _ = grpo_loss(lp, old[idx], ref[idx], adv[idx], mask[idx], **kw)
        (part / len(chunks)).backward()
        g_acc[idx] += lp.grad
    assert not torch.allclose(g_acc, g_full, atol=1e-6)


def test_k3_nonnegative_and_zero_at_equality():
    x = torch.randn(100, dtype=torch.float64)
    y = torch.randn(100, dtype=torch.float64)
    assert torch.all(k3_kl(x, y) >= 0)
    assert torch.all(k3_kl(x, x) == 0)


def test_beta_needs_ref():
    logp, old, _, adv, mask = random_batch()
    with pytest.raises(ValueError):
        grpo_loss(logp, old, None, adv, mask, clip_eps=0.2, beta=0.04)

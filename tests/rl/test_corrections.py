"""stages.rl.corrections (rollout IS correction: TIS / MIS, token / sequence) against a scalar loop reference, and
hand-computed cases. TRL's implementation on the same tensors: tests/benchmarks/test_rl_math_vs_trl.py."""

from __future__ import annotations

import math

import pytest
import torch

from stages.rl.corrections import IS_METHODS, correct, log_ratio, method_kwargs, rollout_correction
from stages.rl.losses import grpo_loss

torch.set_num_threads(1)


def batch(B=6, T=8, seed=0, spread=0.4, nan=True):
    g = torch.Generator().manual_seed(seed)
    trainer = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    sampler = trainer + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mask[0, 0] = 0.0  # a tool-output token inside a sequence
    mask[1] = 0.0  # an output with no loss token
    if nan:
        sampler[2, 0] = math.nan  # a token the sampler could not score
    return trainer, sampler, mask


def loop_reference(
    trainer, sampler, mask, *, weight_level, truncate_low, truncate_high, reject_level, reject_low, reject_high
):
    """Scalars and Python loops: weights, keep and the metrics of rollout_correction."""
    B, T = mask.shape

    def delta(i, t):
        d = float(trainer[i, t]) - float(sampler[i, t])
        return 0.0 if math.isnan(d) else d

    def ratio(level, i, t):
        toks = [t2 for t2 in range(T) if mask[i, t2] != 0]
        if level == "token":
            return math.exp(delta(i, t))
        s = sum(delta(i, t2) for t2 in toks)
        if level == "geometric":
            s = s / max(len(toks), 1)
        return math.exp(s)

    W = [[0.0] * T for _ in range(B)]
    K = [[False] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if mask[i, t] == 0:
                continue
            w = 1.0 if weight_level is None else ratio(weight_level, i, t)
            if truncate_low is not None:
                w = max(w, truncate_low)
            if truncate_high is not None:
                w = min(w, truncate_high)
            keep = True
            if reject_level is not None:
                r = ratio(reject_level, i, t)
                keep = (reject_low is None or r >= reject_low) and (reject_high is None or r <= reject_high)
            K[i][t] = keep
            W[i][t] = w if keep else 0.0
    level = weight_level or reject_level or "token"
    rows = [i for i in range(B) if any(mask[i, t] != 0 for t in range(T))]
    if level == "token":
        units = [(i, t) for i in range(B) for t in range(T) if mask[i, t] != 0]
    else:
        units = [(i, next(t for t in range(T) if mask[i, t] != 0)) for i in rows]
    raw_level = weight_level or reject_level
    raws = [ratio(raw_level, i, t) if raw_level else 1.0 for i, t in units]
    if level == "token":
        finals = [W[i][t] for i, t in units]
    else:
        finals = [max(W[i][t] for t in range(T)) for i in rows]
    n = len(units)
    mean = sum(raws) / n
    m = {
        "is_ratio_mean": mean,
        "is_ratio_min": min(raws),
        "is_ratio_max": max(raws),
        "is_ratio_std": math.sqrt(sum((x - mean) ** 2 for x in raws) / n),
        "is_weight_mean": sum(finals) / n,
        "is_weight_min": min(finals),
        "is_weight_max": max(finals),
    }
    sq = sum(x * x for x in finals)
    m["is_ess"] = sum(finals) ** 2 / (n * sq) if sq > 0 else 0.0
    trunc_raw = [ratio(weight_level, i, t) for i, t in units] if weight_level else []
    m["is_truncated_low_frac"] = (
        sum(x < truncate_low for x in trunc_raw) / n if weight_level and truncate_low is not None else 0.0
    )
    m["is_truncated_high_frac"] = (
        sum(x > truncate_high for x in trunc_raw) / n if weight_level and truncate_high is not None else 0.0
    )
    toks = [(i, t) for i in range(B) for t in range(T) if mask[i, t] != 0]
    m["is_rejected_token_frac"] = sum(not K[i][t] for i, t in toks) / len(toks)
    m["is_rejected_seq_frac"] = sum(any(mask[i, t] != 0 and not K[i][t] for t in range(T)) for i in rows) / len(rows)
    ds = [float(trainer[i, t]) - float(sampler[i, t]) for i, t in toks]
    ds = [d for d in ds if not math.isnan(d)]
    m["mismatch_log_ratio_mean"] = sum(ds) / len(ds)
    m["mismatch_k3"] = sum(math.exp(d) - d - 1 for d in ds) / len(ds)
    m["mismatch_abs_mean"] = sum(abs(d) for d in ds) / len(ds)
    m["mismatch_abs_max"] = max(abs(d) for d in ds)
    m["n_nan_sampler"] = float(sum(math.isnan(float(trainer[i, t]) - float(sampler[i, t])) for i, t in toks))
    return torch.tensor(W, dtype=torch.float64), torch.tensor(K), m


CASES = [method_kwargs(m, 0.7, 1.4) for m in IS_METHODS] + [
    method_kwargs("tis", None, 2.0),  # verl rollout_is: token (upper bound only)
    method_kwargs("seq-tis", None, 2.0),  # verl rollout_is: sequence
    method_kwargs("mis", 0.7, None),  # TRL *_mask with clip_max None
    {"weight_level": None, "reject_level": "geometric", "reject_low": 0.9, "reject_high": 1.1},  # verl rollout_rs
    {"weight_level": "geometric", "truncate_low": 0.8, "truncate_high": 1.25},
    {"weight_level": "token"},  # the raw ratio, no truncation, no rejection
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_matches_loop_reference(kw):
    for seed in range(3):
        trainer, sampler, mask = batch(seed=seed)
        c = rollout_correction(trainer, sampler, mask, **kw)
        w, k, m = loop_reference(
            trainer,
            sampler,
            mask,
            **{
                **dict.fromkeys(
                    ("weight_level", "truncate_low", "truncate_high", "reject_level", "reject_low", "reject_high")
                ),
                "weight_level": kw.get("weight_level"),
                **kw,
            },
        )
        assert torch.allclose(c.weights, w, atol=1e-12, rtol=1e-12)
        assert torch.equal(c.keep, k)
        assert c.metrics.keys() == m.keys()
        for name, v in m.items():
            assert c.metrics[name] == pytest.approx(v, abs=1e-12, rel=1e-12), name
        assert not c.weights.requires_grad


def test_weights_are_detached_and_zero_outside_the_mask():
    trainer, sampler, mask = batch(seed=4, nan=False)
    t = trainer.clone().requires_grad_(True)
    c = correct("seq-tis", t, sampler, mask, low=0.5, high=2.0)
    assert not c.weights.requires_grad
    assert torch.all(c.weights[mask == 0] == 0)
    assert torch.all(c.weights[mask != 0] > 0)


def test_hand_computed_sequence_and_geometric_ratios():
    """Two loss tokens with ratios 0.4 / 0.2 = 2 and 0.3 / 0.3 = 1: sequence ratio 2, geometric mean sqrt(2)."""
    trainer = torch.tensor([[math.log(0.4), math.log(0.3), 0.0]], dtype=torch.float64)
    sampler = torch.tensor([[math.log(0.2), math.log(0.3), 5.0]], dtype=torch.float64)  # 3rd token is padding
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(
        log_ratio(trainer, sampler, mask, "token"), torch.tensor([[math.log(2), 0.0, 0.0]], dtype=torch.float64)
    )
    assert log_ratio(trainer, sampler, mask, "sequence").item() == pytest.approx(math.log(2))
    assert log_ratio(trainer, sampler, mask, "geometric").item() == pytest.approx(math.log(2) / 2)
    c = correct("seq-tis", trainer, sampler, mask, low=None, high=1.5)
    assert c.weights.tolist() == [[1.5, 1.5, 0.0]]
    assert c.metrics["is_truncated_high_frac"] == 1.0 and c.metrics["is_ratio_max"] == pytest.approx(2.0)
    c = correct("seq-mask-tis", trainer, sampler, mask, low=0.5, high=1.5)  # geo sqrt 2 inside: token weights 2, 1
    assert c.weights[0].tolist() == pytest.approx([2.0, 1.0, 0.0])
    c = correct("seq-mask-tis", trainer, sampler, mask, low=0.5, high=1.4)  # geo 1.414 > 1.4: the sequence goes
    assert c.weights.tolist() == [[0.0, 0.0, 0.0]] and c.metrics["is_rejected_seq_frac"] == 1.0
    c = correct("mis", trainer, sampler, mask, low=0.5, high=1.5)  # token 0 (ratio 2) rejected, token 1 kept
    assert c.weights.tolist() == [[0.0, 1.0, 0.0]] and c.keep.tolist() == [[False, True, False]]
    assert c.metrics["is_rejected_token_frac"] == 0.5 and c.metrics["is_ess"] == pytest.approx(0.5)


def test_identical_policies_give_unit_weights():
    trainer, _, mask = batch(seed=1, nan=False)
    for method in IS_METHODS:
        c = correct(method, trainer, trainer.clone(), mask, low=0.99, high=1.01)
        assert torch.equal(c.weights, mask) and c.metrics["is_ess"] == 1.0
        assert c.metrics["mismatch_k3"] == 0.0 and c.metrics["is_rejected_token_frac"] == 0.0


def test_overflowing_sequence_ratio_is_truncated_or_rejected_not_inf():
    T = 64
    trainer = torch.zeros(1, T)
    sampler = torch.full((1, T), -3.0)  # float32 sequence log ratio 192: exp overflows to inf
    mask = torch.ones(1, T)
    assert torch.isinf(torch.exp(log_ratio(trainer, sampler, mask, "sequence"))).all()
    assert correct("seq-tis", trainer, sampler, mask, low=None, high=3.0).weights.eq(3.0).all()
    assert correct("seq-mis", trainer, sampler, mask, low=None, high=3.0).weights.eq(0.0).all()


def test_weights_compose_with_the_loss_as_a_policy_term_factor():
    """grpo_loss(is_weights=w) == the policy term times w, token by token, plus the unweighted KL."""
    trainer, sampler, mask = batch(seed=2, nan=False)
    c = correct("tis", trainer, sampler, mask, low=0.5, high=2.0)
    g = torch.Generator().manual_seed(9)
    lp = (trainer + 0.05 * torch.randn(trainer.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = trainer + 0.1
    adv = torch.randn(mask.shape[0], generator=g, dtype=torch.float64)
    kw = dict(clip_eps=0.2, beta=0.04, aggregation="token-mean")
    loss_w, _ = grpo_loss(lp, trainer, ref, adv, mask, is_weights=c.weights, **kw)
    # the same loss by hand from the unweighted pieces
    ratio = torch.exp(lp - trainer)
    pg = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    expect = ((pg * c.weights + 0.04 * kl) * mask).sum() / mask.sum()
    assert loss_w.item() == pytest.approx(expect.item(), abs=1e-12)
    (g1,) = torch.autograd.grad(loss_w, lp)
    (g2,) = torch.autograd.grad(expect, lp)
    assert torch.allclose(g1, g2, atol=1e-12)


def test_bad_arguments():
    trainer, sampler, mask = batch(seed=0)
    with pytest.raises(ValueError, match="low"):
        rollout_correction(trainer, sampler, mask, truncate_low=2.0, truncate_high=1.0)
    with pytest.raises(ValueError, match="weight_level"):
        rollout_correction(trainer, sampler, mask, weight_level="tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown rollout correction 'icepop'"):
        correct("icepop", trainer, sampler, mask, low=0.5, high=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shapes"):
        rollout_correction(trainer[:, :-1], sampler, mask)

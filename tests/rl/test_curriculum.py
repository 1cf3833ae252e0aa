"""stages.rl.curriculum (pass-rate curriculum) against loop references: the rate update, the pools (prime-rl's
DifficultyPoolSampler's inclusive thresholds), the sampling distribution, determinism and the fill rule."""

from __future__ import annotations

import math

import pytest
import torch

from stages.rl.curriculum import (
    CurriculumConfig,
    curriculum_sample,
    group_pass_rate,
    pass_rate_weights,
    pools,
    update_pass_rates,
    weighted_sample,
)

NAN = math.nan


def test_group_pass_rate_ignores_unscored_outputs():
    correct = torch.tensor([[1.0, 0.0, NAN, 1.0], [NAN, NAN, NAN, NAN], [0.0, 0.0, 0.0, 0.0]])
    out = group_pass_rate(correct)
    assert out[0].item() == pytest.approx(2 / 3) and math.isnan(out[1].item()) and out[2].item() == 0.0


def test_update_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    rates = torch.full((10,), NAN, dtype=torch.float64)
    ref = [NAN] * 10
    for step in range(20):
        idx = torch.randint(0, 10, (4,), generator=g)  # repeats inside a step allowed
        acc = torch.randint(0, 5, (4,), generator=g).double() / 4
        acc[step % 4] = NAN if step % 5 == 0 else acc[step % 4]
        rates = update_pass_rates(rates, idx, acc, ema=0.3)
        for i, a in zip(idx.tolist(), acc.tolist(), strict=True):
            if math.isnan(a):
                continue
            ref[i] = a if math.isnan(ref[i]) else 0.3 * a + 0.7 * ref[i]
    got = rates.tolist()
    assert all((math.isnan(x) and math.isnan(y)) or abs(x - y) < 1e-12 for x, y in zip(got, ref, strict=True))
    assert sum(not math.isnan(x) for x in got) >= 5


def test_update_is_pure_and_ema_one_keeps_the_latest():
    rates = torch.tensor([0.5, NAN], dtype=torch.float64)
    new = update_pass_rates(rates, torch.tensor([0, 1]), torch.tensor([1.0, 0.25]), ema=1.0)
    assert new.tolist() == [1.0, 0.25] and rates[0].item() == 0.5 and math.isnan(rates[1].item())


def test_pools_and_weights_at_the_thresholds():
    """prime-rl's pools: each threshold is an inclusive maximum; here hard <= low, easy >= high."""
    cfg = CurriculumConfig(low=0.25, high=0.75, hard_weight=0.2, easy_weight=0.3, normal_weight=1.0, unseen_weight=0.9)
    rates = torch.tensor([NAN, 0.0, 0.25, 0.26, 0.74, 0.75, 1.0], dtype=torch.float64)
    assert pools(rates, cfg).tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert pass_rate_weights(rates, cfg).tolist() == [0.9, 0.2, 0.2, 1.0, 1.0, 0.3, 0.3]


def test_sampling_is_deterministic_distinct_and_changes_with_step():
    cfg = CurriculumConfig()
    rates = torch.tensor([NAN, 0.0, 1.0, 0.5] * 10, dtype=torch.float64)
    a, m = curriculum_sample(rates, 12, cfg, seed=3, step=7)
    b, _ = curriculum_sample(rates.clone(), 12, cfg, seed=3, step=7)
    c, _ = curriculum_sample(rates, 12, cfg, seed=3, step=8)
    assert a == b and a != c and len(set(a)) == 12
    assert sum(m[f"sampled_{p}"] for p in ("unseen", "hard", "normal", "easy")) == 12
    assert m["pool_unseen"] == m["pool_hard"] == m["pool_easy"] == m["pool_normal"] == 10


def test_single_draw_probabilities_follow_the_weights():
    """n = 1: P(i) = w_i / sum w exactly (Efraimidis-Spirakis); 8000 seeded draws within 4.5 sigma of it."""
    w = [0.25, 0.5, 1.0, 1.0, 0.0]
    p = [x / sum(w) for x in w]
    n = 8000
    counts = [0] * len(w)
    for key in range(n):
        counts[weighted_sample(w, 1, key)[0]] += 1
    assert counts[-1] == 0
    for c, q in zip(counts[:-1], p[:-1], strict=True):
        assert abs(c - n * q) < 4.5 * math.sqrt(n * q * (1 - q)), (counts, p)


def test_inclusion_frequencies_match_successive_sampling():
    """n = 2 of 4: P(i in sample) against the exact successive-sampling probability, by enumeration of the ordered
    pairs (P(i then j) = w_i / W * w_j / (W - w_i))."""
    w = [0.2, 0.6, 1.0, 1.0]
    tot = sum(w)
    exact = [0.0] * 4
    for i in range(4):
        for j in range(4):
            if i != j:
                pij = w[i] / tot * w[j] / (tot - w[i])
                exact[i] += pij
                exact[j] += pij
    n = 8000
    counts = [0] * 4
    for key in range(n):
        for i in weighted_sample(w, 2, key):
            counts[i] += 1
    for c, q in zip(counts, exact, strict=True):
        assert abs(c - n * q) < 4.5 * math.sqrt(n * q * (1 - q)), (counts, exact)


def test_zero_weight_pools_are_avoided_then_filled():
    cfg = CurriculumConfig(hard_weight=0.0, easy_weight=0.0)
    rates = torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 0.3], dtype=torch.float64)
    idx, m = curriculum_sample(rates, 2, cfg, seed=0, step=0)
    assert sorted(idx) == [2, 5] and m["n_filled"] == 0
    idx, m = curriculum_sample(rates, 4, cfg, seed=0, step=0)
    assert set(idx[:2]) == {2, 5} and len(set(idx)) == 4 and m["n_filled"] == 2


def test_bad_config_and_arguments():
    with pytest.raises(ValueError, match="low"):
        CurriculumConfig(low=0.8, high=0.2)
    with pytest.raises(ValueError, match="ema"):
        CurriculumConfig(ema=0.0)
    with pytest.raises(ValueError, match="hard_weight"):
        CurriculumConfig(hard_weight=-1.0)
    with pytest.raises(ValueError, match="n="):
        curriculum_sample(torch.zeros(3, dtype=torch.float64), 4, CurriculumConfig(), seed=0, step=0)
    with pytest.raises(ValueError, match="outside"):
        update_pass_rates(torch.zeros(3), torch.tensor([3]), torch.tensor([1.0]), ema=1.0)

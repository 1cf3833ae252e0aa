"""Standard errors and the paired bootstrap (stages/core/stats.py) against the statistics module and scipy."""

from __future__ import annotations

import math
import random

import pytest

from stages.core.stats import mean_se, paired_bootstrap


def test_mean_se_against_the_statistics_module() -> None:
    import statistics

    xs = [random.Random(3).random() for _ in range(50)]
    m, se = mean_se(xs)
    assert m == pytest.approx(statistics.fmean(xs)) and se == pytest.approx(statistics.stdev(xs) / math.sqrt(50))
    assert mean_se([]) == (0.0, 0.0) and mean_se([0.5]) == (0.5, 0.0)
    # a 0/1 vector: the binomial standard error sqrt(p (1 - p) / (n - 1))
    assert mean_se([1.0] * 30 + [0.0] * 70)[1] == pytest.approx(math.sqrt(0.3 * 0.7 / 99))


def test_paired_bootstrap_against_scipy() -> None:
    """The interval against scipy.stats.bootstrap (paired, percentile method) on the same per-problem scores: the two
    resample differently, so they agree to Monte-Carlo error (0.005 on a difference of ~0.07 with 20k resamples)."""
    from scipy.stats import bootstrap

    rng = random.Random(0)
    a = [float(rng.random() < 0.45) for _ in range(500)]
    b = [float(x or rng.random() < 0.12) for x in a]  # b is a better on a tenth of the problems
    ours = paired_bootstrap(a, b, resamples=20_000, seed=1)
    ref = bootstrap((a, b), lambda x, y, axis=-1: (y - x).mean(axis=axis), paired=True, vectorized=True,
                    n_resamples=20_000, method="percentile", confidence_level=0.95, random_state=2)
    assert ours["diff"] == pytest.approx(sum(b) / 500 - sum(a) / 500)
    assert ours["lo"] == pytest.approx(ref.confidence_interval.low, abs=0.005)
    assert ours["hi"] == pytest.approx(ref.confidence_interval.high, abs=0.005)
    assert ours["se"] == pytest.approx(ref.standard_error, rel=0.05)
    assert ours["beyond_noise"] and ours["p_value"] < 0.01


def test_paired_bootstrap_sees_noise_as_noise() -> None:
    rng = random.Random(4)
    a = [float(rng.random() < 0.5) for _ in range(300)]
    b = [float(rng.random() < 0.5) if rng.random() < 0.1 else x for x in a]  # a few re-draws: no real change
    r = paired_bootstrap(a, b, resamples=4000, seed=0)
    assert r["lo"] <= 0 <= r["hi"] and not r["beyond_noise"] and r["p_value"] > 0.05
    with pytest.raises(ValueError, match="same problems"):
        paired_bootstrap([1.0], [1.0, 0.0])

"""Statistics over problems, shared by the evaluate stage and the report: the standard error of a mean score and the
paired bootstrap that compares two models on the same problems. Pure functions; numpy only inside the bootstrap."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean): ``sd / sqrt(n)`` with the unbiased sample variance; SE 0 below 2 values.

    Over problems, this is the standard error of a benchmark score (a greedy accuracy, avg@n, pass@k) as an estimate
    of the model's expected score on problems like these: it includes both the problem-to-problem spread and, for
    sampled metrics, the sampling noise of each problem's estimate.
    """
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    m = math.fsum(values) / n
    if n < 2:
        return m, 0.0
    var = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, resamples: int = 2000, seed: int = 0,
                     confidence: float = 0.95) -> dict[str, float | int | bool]:
    """The paired bootstrap over problems of ``mean(b) - mean(a)`` (``a[i]`` and ``b[i]``: two models' scores on
    problem i).

    Draws ``resamples`` sets of problem indices with replacement (numpy's PCG64 seeded with ``seed``), takes the
    mean per-problem difference of each, and returns ``diff`` (the observed difference), ``lo`` / ``hi`` (the
    percentile interval at ``confidence``), ``se`` (the bootstrap standard deviation), ``p_value`` (two-sided: twice
    the smaller share of resampled differences on either side of 0, at most 1), ``n`` and ``beyond_noise`` (the
    interval excludes 0). Pairing removes the problem-difficulty variance two models share, so the interval is far
    narrower than two unpaired standard errors.
    """
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap: {len(a)} scores against {len(b)} (the same problems are needed)")
    if not a:
        raise ValueError("paired_bootstrap: no problems")
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    rng = np.random.Generator(np.random.PCG64(seed))
    chunk = max(1, 2_000_000 // len(d))  # at most ~16 MB of indices at once
    means = np.concatenate([d[rng.integers(0, len(d), size=(min(chunk, resamples - i), len(d)))].mean(axis=1)
                            for i in range(0, resamples, chunk)])
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    p = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    return {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "se": float(means.std(ddof=1)),
            "p_value": p, "n": len(d), "beyond_noise": bool(lo > 0 or hi < 0)}

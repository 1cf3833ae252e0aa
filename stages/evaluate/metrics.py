"""Evaluation statistics: pass@k (unbiased, from n samples), maj@k (majority voting over k-subsets), avg@n, standard
errors over problems, and the paired bootstrap over problems that compares two models.

pass@k and maj@k are per-problem functions; a benchmark's score is their mean over problems, and its standard error
is the sample standard deviation of the per-problem values over sqrt(number of problems) (:func:`mean_se`).

- pass@k (Chen et al. 2021, the Codex paper, eq. 1): with ``n`` samples of which ``c`` are correct,
  ``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that a random k-subset of the n samples holds
  at least one correct one. Computed as a running product, which never overflows.
- maj@k: the accuracy of majority voting over ``k`` samples, averaged over k-subsets of the ``n``
  samples (all of them when there are at most ``max_subsets``, else ``max_subsets`` drawn at random
  without replacement). Votes go to *answer classes* (:func:`answer_classes`): every sample judged right is in
  one class (right answers are equivalent to the gold, hence to one another), the others are grouped by a
  canonical key of their answer (:func:`stages.core.answers.answer_key`: numbers by value, lists sorted, ...),
  computed without any pairwise check, so maj@64 over 64 adversarial answers costs 64 checks against the gold
  (each under its deadline), not 64 x 63 / 2. A sample with no extracted answer does not vote. A subset in which
  nobody votes scores 0; a tie between classes scores the fraction of tied classes that are correct (the expected
  accuracy of breaking the tie uniformly at random).
- avg@n: the mean correctness of the n samples of a problem (pass@1 from n samples), with its standard error.
- Standard errors and the paired bootstrap over problems (:func:`mean_se`, :func:`paired_bootstrap`) are in
  :mod:`stages.core.stats` (the report uses them too), re-exported here.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from stages.core.stats import mean_se, paired_bootstrap

__all__ = ["answer_classes", "default_ks", "maj_at_k", "majority_correct", "mean_se", "paired_bootstrap", "pass_at_k",
           "sample_metrics"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, eq. 1).

    ``n`` samples, ``c`` of them correct, ``1 <= k <= n``. Uses the product form
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which is exact in rational arithmetic and stable in floats.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def answer_classes(keys: Sequence[str | None], correct: Sequence[bool]) -> list[int | None]:
    """Each sample's answer class (None: no answer, it does not vote). Samples judged right form one class (class 0
    when there is one); the others share a class when their answer keys are equal."""
    if len(keys) != len(correct):
        raise ValueError("keys and correct must have the same length")
    ids: dict[object, int] = {}
    out: list[int | None] = []
    for k, ok in zip(keys, correct, strict=True):
        if ok:
            out.append(ids.setdefault(("right",), len(ids)))
        elif k is None:
            out.append(None)
        else:
            out.append(ids.setdefault(("key", k), len(ids)))
    return out


def majority_correct(classes: Sequence[int | None], class_correct: Sequence[bool]) -> float:
    """Score of majority voting among the given samples' classes (None does not vote).

    1 or 0, or the fraction of correct classes among the tied top classes; 0 when nobody votes.
    """
    votes: dict[int, int] = {}
    for c in classes:
        if c is not None:
            votes[c] = votes.get(c, 0) + 1
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [c for c, v in votes.items() if v == top]
    return sum(1.0 for c in winners if class_correct[c]) / len(winners)


def maj_at_k(classes: Sequence[int | None], class_correct: Sequence[bool], k: int, *,
             max_subsets: int = 256, rng: random.Random | None = None) -> float:
    """maj@k for one problem: mean of :func:`majority_correct` over k-subsets of the n samples.

    Every k-subset when ``C(n, k) <= max_subsets`` (exact), else ``max_subsets`` distinct random ones
    (an unbiased estimate) drawn with ``rng`` (default: ``random.Random(0)``).
    """
    n = len(classes)
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k needs 1 <= k <= n (got n={n}, k={k})")
    total = math.comb(n, k)
    if total <= max_subsets:
        subsets: Sequence[Sequence[int]] = list(itertools.combinations(range(n), k))
    else:
        rng = rng or random.Random(0)
        seen: set[tuple[int, ...]] = set()
        while len(seen) < max_subsets:
            seen.add(tuple(sorted(rng.sample(range(n), k))))
        subsets = sorted(seen)
    return sum(majority_correct([classes[i] for i in s], class_correct) for s in subsets) / len(subsets)


def default_ks(n: int) -> list[int]:
    """The k values reported for n samples: 1, 2, 4, ... up to n, and n itself."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


def sample_metrics(keys: Sequence[str | None], correct: Sequence[bool], ks: Sequence[int], *, max_subsets: int = 256,
                   seed: int = 0) -> dict[str, float]:
    """avg@n, pass@k and maj@k of one problem's n samples for every k in ``ks``.

    ``keys[i]`` is sample i's answer key (:func:`stages.core.answers.answer_key`; None when nothing was extracted),
    ``correct[i]`` its verdict against the gold answer. Returns ``{"avg@n": ..., "pass@k": ..., "maj@k": ...}``.
    """
    if len(keys) != len(correct):
        raise ValueError("keys and correct must have the same length")
    n = len(keys)
    classes = answer_classes(keys, correct)
    n_classes = max((c for c in classes if c is not None), default=-1) + 1
    class_correct = [False] * n_classes
    for cid, ok in zip(classes, correct, strict=True):
        if cid is not None and ok:
            class_correct[cid] = True
    rng = random.Random(seed)
    c = sum(bool(x) for x in correct)
    out: dict[str, float] = {f"avg@{n}": c / n if n else 0.0}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, c, k)
        out[f"maj@{k}"] = maj_at_k(classes, class_correct, k, max_subsets=max_subsets, rng=rng)
    return out

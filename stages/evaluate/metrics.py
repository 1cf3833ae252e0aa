"""Sampling metrics: pass@k (unbiased, from n samples) and maj@k (majority voting over k-subsets).

Both are per-problem functions; a benchmark's score is their mean over problems.

- pass@k (Chen et al. 2021, the Codex paper, eq. 1): with ``n`` samples of which ``c`` are correct,
  ``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that a random k-subset of the n samples holds
  at least one correct one. Computed as a running product, which never overflows.
- maj@k: the accuracy of majority voting over ``k`` samples, averaged over k-subsets of the ``n``
  samples (all of them when there are at most ``max_subsets``, else ``max_subsets`` drawn at random
  without replacement). Votes go to *answer classes*: samples whose extracted answers are
  :func:`stages.core.answers.is_equivalent` to one another (greedy clustering against each class's
  first member); a sample with no extracted answer does not vote. A subset in which nobody votes
  scores 0; a tie between classes scores the fraction of tied classes that are correct (the expected
  accuracy of breaking the tie uniformly at random). A class is correct when its first member was
  judged correct against the gold answer.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence


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


def answer_classes(answers: Sequence[str | None], equivalent: Callable[[str, str], bool]) -> list[int | None]:
    """Cluster extracted answers into equivalence classes; return each sample's class id (None: no answer).

    Greedy: a sample joins the first existing class whose first member it is equivalent to (identical
    strings short-circuit), else it opens a new class. ``equivalent(a, b)`` is called with the new answer
    first.
    """
    reps: list[str] = []
    out: list[int | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        for cid, rep in enumerate(reps):
            if a.strip() == rep.strip() or equivalent(a, rep):
                out.append(cid)
                break
        else:
            reps.append(a)
            out.append(len(reps) - 1)
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


def sample_metrics(answers: Sequence[str | None], correct: Sequence[bool], equivalent: Callable[[str, str], bool],
                   ks: Sequence[int], *, max_subsets: int = 256, seed: int = 0) -> dict[str, float]:
    """pass@k and maj@k of one problem's n samples for every k in ``ks``.

    ``answers[i]`` is sample i's extracted answer (None when nothing was extracted), ``correct[i]`` its
    verdict against the gold answer. Returns ``{"pass@k": ..., "maj@k": ...}`` for each k.
    """
    if len(answers) != len(correct):
        raise ValueError("answers and correct must have the same length")
    n = len(answers)
    classes = answer_classes(answers, equivalent)
    n_classes = max((c for c in classes if c is not None), default=-1) + 1
    class_correct = [False] * n_classes
    seen: set[int] = set()
    for cid, ok in zip(classes, correct, strict=True):
        if cid is not None and cid not in seen:
            seen.add(cid)
            class_correct[cid] = bool(ok)
    rng = random.Random(seed)
    c = sum(bool(x) for x in correct)
    out: dict[str, float] = {}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, c, k)
        out[f"maj@{k}"] = maj_at_k(classes, class_correct, k, max_subsets=max_subsets, rng=rng)
    return out

"""pass@k, maj@k and avg@n against brute-force references on small cases."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from stages.evaluate.metrics import answer_classes, default_ks, maj_at_k, pass_at_k, sample_metrics


def _num_equal(a: str, b: str) -> bool:
    return abs(float(a) - float(b)) < 1e-9


def _key(a: str | None) -> str | None:
    """A numeric answer's key by value (stages.core.answers.answer_key does this for numbers)."""
    return None if a is None else repr(float(a))


def brute_pass_at_k(correct: list[bool], k: int) -> Fraction:
    subsets = list(itertools.combinations(range(len(correct)), k))
    return Fraction(sum(any(correct[i] for i in s) for s in subsets), len(subsets))


def brute_maj_at_k(answers: list[str | None], gold: str, k: int) -> Fraction:
    """Majority vote over every k-subset, voting on float values; ties scored as expected accuracy."""
    total = Fraction(0)
    subsets = list(itertools.combinations(range(len(answers)), k))
    for s in subsets:
        votes = Counter(float(answers[i]) for i in s if answers[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        winners = [v for v, cnt in votes.items() if cnt == top]
        total += Fraction(sum(v == float(gold) for v in winners), len(winners))
    return total / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_matches_brute_force(n: int) -> None:
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            expected = brute_pass_at_k(correct, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12)
            # and the closed form 1 - C(n-c,k)/C(n,k)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_edge_cases() -> None:
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_maj_at_k_hand_computed() -> None:
    # answers 1, 1.0 (same class as 1: both right), 2, unextracted; gold 1
    answers = ["1", "1.0", "2", None]
    correct = [True, True, False, False]
    classes = answer_classes([_key(a) for a in answers], correct)
    assert classes == [0, 0, 1, None]
    cc = [True, False]
    # k=1: subsets {1},{1.0},{2},{None} -> 1, 1, 0, 0
    assert maj_at_k(classes, cc, 1) == pytest.approx(0.5)
    # k=2: 6 pairs: (1,1.0)=1 (1,2)=tie .5 (1,N)=1 (1.0,2)=.5 (1.0,N)=1 (2,N)=0 -> 4/6
    assert maj_at_k(classes, cc, 2) == pytest.approx(4 / 6)
    # k=4: class 0 has two votes, class 1 one -> 1
    assert maj_at_k(classes, cc, 4) == 1.0
    # nobody votes -> 0
    assert maj_at_k([None, None], [], 2) == 0.0


def test_answer_classes_merge_right_answers_and_group_the_rest_by_key() -> None:
    """Right answers are one class whatever they look like (each is equivalent to the gold); wrong ones share a class
    only when their keys are equal; no pairwise check is made."""
    keys = ["\\frac{1}{2}", "0.5", "x", "x", "y", None]
    assert answer_classes(keys, [True, True, False, False, False, False]) == [0, 0, 1, 1, 2, None]
    with pytest.raises(ValueError):
        answer_classes(["1"], [True, False])


def test_maj_at_k_matches_brute_force_on_random_cases() -> None:
    rng = random.Random(1)
    pool = ["3", "3.0", "4", "5", "12", None]
    for _ in range(60):
        n = rng.randint(1, 7)
        answers = [rng.choice(pool) for _ in range(n)]
        gold = rng.choice(["3", "4", "12"])
        correct = [a is not None and _num_equal(a, gold) for a in answers]
        m = sample_metrics([_key(a) for a in answers], correct, list(range(1, n + 1)), max_subsets=10_000)
        assert m[f"avg@{n}"] == pytest.approx(sum(correct) / n)
        for k in range(1, n + 1):
            assert m[f"maj@{k}"] == pytest.approx(float(brute_maj_at_k(answers, gold, k)), abs=1e-12), (answers, gold, k)
            assert m[f"pass@{k}"] == pytest.approx(float(brute_pass_at_k(correct, k)), abs=1e-12)


def test_maj_at_k_random_subsets_estimate_the_exact_value() -> None:
    rng = random.Random(2)
    answers = [rng.choice(["1", "2", "3", None]) for _ in range(16)]
    correct = [a == "1" for a in answers]
    keys = [_key(a) for a in answers]
    exact = sample_metrics(keys, correct, [8], max_subsets=20_000)["maj@8"]  # all 12870 subsets
    approx = sample_metrics(keys, correct, [8], max_subsets=3000, seed=5)["maj@8"]
    assert exact == pytest.approx(float(brute_maj_at_k(answers, "1", 8)), abs=1e-12)
    assert approx == pytest.approx(exact, abs=0.03)


def test_default_ks() -> None:
    assert default_ks(1) == [1]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(6) == [1, 2, 4, 6]

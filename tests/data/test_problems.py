"""The word-problem generator: deterministic, disjoint splits, solutions that agree with the answer."""

from __future__ import annotations

import re

import pytest

from stages.data.problems import generate_splits, sample_problem

SIZES = dict(n_sft=300, n_rl=150, n_test=100, min_steps=1, max_steps=3, max_value=20)


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return generate_splits(7, **SIZES)


def test_deterministic(splits: dict[str, list[dict]]) -> None:
    assert generate_splits(7, **SIZES) == splits
    assert generate_splits(8, **SIZES) != splits


def test_sizes_and_disjoint_questions(splits: dict[str, list[dict]]) -> None:
    assert {k: len(v) for k, v in splits.items()} == {"test": 100, "sft": 300, "rl": 150}
    questions = [r["question"] for rows in splits.values() for r in rows]
    assert len(questions) == len(set(questions))
    ids = [r["id"] for rows in splits.values() for r in rows]
    assert len(ids) == len(set(ids))


def test_step_counts_cover_the_range(splits: dict[str, list[dict]]) -> None:
    for rows in splits.values():
        assert {r["n_steps"] for r in rows} == {1, 2, 3}


def test_cot_lines_are_steps_with_the_running_values(splits: dict[str, list[dict]]) -> None:
    for r in splits["test"]:
        lines = r["cot"].split("\n")
        assert len(lines) == r["n_steps"] + 1
        for line, value in zip(lines[:-1], r["values"], strict=True):
            a, op, b, c = re.search(r"(\d+) ([-+*]) (\d+) = (\d+)\.$", line).groups()
            assert int(c) == value == eval(f"{a} {op} {b}")  # noqa: S307 (digits and one operator)
        assert lines[-1] == f"The answer is \\boxed{{{r['answer']}}}."
        assert r["values"][-1] == int(r["answer"])


def test_pot_and_tir_programs_compute_the_answer(splits: dict[str, list[dict]]) -> None:
    for r in splits["sft"][:100]:
        scope: dict = {}
        exec(r["pot"], scope)  # noqa: S102 (our own generated program)
        assert str(scope["solution"]()) == r["answer"]
        code = re.search(r"```python\n(.*?)\n```", r["tir"], re.S).group(1)
        out = re.search(r"```output\n(.*?)\n```", r["tir"], re.S).group(1)
        assert out == r["answer"]
        assert "print(" in code and r["tir"].endswith(f"\\boxed{{{r['answer']}}}.")


def test_values_stay_in_range() -> None:
    import random

    rng = random.Random(0)
    for _ in range(2000):
        p = sample_problem(rng, n_steps=4, max_value=12)
        assert all(0 <= v <= 120 for v in p["values"])


def test_too_few_distinct_questions_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    # a generator that can only produce a handful of distinct questions must fail, not loop forever
    from stages.data import problems

    real = problems.sample_problem
    monkeypatch.setattr(problems, "sample_problem", lambda rng, **kw: {**real(rng, **kw), "question": str(rng.randint(0, 5))})
    with pytest.raises(ValueError, match="distinct"):
        problems.generate_splits(0, n_sft=50, n_rl=10, n_test=10, min_steps=1, max_steps=1, max_value=5)

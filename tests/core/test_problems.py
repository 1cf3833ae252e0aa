"""Benchmark problem files: the generated, GSM8K and MATH formats, per-row format detection, limits, and one-line
errors naming the file and row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.core.errors import PipelineError
from stages.core.problems import Problem, load_generated, load_gsm8k, load_math, load_problem_file, strip_calculator

GSM_ANSWER = "She sold 48/2 = <<48/2=24>>24 clips in May.\n\nAltogether 2,101 clips.\n#### 2,125"


def _write(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_generated_rows(tmp_path: Path) -> None:
    f = _write(tmp_path / "test.jsonl", [
        {"id": "test-0", "question": "Q0?", "answer": "5", "n_steps": 2, "cot": "2 + 3 = 5.\nThe answer is \\boxed{5}."},
        "",  # blank lines are not rows
        {"question": "Q1?", "answer": 7},  # RL prompt schema: no id, n_steps or cot; an integer answer
        {"id": 12, "question": "Q2?", "answer": "9", "n_steps": 1},
    ])
    assert load_generated(f) == [
        Problem("test-0", "generated", "Q0?", "5", 2, "2 + 3 = 5.\nThe answer is \\boxed{5}."),
        Problem("generated-1", "generated", "Q1?", "7", None, None),
        Problem("12", "generated", "Q2?", "9", 1, None),
    ]
    assert [p.id for p in load_generated(f, limit=2)] == ["test-0", "generated-1"]


def test_gsm8k_gold_difficulty_and_solution(tmp_path: Path) -> None:
    f = _write(tmp_path / "gsm8k.jsonl", [{"question": "How many?", "answer": GSM_ANSWER},
                                          {"question": "And now?", "answer": "1 + 1 = 2\n#### 2"}])
    first, second = load_gsm8k(f)
    assert first == Problem("gsm8k-0", "gsm8k", "How many?", "2125", 2, GSM_ANSWER)  # annotations kept in solution
    assert (second.id, second.gold, second.difficulty) == ("gsm8k-1", "2", 1)
    assert load_gsm8k(f, limit=1) == [first]


def test_math_levels_ids_and_rows_without_answer(tmp_path: Path) -> None:
    f = _write(tmp_path / "math.jsonl", [
        {"problem": "P0", "solution": "S0 $\\boxed{\\frac{1}{2}}$", "answer": "\\frac{1}{2}", "level": 3,
         "unique_id": "test/algebra/1.json"},
        {"problem": "P1", "solution": "S1 $\\boxed{}$", "answer": "", "level": 5},  # as in MATH's train split
        {"problem": "P2", "solution": "S2", "answer": None, "level": None},
        {"problem": "P3", "answer": "4", "level": "Level 4"},
    ])
    answered = load_math(f)
    assert answered == [Problem("test/algebra/1.json", "math", "P0", "\\frac{1}{2}", 3, "S0 $\\boxed{\\frac{1}{2}}$"),
                        Problem("math-3", "math", "P3", "4", 4, None)]
    every = load_math(f, keep_unanswered=True)
    assert [(p.id, p.gold, p.difficulty, p.solution) for p in every[1:3]] == [("math-1", None, 5, "S1 $\\boxed{}$"),
                                                                            ("math-2", None, None, "S2")]
    assert load_math(f, limit=2) == answered  # the limit counts kept problems
    assert len(load_math(f, limit=2, keep_unanswered=True)) == 2


def test_problem_file_tells_gsm8k_rows_from_generated_rows(tmp_path: Path) -> None:
    f = _write(tmp_path / "heldout.jsonl", [{"id": "p0", "question": "Q0?", "answer": "3"},
                                            {"question": "Q1?", "answer": GSM_ANSWER},
                                            {"question": "Q2?", "answer": "4", "n_steps": 1}])
    got = load_problem_file(f)
    assert [(p.id, p.benchmark, p.gold) for p in got] == [("p0", "generated", "3"), ("gsm8k-1", "gsm8k", "2125"),
                                                          ("generated-2", "generated", "4")]
    assert load_problem_file(f, limit=2) == got[:2]


@pytest.mark.parametrize(("loader", "rows", "match"), [
    (load_generated, [{"id": "a", "question": "Q?", "answer": "1"}, {"id": "b", "answer": "2"}],
     r"row 2 has no non-empty string 'question'"),
    (load_generated, [{"question": "Q?", "answer": None}], r"row 1 has no 'answer'"),
    (load_generated, [{"question": "Q?", "answer": "1", "n_steps": "two"}], r"row 1 has a non-integer 'n_steps'"),
    (load_generated, [{"question": "Q?", "answer": "1", "cot": ["x"]}], r"row 1 has a non-string 'cot'"),
    (load_gsm8k, [{"question": "Q?", "answer": "no final line"}], r"row 1 has an 'answer' without a '#### N'"),
    (load_gsm8k, [{"question": "Q?"}], r"row 1 has no non-empty string 'answer'.*GSM8K"),
    (load_math, [{"question": "Q?", "answer": "1"}], r"row 1 has no non-empty string 'problem'.*MATH"),
    (load_problem_file, [{"question": "", "answer": "#### 3"}], r"row 1 has no non-empty string 'question'"),
    (load_math, ["", "\n"], r"no MATH problems in the file"),
    (load_math, [{"problem": "P", "answer": None}], r"no MATH problems in the file"),
    (load_gsm8k, ['{"question": "Q?", "answer": "#### 1"', ], r":1: malformed JSONL line"),
])
def test_bad_files_and_rows_are_one_line_errors(tmp_path: Path, loader, rows: list, match: str) -> None:
    f = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(PipelineError, match=match) as e:
        loader(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("loader", [load_generated, load_gsm8k, load_math, load_problem_file])
def test_missing_file_is_a_one_line_error(tmp_path: Path, loader) -> None:
    with pytest.raises(PipelineError, match=r"nope\.jsonl: .*file not found; .*fix the path"):
        loader(tmp_path / "nope.jsonl")


def test_real_gsm8k_and_math(shared_data: Path) -> None:
    gsm = load_gsm8k(shared_data / "gsm8k" / "test.jsonl")
    assert len(gsm) == 1319 and all(p.gold.lstrip("-").replace(".", "").isdigit() for p in gsm)
    assert all(p.difficulty and p.difficulty >= 1 and "####" in p.solution for p in gsm)
    assert load_gsm8k(shared_data / "gsm8k" / "test.jsonl", limit=5) == gsm[:5]
    assert load_problem_file(shared_data / "gsm8k" / "test.jsonl", limit=5) == gsm[:5]
    math = load_math(shared_data / "math" / "test.jsonl")
    assert len(math) == 5000 and all(p.difficulty in {1, 2, 3, 4, 5} and p.solution for p in math)
    train = shared_data / "math" / "train.jsonl"  # 2 rows with a null answer, 2 with an empty one
    assert len(load_math(train)) == 7496 and len(load_math(train, keep_unanswered=True)) == 7500


def test_strip_calculator() -> None:
    assert strip_calculator("48/2 = <<48/2=24>>24 clips") == "48/2 = 24 clips"

"""Few-shot prompt builders and prompt selection (the benchmark files are read by stages.core.problems:
tests/core/test_problems.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.core.errors import PipelineError
from stages.core.problems import Problem
from stages.core.prompts import (
    GSM8K_8SHOT_EXEMPLARS,
    MINERVA_MATH_4SHOT,
    chat_prompt,
    gsm8k_fewshot_prompt,
    minerva_math_prompt,
    qa_fewshot_prompt,
)
from stages.evaluate.benchmarks import build_prompt, fewshot_exemplars, stop_strings, strip_stops


def test_gsm8k_8shot_layout() -> None:
    p = gsm8k_fewshot_prompt("How many?")
    assert p.startswith("Q: There are 15 trees in the grove.")
    assert p.endswith("The answer is 8.\n\n\nQ: How many?\nA:")
    assert p.count("\nA: ") == 8 and p.count("Q: ") == 9
    assert len(GSM8K_8SHOT_EXEMPLARS) == 8


def test_minerva_layout() -> None:
    p = minerva_math_prompt("What is $1+1$?")
    assert p.startswith("Problem:\nFind the domain")
    assert p.endswith("I hope it is correct.\n\nProblem:\nWhat is $1+1$?\n\nSolution:")
    assert MINERVA_MATH_4SHOT.count("Final Answer: The final answer is") == 4
    assert "\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}" in MINERVA_MATH_4SHOT


def test_qa_fewshot_prompt_zero_and_two_shots() -> None:
    assert qa_fewshot_prompt("q?", []) == "Q: q?\nA:"
    assert qa_fewshot_prompt("q?", [("a?", "x"), ("b?", "y")]) == "Q: a?\nA: x\n\n\nQ: b?\nA: y\n\n\nQ: q?\nA:"


def test_fewshot_exemplars_from_sft_split(tmp_path: Path, problem_splits: dict) -> None:
    f = tmp_path / "sft.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in problem_splits["sft"]))
    shots = fewshot_exemplars(f, 4, "cot", seed=0)
    assert len(shots) == 4 and len({q for q, _ in shots}) == 4
    by_q = {r["question"]: r for r in problem_splits["sft"]}
    assert all(by_q[q]["cot"] == a for q, a in shots)
    assert {by_q[q]["n_steps"] for q, _ in shots} == {1, 2, 3}  # every difficulty shown
    assert fewshot_exemplars(f, 4, "cot", seed=0) == shots  # deterministic
    assert [a for _, a in fewshot_exemplars(f, 2, "pot", seed=1)][0].startswith("def solution():")
    with pytest.raises(PipelineError, match="n_shots"):
        fewshot_exemplars(f, 1000, "cot", seed=0)


def test_prompt_and_stop_selection() -> None:
    gen = Problem("t-1", "generated", "Tom has 3 apples. How many?", "3", 1)
    gsm = Problem("g-1", "gsm8k", "How many?", "3", 2)
    math = Problem("m-1", "math", "Find $x$.", "3", 5)
    assert build_prompt(gen, "tir", "zero_shot") == chat_prompt(gen.question, "tir")
    assert build_prompt(gsm, "cot", "few_shot") == gsm8k_fewshot_prompt(gsm.question)
    assert build_prompt(math, "cot", "few_shot") == minerva_math_prompt(math.question)
    assert build_prompt(gen, "pot", "few_shot", [("a?", "def solution():\n    return 1")]).endswith(
        "return 1\n\n\nQ: Tom has 3 apples. How many?\nA:")
    assert stop_strings("gsm8k", "cot", "few_shot") == ("\nQ:",)
    assert stop_strings("math", "cot", "few_shot") == ("\nProblem:",)
    assert stop_strings("generated", "tir", "zero_shot") == ("```output",)
    assert stop_strings("generated", "cot", "zero_shot") == ()
    assert stop_strings("generated", "cot", "few_shot") == ("\nQ:", "\n\n")  # one-paragraph exemplar answers
    assert strip_stops("The answer is 5.\nQ:", ("\nQ:",)) == "The answer is 5."
    with pytest.raises(PipelineError, match="few-shot pot on gsm8k"):
        build_prompt(gsm, "pot", "few_shot")


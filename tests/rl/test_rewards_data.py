"""Reward functions (rule, format, custom by import path, failure exclusion) and the prompt dataset."""

from __future__ import annotations

import math

import pytest

from stages.core.errors import PipelineError
from stages.rl.data import load_prompts, step_questions
from stages.rl.rewards import RewardSet, accuracy_reward, format_reward

from .conftest import write_prompts


def test_accuracy_and_format_rewards():
    good = "3 + 2 = 5.\nThe answer is \\boxed{5}."
    assert accuracy_reward(completion=good, answer="5") == 1.0
    assert accuracy_reward(completion=good, answer="6") == 0.0
    assert accuracy_reward(completion="no answer", answer="5") == 0.0
    assert format_reward(completion=good, finish_reason="stop") == 1.0
    assert format_reward(completion=good, finish_reason="length") == 0.0
    assert format_reward(completion=good + " \\boxed{6}", finish_reason="stop") == 0.0


def test_weighted_sum_and_custom_by_import_path():
    rs = RewardSet.from_params(1.0, 0.5, ["tests.rl.custom_rewards:length_reward"], [2.0])
    c = "The answer is \\boxed{5}."
    total, parts = rs.score(question="q", completion=c, answer="5", finish_reason="stop", row={})
    assert parts == {"accuracy": 1.0, "format": 1.0, "tests.rl.custom_rewards:length_reward": len(c) / 100}
    assert total == pytest.approx(1.0 + 0.5 + 2.0 * len(c) / 100)


def test_failing_reward_gives_nan_and_is_counted():
    rs = RewardSet.from_params(1.0, 0.0, ["tests.rl.custom_rewards:flaky_reward"], [1.0])
    kw = dict(question="q", answer="5", finish_reason="stop", row={})
    assert rs.score(completion="ab", **kw)[0] == pytest.approx(1.0)  # even, not divisible by 4
    assert math.isnan(rs.score(completion="abc", **kw)[0])  # raises
    assert math.isnan(rs.score(completion="abcd", **kw)[0])  # NaN
    assert rs.failures == {"tests.rl.custom_rewards:flaky_reward": 2}


@pytest.mark.parametrize("bad", [(["nope"], [1.0]), (["os:nonexistent_fn"], [1.0]), (["os:path"], [])])
def test_bad_custom_reward_is_one_line_error(bad):
    with pytest.raises(PipelineError):
        RewardSet.from_params(1.0, 0.0, *bad)


def test_load_prompts_schema(tmp_path):
    rows = load_prompts(write_prompts(tmp_path / "p.jsonl", 3))
    assert len(rows) == 3 and rows[0]["id"] == "p0"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(PipelineError, match="answer"):
        load_prompts(bad)
    noid = tmp_path / "noid.jsonl"
    noid.write_text('{"question": "q", "answer": "1", "extra": 5}\n')
    assert load_prompts(noid)[0] == {"question": "q", "answer": "1", "extra": 5, "id": "prompt-1"}


def test_step_questions_epochs_are_permutations_and_pure():
    n, per = 10, 4
    seq = [i for s in range(5) for i in step_questions(n, s, per, seed=3)]  # 20 = two epochs
    assert sorted(seq[:10]) == list(range(10)) and sorted(seq[10:]) == list(range(10))
    assert step_questions(n, 2, per, seed=3) == step_questions(n, 2, per, seed=3)
    assert step_questions(n, 0, per, seed=3) != step_questions(n, 0, per, seed=4)


def test_accuracy_reward_has_no_percent_rule() -> None:
    from stages.rl.rewards import accuracy_reward

    assert accuracy_reward(completion="so \\boxed{2}.", answer="2") == 1.0
    assert accuracy_reward(completion="so \\boxed{200}.", answer="2") == 0.0  # the reference would accept it


def test_load_prompts_reads_gsm8k_and_math_rows(tmp_path):
    import json

    f = tmp_path / "mixed.jsonl"
    rows = [{"question": "Ann has 2,000 coins and gets 125 more. How many?", "answer": "2000 + 125 = 2125\n#### 2,125"},
            {"problem": "What is $1+1$?", "solution": "$1+1=\\boxed{2}$", "answer": "2", "unique_id": "test/a/1.json"},
            {"problem": "No gold here.", "solution": "?", "answer": None},
            {"id": "g1", "question": "Tom has 3 apples.", "answer": "3", "values": [3]}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_prompts(f)
    assert [r["id"] for r in got] == ["gsm8k-0", "test/a/1.json", "g1"]  # the MATH row without an answer is skipped
    assert [r["answer"] for r in got] == ["2125", "2", "3"]
    assert got[0]["question"].startswith("Ann has") and got[0]["solution"].endswith("#### 2,125")
    assert got[1]["question"] == "What is $1+1$?" and got[1]["solution"] == "$1+1=\\boxed{2}$"
    assert got[2]["values"] == [3] and "solution" not in got[2]

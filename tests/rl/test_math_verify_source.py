"""The ``math_verify`` reward source (stages/rl/sources/math_verify.py), added as one file: the registry finds it,
the params accept it, its verdicts are math-verify's own, and a GRPO step scores with it through the driver."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from math_verify import parse, verify

from stages.core import paths
from stages.core.modeling import load_model, load_tokenizer
from stages.rl.data import load_prompts
from stages.rl.loop import begin_iteration, close, run_step, setup
from stages.rl.sources import REWARD_SOURCES
from stages.rl.sources.math_verify import score

from .test_grpo_stage import tiny_params
from .test_paradigm import ScriptedGenerator, _texts

CASES = [  # (gold, output, math-verify's verdict); the rule reward of stages/core/answers.py differs on some
    ("5", "So 5.\nThe answer is \\boxed{5}.", True),
    ("\\frac{1}{2}", "The answer is \\boxed{0.5}", True),
    ("x^2+2x+1", "so \\boxed{(x+1)^2}", True),
    ("45^\\circ", "The angle is \\boxed{45}", True),
    ("5", "The answer is \\boxed{0}.", False),
    ("3", "no answer at all", False),
]


@pytest.mark.parametrize(("gold", "output", "right"), CASES)
def test_verdicts_are_math_verifys(gold: str, output: str, right: bool) -> None:
    assert score(completion=output, answer=gold) == float(right)
    assert verify(parse(f"${gold}$"), parse(output)) is right  # the oracle: math-verify called directly


def test_registered_accepted_and_safe_off_the_main_thread() -> None:
    spec = REWARD_SOURCES.spec("math_verify")
    assert spec.score is score and not spec.reward_model and spec.supervision == "outcome"
    assert tiny_params(reward__source="math_verify").reward.source == "math_verify"
    with pytest.raises(ValueError, match="rollout.mode pot: reward source math_verify scores cot outputs only"):
        tiny_params(reward__source="math_verify", rollout__mode="pot")
    with ThreadPoolExecutor(2) as ex:  # math-verify's signal timeouts work on the main thread only
        assert list(ex.map(lambda c: score(completion=c[1], answer=c[0]), CASES)) == [float(c[2]) for c in CASES]
    assert math.isnan(score(completion="\\boxed{1}", answer="$$"))


def test_a_grpo_step_scores_with_math_verify(project) -> None:
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    p = tiny_params(reward__source="math_verify", questions_per_step=2, rollout__group_size=4)
    model = load_model(paths.SFT_MODEL)
    run, models, state = setup(p, model, tok, rows=rows, generator=ScriptedGenerator(tok, rows, _texts))
    try:
        begin_iteration(run, models, state, 1, None)
        m, ro, rewards = run_step(run, models, state, 0)
    finally:
        close(run, models, state)
    assert rewards.tolist() == [[1.0, 1.0, 1.0, 0.0]] * 2  # three right outputs and a wrong one per question
    assert m["reward_mean"] == pytest.approx(0.75) and m["accuracy"] == pytest.approx(0.75)  # rule accuracy beside it

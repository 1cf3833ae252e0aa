"""Where RL starts and the R1 formulation (issue 17, item 7): the R1-Zero template and its format reward, and a tiny
run from the pretrained model (no SFT) whose rollouts and held-out curve use the template."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from stages import grpo
from stages.core import paths
from stages.core.prompts import chat_prompt, r1_prompt, rl_prompt
from stages.rl import loop
from stages.rl.rewards import RewardSet, format_reward, r1_format_reward

from .conftest import write_prompts
from .test_grpo_stage import tiny_params

torch.set_num_threads(1)


def test_r1_template_ends_inside_the_think_block() -> None:
    p = r1_prompt("  What is 2 + 3? ")
    assert p.startswith("A conversation between User and Assistant.") and "User: What is 2 + 3? Assistant:" in p
    assert p.endswith("Assistant: <think>") and "</think>" in p and "\\boxed{answer here}" in p
    assert rl_prompt("What is 2 + 3?") == chat_prompt("What is 2 + 3?", "cot")
    assert rl_prompt("What is 2 + 3?", "r1") == r1_prompt("What is 2 + 3?")


@pytest.mark.parametrize(("completion", "reason", "want"), [
    (" 2 + 3 = 5. </think> The answer is \\boxed{5}.", "stop", 1.0),
    (" 2 + 3 = 5. </think> 5", "stop", 1.0),
    (" 2 + 3 = 5. </think> The answer is \\boxed{5}.", "length", 0.0),  # cut at max_new_tokens
    (" 2 + 3 = 5. The answer is \\boxed{5}.", "stop", 0.0),  # never closed the reasoning
    (" </think> The answer is 5.", "stop", 0.0),  # empty reasoning
    (" 2 + 3 = 5. </think>  ", "stop", 0.0),  # no answer after it
    (" a </think> b </think> c", "stop", 0.0),
    (" <think> a </think> b", "stop", 0.0),
])
def test_r1_format_reward(completion: str, reason: str, want: float) -> None:
    assert r1_format_reward(completion=completion, finish_reason=reason) == want


def test_the_format_weight_weighs_the_templates_format_reward() -> None:
    assert dict((n, f) for n, f, _ in RewardSet.from_params(1.0, 0.5, [], []).fns)["format"] is format_reward
    r1 = RewardSet.from_params(1.0, 1.0, [], [], template="r1")
    assert dict((n, f) for n, f, _ in r1.fns)["format"] is r1_format_reward
    total, parts = r1.score(question="q", completion=" 1 + 1 = 2. </think> \\boxed{2}", answer="2", finish_reason="stop",
                            row={})
    assert total == 2.0 and parts == {"accuracy": 1.0, "format": 1.0}  # R1: Reward_acc + Reward_format, equal weights


class RecordingGenerator:
    """Wraps the stage's generator and keeps every prompt it is asked to continue."""

    def __init__(self, inner) -> None:
        self.inner, self.prompts = inner, []

    def generate(self, prompts, sp):
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, sp)

    def sync_weights(self, model) -> None:
        self.inner.sync_weights(model)


def test_r1_zero_run_starts_from_the_pretrained_model_with_the_template(project, monkeypatch) -> None:
    shutil.copytree(paths.SFT_MODEL, paths.PRETRAIN_MODEL)  # stands in for the pretrain stage's output
    torch.manual_seed(1)
    with torch.no_grad():  # make it differ from the SFT model, so the start is visible in the result
        from stages.core.modeling import load_model, load_tokenizer, save_model

        m = load_model(paths.PRETRAIN_MODEL)
        for q in m.parameters():
            q.add_(0.01 * torch.randn_like(q))
        save_model(m, load_tokenizer(paths.PRETRAIN_MODEL), paths.PRETRAIN_MODEL)
    write_prompts(project / "heldout.jsonl", 3)
    seen: list[RecordingGenerator] = []
    real = loop.rollout_generator

    def recording(*a, **k):
        seen.append(RecordingGenerator(real(*a, **k)))
        return seen[-1]

    monkeypatch.setattr(loop, "rollout_generator", recording)
    p = tiny_params(start="pretrain", template="r1", steps=1, baseline=dict(enabled=False, lr=1e-3),
                    reward=dict(accuracy_weight=1.0, format_weight=1.0, custom=["tests.rl.custom_rewards:length_reward"],
                                custom_weights=[1.0]),
                    heldout=dict(every=1, problems_file="heldout.jsonl", limit=3, max_new_tokens=8))
    m = grpo.run(p)
    info = json.loads((paths.GRPO_MODEL / "pipeline.json").read_text())
    assert info["init"] == str(paths.PRETRAIN_MODEL) and m["grpo"]["steps"] == 1
    prompts = seen[0].prompts
    assert prompts and all(x.endswith("Assistant: <think>") for x in prompts)  # rollouts and held-out alike
    assert len(prompts) == p.questions_per_step + 2 * 3  # one step's questions, held-out before and after
    assert info["run"]["trained_parameters"]["policy"] > 0 and m["memory"]["peak_rss_mib"] > 0  # memory: metrics only

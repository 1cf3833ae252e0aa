"""Rewards of RL rollouts: the one reward interface, and the rule / custom reward functions.

Every reward source (these rule and custom functions; the outcome and process reward models and the exact step
labels of stages/rl/rm/source.py) implements :class:`RewardSource`: ``rewards(rollout) -> Rewards``, the rewards
per output and, where the source has them, per reasoning step with the steps' end tokens. Sources return rewards,
never advantages: the advantage estimator (stages/rl/advantages.py) turns them into advantages.

The paper's "rule" reward is answer correctness (section 5.2.1).

Every reward function is called with keyword arguments and returns a float::

    fn(*, question: str, completion: str, answer: str, finish_reason: str, row: dict, mode: str,
       program_answer: str | None) -> float

``completion`` is the decoded output (special tokens skipped; a TIR output with its injected ```output blocks),
``answer`` the gold answer, ``finish_reason`` "stop" (EOS or a stop string), "length" (cut at max_new_tokens) or
"tool" (a TIR output whose last round stopped for a program), ``row`` the prompt row (every key of the prompt
JSONL), ``mode`` the output's rollout mode (cot / pot / tir, ``grpo.rollout``), ``program_answer`` a PoT output's
``str(solution())`` as run in the sandbox (None otherwise, or when the program failed). A custom function is given by
import path ``package.module:function`` in ``grpo.reward.custom``; accept ``**_`` for arguments you do not use.

The reward of a sample is ``sum_k w_k * fn_k(...)``. If any function raises or returns a
non-finite value for a sample, that sample's reward is NaN: it is excluded from its group's
statistics and from the loss, and counted (``n_reward_failures``); the rest of the batch is kept.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from stages.core.errors import PipelineError

RewardFn = Callable[..., float]


@dataclass(frozen=True)
class Rewards:
    """What every reward source returns for a rollout of Q questions x G outputs (row n = q * G + g).

    output: (Q, G) float64, the reward of each output; NaN where the source could not score it (the output is then
        excluded from its group's statistics and from the loss). A per-step source gives the mean of the output's
        step rewards here (for the metrics and for the outcome estimators).
    steps: (Q, G, S) float64 per-step rewards (S = most steps of an output in the batch; NaN pads and marks failed
        scores), or None for a source that scores whole outputs only.
    step_ends: (Q, G, S) long, the completion-token index of each step's last token (with ``steps``).
    parts: per reward function, its value for every output in row order (rule sources; {} otherwise). The
        ``accuracy`` part is the answer-correctness metric.
    metrics: the source's own per-step metrics (e.g. ``rm_steps_mean``, steps scored per output).
    """

    output: Tensor
    steps: Tensor | None = None
    step_ends: Tensor | None = None
    parts: dict[str, list[float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def per_step(self) -> bool:
        """True when the source gives per-step rewards (process supervision)."""
        return self.steps is not None

    def with_parts(self, parts: dict[str, list[float]]) -> Rewards:
        """The same rewards with ``parts`` (the rule functions' values, scored for the metrics)."""
        return Rewards(self.output, self.steps, self.step_ends, parts, self.metrics)


class RewardSource(Protocol):
    """A source of rewards for rollouts (stages.rl.rollout.Rollout)."""

    def rewards(self, ro: Any) -> Rewards:
        """The rewards of every output of ``ro``."""
        ...

_BOXED = re.compile(r"\\boxed\{")


def accuracy_reward(*, completion: str, answer: str, mode: str = "cot", program_answer: str | None = None,
                    checker: str = "strict", timeout_value: float = 0.0, **_: Any) -> float:
    """1.0 when the final answer equals the gold answer under answer-checker mode ``checker`` (stages/core/answers.py:
    ``strict``, the default, or ``deepseekmath``), else 0.0. The final answer: what the mode reads in the text
    (:func:`~stages.core.answers.final_answers`; strict: every distinct final answer, each must be right, no
    last-number fallback; a TIR output's last ```output block counts, as in the evaluation), or for a PoT output
    (``mode`` pot) ``program_answer``, what its ``solution()`` returned in the sandbox (0.0 when it failed).

    A check past its deadline scores ``timeout_value``: NaN in the GRPO reward set (the sample is excluded from its
    group and counted in ``n_reward_failures``: a timeout is never right nor silently wrong), 0.0 for other callers.
    The deepseekmath mode departs from the reference evaluator on purpose: its percent rule (a prediction equal to
    gold x 100 or gold / 100 counts as right) is off here, since as a reward it would pay 200 for a gold of 2.
    """
    from stages.core.answers import TIMEOUT, check, final_answers

    if mode == "pot":
        pred = [] if program_answer is None else [program_answer]
    else:
        pred = final_answers(completion, "math", mode=checker)
    outcome = check(pred, answer, mode=checker, percent_variants=False)
    if outcome == TIMEOUT:
        return timeout_value
    return 1.0 if outcome == "right" else 0.0


def format_reward(*, completion: str, finish_reason: str, **_: Any) -> float:
    """1.0 when the output stopped by itself (not truncated) and holds exactly one ``\\boxed{``, else 0.0."""
    return 1.0 if finish_reason == "stop" and len(_BOXED.findall(completion)) == 1 else 0.0


def r1_format_reward(*, completion: str, finish_reason: str, **_: Any) -> float:
    """DeepSeek-R1's format reward for the ``r1`` template (stages.core.prompts.R1_TEMPLATE, whose prompt ends with
    the opening <think>): 1.0 when the output stopped by itself and is ``reasoning </think> answer`` with non-empty
    reasoning and answer, one ``</think>`` and no other ``<think>``; else 0.0."""
    if finish_reason != "stop" or completion.count("</think>") != 1 or "<think>" in completion:
        return 0.0
    thought, _, answer = completion.partition("</think>")
    return 1.0 if thought.strip() and answer.strip() else 0.0


FORMAT_REWARDS: dict[str, RewardFn] = {"deepseekmath": format_reward, "r1": r1_format_reward}
"""``grpo.template`` -> its format reward (``grpo.reward.format_weight``)."""


def import_reward(path: str) -> RewardFn:
    """Import ``module:function``; a bad path is a one-line PipelineError."""
    mod_name, sep, fn_name = path.partition(":")
    if not sep or not mod_name or not fn_name:
        raise PipelineError(f"grpo.reward.custom: {path!r} is not 'module:function'")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise PipelineError(f"grpo.reward.custom: cannot import {path!r} ({e})") from None
    if not callable(fn):
        raise PipelineError(f"grpo.reward.custom: {path!r} is not callable")
    return fn


@dataclass
class RewardSet:
    """Named reward functions with weights; ``score`` one sample, ``score_many`` a batch."""

    fns: list[tuple[str, RewardFn, float]]
    failures: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_params(cls, accuracy_weight: float, format_weight: float, custom: Sequence[str],
                    custom_weights: Sequence[float], *, template: str = "deepseekmath",
                    checker: str = "strict") -> RewardSet:
        """The rule reward (answer correctness under checker mode ``checker``; a check timeout makes the sample's
        reward NaN: excluded and counted), the format reward of ``template`` (:data:`FORMAT_REWARDS`) and the custom
        functions, each with its weight (0: left out)."""
        if len(custom) != len(custom_weights):
            raise PipelineError(
                f"grpo.reward: custom has {len(custom)} entries but custom_weights {len(custom_weights)}; give one weight per function"
            )
        fns: list[tuple[str, RewardFn, float]] = []
        if accuracy_weight:
            fns.append(("accuracy", functools.partial(accuracy_reward, checker=checker, timeout_value=math.nan),
                         accuracy_weight))
        if format_weight:
            fns.append(("format", FORMAT_REWARDS[template], format_weight))
        for path, w in zip(custom, custom_weights, strict=True):
            fns.append((path, import_reward(path), w))
        if not fns:
            raise PipelineError("grpo.reward: every weight is 0 and no custom function is given; enable at least one reward")
        return cls(fns)

    def rewards(self, ro: Any) -> Rewards:
        """:class:`RewardSource`: the weighted sum of the functions for every output of rollout ``ro``."""
        N, G = len(ro.texts), ro.group_size
        totals, parts = [], {}
        for n in range(N):
            row = ro.rows[n]
            tot, comp = self.score(question=row["question"], completion=ro.texts[n], answer=row["answer"],
                                   finish_reason=ro.finish_reasons[n], row=row,
                                   mode=ro.modes[n] if ro.modes else "cot",
                                   program_answer=ro.program_answers[n] if ro.program_answers else None)
            totals.append(tot)
            for k, v in comp.items():
                parts.setdefault(k, []).append(v)
        return Rewards(torch.tensor(totals, dtype=torch.float64).view(N // G, G), parts=parts)

    def score(self, **sample: Any) -> tuple[float, dict[str, float]]:
        """(total reward, per-function values); total is NaN when any function failed on this sample."""
        parts: dict[str, float] = {}
        total = 0.0
        for name, fn, w in self.fns:
            try:
                v = float(fn(**sample))
            except Exception:  # a user reward function may fail on one odd sample: exclude it, count it
                v = math.nan
            if not math.isfinite(v):
                self.failures[name] = self.failures.get(name, 0) + 1
                total = math.nan
            parts[name] = v
            total += w * v
        return total, parts



def rule_source(inputs: Any) -> RewardSet:
    """The ``rule`` reward source's scorer (stages/rl/sources/rule.py): the run's rule reward functions themselves,
    ``inputs.reward_set`` (``inputs``: stages.rl.sources.SourceInputs)."""
    return inputs.reward_set


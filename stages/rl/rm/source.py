"""The reward model and the exact step labels as GRPO reward sources (stages/rl/sources/reward_model.py and
step_labels.py declare them; their ``build`` functions are here): every output's steps are scored (the RM's sigmoid
or the 0/1 labels) and returned as :class:`stages.rl.rewards.Rewards`, outcome (the last step's) or process (every
step's, with its end token). The RM sources are wrapped in the reward-hacking guards of ``grpo.reward.rm_guards``
(stages/rl/guards.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from stages.core.errors import PipelineError
from stages.rl.guards import guarded
from stages.rl.rewards import Rewards, accuracy_reward
from stages.rl.rm.labels import completion_steps, value_step_labels
from stages.rl.rm.model import example_scores


def _pad_steps(rewards: Sequence[Sequence[float]], ends: Sequence[Sequence[int]], group_size: int
               ) -> tuple[Tensor, Tensor]:
    """(Q, G, S) step rewards (NaN-padded) and (Q, G, S) step-end indices from per-output lists (N = Q x G)."""
    N = len(rewards)
    S = max([len(x) for x in rewards] + [1])
    r = torch.full((N, S), math.nan, dtype=torch.float64)
    e = torch.zeros((N, S), dtype=torch.long)
    for i, (rw, en) in enumerate(zip(rewards, ends, strict=True)):
        r[i, :len(rw)] = torch.tensor(rw, dtype=torch.float64)
        e[i, :len(en)] = torch.tensor(en, dtype=torch.long)
    return r.view(N // group_size, group_size, S), e.view(N // group_size, group_size, S)


def rollout_completions(ro: Any) -> list[list[int]]:
    """The completion token ids of every output of a rollout (its generated tokens, EOS included)."""
    P = ro.prompt_len
    return [[int(t) for t in ro.input_ids[n, P:P + int(ro.completion_mask[n].sum())]] for n in range(len(ro.texts))]


def step_rewards_as(steps: Tensor, ends: Tensor, kind: Literal["outcome", "process"], **metrics: float) -> Rewards:
    """:class:`Rewards` from (Q, G, S) step rewards: ``process`` keeps the steps (per-output reward: the mean of its
    step rewards); ``outcome`` keeps only the last step's reward of each output (the outcome score)."""
    valid = torch.isfinite(steps).any(-1)
    n_steps = float(torch.isfinite(steps).sum(-1).float().mean())
    if kind == "process":
        return Rewards(torch.nanmean(steps, dim=-1), steps, ends, metrics={"rm_steps_mean": n_steps, **metrics})
    last = torch.isfinite(steps).sum(-1, keepdim=True).clamp(min=1) - 1
    outcome = steps.gather(-1, last).squeeze(-1)
    return Rewards(torch.where(valid, outcome, torch.full_like(outcome, math.nan)),
                   metrics={"rm_steps_mean": n_steps, **metrics})


class RewardModelSource:
    """Rewards from a reward model (``reward_source`` outcome_rm / process_rm; :class:`stages.rl.rewards.RewardSource`).

    The RM scores every step end of every output (:func:`completion_steps`); a step's reward is the sigmoid of its
    score. ``kind="outcome"``: the reward of an output is its last token's (paper 4.1.2); ``"process"``: the rewards of
    all its steps, with their end tokens (paper 4.1.3). An empty output has no reward (NaN)."""

    def __init__(self, rm: Any, tokenizer: Any, kind: Literal["outcome", "process"], *, batch_size: int = 32) -> None:
        self.rm = rm.eval()
        self.tokenizer = tokenizer
        self.kind = kind
        self.batch_size = batch_size

    def step_rewards(self, ro: Any) -> tuple[Tensor, Tensor]:
        """(Q, G, S) sigmoid step rewards (NaN-padded) and (Q, G, S) step-end indices of a rollout."""
        exs = []
        for n, ids in enumerate(rollout_completions(ro)):
            ends, _ = completion_steps(ids, self.tokenizer) if ids else ([], [])
            exs.append({"question": ro.rows[n]["question"], "completion_ids": ids, "step_ends": ends})
        keep = [i for i, ex in enumerate(exs) if ex["completion_ids"]]
        scores = dict(zip(keep, example_scores(self.rm, self.tokenizer, [exs[i] for i in keep], self.batch_size),
                          strict=True))
        rewards = [torch.sigmoid(torch.tensor(scores[i], dtype=torch.float64)).tolist() if i in scores else []
                   for i in range(len(exs))]
        return _pad_steps(rewards, [ex["step_ends"] if i in scores else [] for i, ex in enumerate(exs)],
                          ro.group_size)

    def rewards(self, ro: Any) -> Rewards:
        """The RM's rewards of every output of ``ro`` (class docstring)."""
        return step_rewards_as(*self.step_rewards(ro), self.kind)


class StepLabelSource:
    """Exact step labels as process rewards (``reward_source: process_rule``; a :class:`RewardSource`).

    Each rollout output's steps (:func:`completion_steps`) get the ``values`` labels of :func:`value_step_labels`
    (step k is right iff its result and every earlier one match the problem's running values; the last step's
    label is answer correctness), and the step rewards are those 0/1 labels, consumed like a process RM's (paper
    4.1.3). This is an oracle PRM: the labeller the reward_model stage trains its PRM on, applied directly. Not in
    the paper (its PRM is a trained model); it separates "process vs outcome supervision" from "how good the PRM is"
    on the generated problems, whose rows carry ``values``."""

    def __init__(self, tokenizer: Any, checker: str = "strict") -> None:
        self.tokenizer = tokenizer
        self.checker = checker  # answer checker mode of the last step's label (grpo.reward.checker)

    def step_rewards(self, ro: Any) -> tuple[Tensor, Tensor]:
        """(Q, G, S) 0/1 step labels (NaN-padded) and (Q, G, S) step-end indices of a rollout."""
        ends_all: list[list[int]] = []
        labels_all: list[list[float]] = []
        for n, (row, ids) in enumerate(zip(ro.rows, rollout_completions(ro), strict=True)):
            if "values" not in row:
                raise PipelineError("grpo.reward.source process_rule needs problem rows with a 'values' field "
                                    "(the generated problems); use process_rm for other data")
            if not ids:
                ends_all.append([])
                labels_all.append([])
                continue
            ends, texts = completion_steps(ids, self.tokenizer)
            outcome = int(accuracy_reward(completion=ro.texts[n], answer=row["answer"], checker=self.checker))
            ends_all.append(ends)
            labels_all.append([float(x) for x in value_step_labels(texts, row["values"], outcome)])
        return _pad_steps(labels_all, ends_all, ro.group_size)

    def rewards(self, ro: Any) -> Rewards:
        """The step labels of every output of ``ro`` as process rewards."""
        return step_rewards_as(*self.step_rewards(ro), "process")


def outcome_rm_source(inputs: Any) -> Any:
    """``outcome_rm``: the RM's last-token reward, behind the guards (``inputs``: stages.rl.sources.SourceInputs)."""
    return guarded(RewardModelSource(inputs.reward_model, inputs.tokenizer, "outcome",
                                     batch_size=inputs.p.optim.micro_batch_size),
                   inputs.p.reward.rm_guards, inputs.rm_examples, inputs.p.reward.checker)


def process_rm_source(inputs: Any) -> Any:
    """``process_rm``: the RM's reward at every step end, behind the guards."""
    return guarded(RewardModelSource(inputs.reward_model, inputs.tokenizer, "process",
                                     batch_size=inputs.p.optim.micro_batch_size),
                   inputs.p.reward.rm_guards, inputs.rm_examples, inputs.p.reward.checker)


def step_label_source(inputs: Any) -> Any:
    """``process_rule``: the exact step labels of the rows' running values."""
    return StepLabelSource(inputs.tokenizer, inputs.p.reward.checker)

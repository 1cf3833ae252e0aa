"""Guards against reward hacking for a learned reward (``grpo.reward.rm_guards``; reward_source outcome_rm / process_rm).

A policy trained on a reward model's scores finds outputs the RM overrates (Gao et al. 2023, "Scaling laws for
reward model overoptimization"). Besides GRPO's group normalisation and the KL penalty (beta), three guards, each a
param and each off at its neutral value:

- **running normalisation** (``normalize``, ``clip``): every RM reward r becomes ``(r - m) / (s + eps)``, m and s the
  running mean and standard deviation of all the run's RM rewards so far (this step's included; Welford's update),
  then clipped to ``[-clip, clip]`` (OpenRLHF's ``normalize_reward`` and ``reward_clip_range``). Alone it is an
  affine map per step, which GRPO's group normalisation undoes (only ``eps`` differs); it matters with the clip, the
  mixed reward and the length term below (it puts the RM on a known scale beside them), with ``scale_rewards`` batch
  / none, and for PPO (whose value model sees raw rewards).
- **mixed reward** (``rule_weight`` w): ``r + w * rule``, rule = answer correctness (stages.rl.rewards.accuracy_reward)
  of the output; process supervision adds it to the output's last step. The rule anchors the RM: a hacked output
  that the RM likes but whose answer is wrong loses w against a correct one.
- **length control** (``length_penalty`` lambda, ``length_target`` T): ``r - lambda * |L - T| / T`` for an output of
  L completion tokens (process: on its last step); T null = the mean completion length of the SFT samples the RM
  was trained on (origin ``sft`` in its examples.jsonl), the start policy's own length. It penalises the drift of
  RM-hacked policies towards longer or shorter outputs than the SFT model's.

The order is normalise (and clip), then add the rule, then subtract the length term. :class:`GuardedSource` wraps a
:class:`stages.rl.rm.RewardModelSource` and keeps the running statistics (``state_dict`` /
``load_state_dict``: the grpo stage checkpoints them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.core.errors import PipelineError
from stages.rl.rewards import Rewards, accuracy_reward

NORM_EPS = 1e-4


@dataclass
class RunningStats:
    """Running count, mean and sum of squared deviations (Welford / Chan et al. parallel update)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, x: Tensor) -> None:
        """Fold the finite entries of ``x`` into the statistics."""
        v = x[torch.isfinite(x)].double()
        k = int(v.numel())
        if not k:
            return
        b_mean = float(v.mean())
        b_m2 = float(((v - b_mean) ** 2).sum())
        n = self.n + k
        delta = b_mean - self.mean
        self.mean += delta * k / n
        self.m2 += b_m2 + delta * delta * self.n * k / n
        self.n = n

    @property
    def std(self) -> float:
        """The population std of everything seen (0 before two values)."""
        return math.sqrt(self.m2 / self.n) if self.n > 1 else 0.0


def normalize(x: Tensor, stats: RunningStats, clip: float | None, eps: float = NORM_EPS) -> Tensor:
    """``(x - mean) / (std + eps)`` with the running statistics, clipped to ``[-clip, clip]`` (None: no clip);
    NaN entries stay NaN. ``x``: any shape."""
    out = (x - stats.mean) / (stats.std + eps)
    return out.clamp(-clip, clip) if clip is not None else out


def length_term(lengths: Tensor, target: float, coef: float) -> Tensor:
    """``coef * |L - T| / T`` per output: (Q, G) completion lengths in tokens -> (Q, G) penalties."""
    return coef * (lengths.double() - target).abs() / target


def add_to_last_step(steps: Tensor, delta: Tensor) -> Tensor:
    """(Q, G, S) step rewards with ``delta`` (Q, G) added to each output's last finite step (outputs without one are
    left NaN)."""
    valid = torch.isfinite(steps)
    n = valid.sum(-1)
    last = (n - 1).clamp(min=0)
    out = steps.clone()
    bump = torch.zeros_like(steps)
    bump.scatter_(-1, last.unsqueeze(-1), delta.unsqueeze(-1).to(steps.dtype))
    return torch.where(valid & (n > 0).unsqueeze(-1), out + bump, out)


class GuardedSource:
    """A reward model source with the guards of this module applied to its rewards (module docstring).

    ``inner``: the RM source (``rewards(ro) -> Rewards``; per-step for process supervision). ``cfg``: the
    ``grpo.reward.rm_guards`` params. ``length_target``: T in tokens (resolved by the caller when the param is null).
    ``checker``: the answer checker mode of the mixed reward's correctness (``grpo.reward.checker``)."""

    def __init__(self, inner: Any, cfg: Any, length_target: float | None, checker: str = "strict") -> None:
        self.inner = inner
        self.cfg = cfg
        self.checker = checker
        self.length_target = length_target
        self.stats = RunningStats()

    @property
    def rm(self) -> Any:
        """The wrapped reward model (the step moves it between devices)."""
        return getattr(self.inner, "rm", None)

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.stats.n, "mean": self.stats.mean, "m2": self.stats.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = RunningStats(int(state["n"]), float(state["mean"]), float(state["m2"]))

    def rewards(self, ro: Any) -> Rewards:
        """The inner source's rewards with the guards applied; metrics ``rm_raw_mean`` (before the guards) and, when
        on, ``rm_norm_mean`` / ``rm_norm_std`` (the running statistics), ``length_penalty_mean``."""
        base = self.inner.rewards(ro)
        cfg = self.cfg
        x = base.steps if base.per_step else base.output
        assert x is not None
        metrics = dict(base.metrics)
        metrics["rm_raw_mean"] = float(torch.nanmean(base.output)) if torch.isfinite(base.output).any() else math.nan
        if cfg.normalize:
            self.stats.update(x)
            x = normalize(x, self.stats, cfg.clip)
            metrics["rm_norm_mean"], metrics["rm_norm_std"] = self.stats.mean, self.stats.std
        Q, G = base.output.shape
        delta = torch.zeros(Q, G, dtype=torch.float64)
        if cfg.rule_weight:
            acc = [accuracy_reward(completion=t, answer=r["answer"], checker=self.checker)
                   for t, r in zip(ro.texts, ro.rows, strict=True)]
            delta += cfg.rule_weight * torch.tensor(acc, dtype=torch.float64).view(Q, G)
        if cfg.length_penalty and self.length_target:
            pen = length_term(ro.completion_lengths.view(Q, G), self.length_target, cfg.length_penalty)
            delta -= pen
            metrics["length_penalty_mean"] = float(pen.mean())
        if base.per_step:
            steps = add_to_last_step(x, delta)
            return Rewards(torch.nanmean(steps, dim=-1), steps, base.step_ends, base.parts, metrics)
        return Rewards(x + delta, parts=base.parts, metrics=metrics)


def rm_sft_length(examples: list[dict[str, Any]]) -> float | None:
    """The mean completion length (tokens) of the SFT samples among an RM's training examples (origin ``sft``);
    None when there are none."""
    lens = [len(ex["completion_ids"]) for ex in examples if ex.get("origin", "sft") == "sft"]
    return sum(lens) / len(lens) if lens else None


def guarded(source: Any, cfg: Any, examples: list[dict[str, Any]], checker: str = "strict") -> Any:
    """``source`` wrapped in :class:`GuardedSource` when any guard of ``cfg`` (``grpo.reward.rm_guards``) is on, else
    ``source`` itself. ``examples``: the RM's training examples (the length target when ``cfg.length_target`` is
    null)."""
    if not (cfg.normalize or cfg.rule_weight or cfg.length_penalty):
        return source
    target = cfg.length_target if cfg.length_target is not None else rm_sft_length(examples)
    if cfg.length_penalty and target is None:
        raise PipelineError("grpo.reward.rm_guards.length_target: null needs the RM's SFT training samples (examples.jsonl "
                            "with origin 'sft') to measure the length; give length_target in tokens")
    return GuardedSource(source, cfg, target, checker)

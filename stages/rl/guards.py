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

A fourth guard watches instead of reshaping: **divergence** (``divergence.action`` stop / revert) compares, step by
step, the RM reward with the rule accuracy of the same samples (the step row's ``accuracy``: the gold reward the
generated problems have) and acts when the RM reward holds while the accuracy falls (:func:`divergence`, the
criterion; stages.rl.loop.watch_divergence, the action).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def window_means(xs: Sequence[float], window: int) -> list[float]:
    """``m_t = mean(xs[t-W+1 .. t])`` over the finite values of each window, for t = W-1 .. len(xs)-1 (NaN when a
    window has none)."""
    out = []
    for t in range(window - 1, len(xs)):
        v = [float(x) for x in xs[t - window + 1 : t + 1] if math.isfinite(float(x))]
        out.append(sum(v) / len(v) if v else math.nan)
    return out


def divergence(rm: Sequence[float], acc: Sequence[float], window: int, drop: float) -> tuple[int | None, bool]:
    """The overoptimisation criterion on a run's per-step RM rewards ``rm`` and rule accuracies ``acc`` of the same
    samples (the gold reward). A policy optimised against a proxy reward raises the gold reward at first, then lowers
    it while the proxy keeps rising (Gao, Schulman, Hilton 2022, "Scaling Laws for Reward Model Overoptimization";
    Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization", measure it the same way, gold against
    proxy). With W = ``window``, d = ``drop`` and the window means (:func:`window_means`)

        a_t = mean(acc[t-W+1 .. t]),    r_t = mean(rm[t-W+1 .. t])      (t >= W-1)

    the best window is s* = argmax_{W-1 <= s <= T} a_s (the earliest of ties; T the last step) and the run has
    diverged at T when

        a_T < a_{s*} - d    and    r_T >= r_{s*}

    the rule accuracy fell more than d below its best windowed mean while the RM reward is at least what it was
    then (an honest RM's reward falls with the accuracy). Returns (s*, diverged): s* indexes ``acc``, and is None
    (with False) before W steps or while no window has a finite accuracy."""
    a, r = window_means(acc, window), window_means(rm, window)
    finite = [i for i, x in enumerate(a) if math.isfinite(x)]
    if not finite:
        return None, False
    best = max(finite, key=lambda i: (a[i], -i))
    return best + window - 1, a[-1] < a[best] - drop and r[-1] >= r[best]

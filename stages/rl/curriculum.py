"""A pass-rate curriculum: prompts scored by their recent group accuracy, sampled away from the always- and
never-solved ones. Pure, seeded, deterministic functions, and :class:`PassRateCurriculum`, the table
of rates a run keeps (``grpo.curriculum``; the step draws from it in stages/rl/recipes.py, the driver saves it in the
resumable checkpoint).

A prompt the policy solves in every sample, or in none, gives a group with all-equal rewards: zero advantage, no
gradient, a wasted rollout. The curriculum keeps one number per prompt, its recent pass rate p (NaN until first
seen), updated after each step from the group accuracy of the prompts that step used::

    p <- acc                              first observation
    p <- ema * acc + (1 - ema) * p        later (ema = 1: the latest group accuracy, as prime-rl)

and samples the next step's prompts with weights by pool::

    unseen (p is NaN)   -> unseen_weight      (default 1: new prompts are tried at once)
    hard   (p <= low)   -> hard_weight        ("never solved"; low = 0 means exactly never)
    easy   (p >= high)  -> easy_weight        ("always solved"; high = 1 means exactly always)
    normal (otherwise)  -> normal_weight      (default 1)

Sampling is without replacement within a step, with probabilities proportional to the weights (successive sampling,
drawn as Efraimidis & Spirakis 2006: the n largest keys u^(1/w), u uniform), from a ``random.Random`` seeded by
(seed, step): the same arguments give the same prompts on every machine and Python version.

Peers: prime-rl's ``DifficultyPoolSampler`` (``orchestrator.train.source.curriculum.sampler``, type
``difficulty_pool``: named pools with an inclusive reward threshold and a relative weight, defaults hard <= 0.25 /
0.2, normal <= 0.75 / 1.0, easy / 0.2; unseen tasks weight 1; the latest group mean reward; sampling with
replacement) is this with ``ema = 1``, ``low = 0.25``, ``high`` just above 0.75 and weights 0.2 / 1 / 0.2, except
that prime-rl samples with replacement. open-r1's ``pass_rate_filtering`` is the offline version: prompts whose pass
rate (from a model's samples) is outside [0.3, 0.7] are dropped once: ``hard_weight = easy_weight = 0``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

POOLS: tuple[str, ...] = ("unseen", "hard", "normal", "easy")


@dataclass(frozen=True)
class CurriculumConfig:
    """The pools' bounds and weights (module docstring). low < high, weights >= 0, 0 < ema <= 1."""

    low: float = 0.0
    high: float = 1.0
    hard_weight: float = 0.1
    easy_weight: float = 0.1
    normal_weight: float = 1.0
    unseen_weight: float = 1.0
    ema: float = 1.0

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"curriculum low ({self.low}) must be below high ({self.high})")
        for name in ("hard_weight", "easy_weight", "normal_weight", "unseen_weight"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"curriculum {name} must be finite and >= 0, got {v}")
        if not 0 < self.ema <= 1:
            raise ValueError(f"curriculum ema must be in (0, 1], got {self.ema}")


def group_pass_rate(correct: Tensor) -> Tensor:
    """(Q, G) per-output correctness (1 / 0, NaN = not scored) -> (Q,) the mean over each group's scored outputs
    (NaN for a group with none)."""
    c = correct.to(torch.float64)
    ok = torch.isfinite(c)
    n = ok.sum(-1)
    s = torch.where(ok, c, torch.zeros_like(c)).sum(-1)
    return torch.where(n > 0, s / n.clamp(min=1), torch.full_like(s, math.nan))


def update_pass_rates(rates: Tensor, prompt_idx: Tensor, group_acc: Tensor, *, ema: float) -> Tensor:
    """A new (N,) table of pass rates after a step that used prompts ``prompt_idx`` (K,) with accuracies ``group_acc``
    (K,): the update rule of the module docstring, applied in order (a prompt used twice in a step is updated twice).
    A NaN accuracy (no scored output) leaves the rate unchanged. ``rates`` is not modified."""
    if not 0 < ema <= 1:
        raise ValueError(f"ema must be in (0, 1], got {ema}")
    if prompt_idx.shape != group_acc.shape or prompt_idx.dim() != 1:
        raise ValueError("prompt_idx and group_acc must both be (K,)")
    out = rates.to(torch.float64).clone()
    n = out.shape[0]
    for i, a in zip(prompt_idx.tolist(), group_acc.to(torch.float64).tolist(), strict=True):
        if not 0 <= i < n:
            raise ValueError(f"prompt index {i} outside [0, {n})")
        if math.isnan(a):
            continue
        old = float(out[i])
        out[i] = a if math.isnan(old) else ema * a + (1.0 - ema) * old
    return out


def pools(rates: Tensor, cfg: CurriculumConfig) -> Tensor:
    """(N,) long pool of each prompt: 0 unseen, 1 hard, 2 normal, 3 easy (:data:`POOLS`)."""
    r = rates.to(torch.float64)
    out = torch.full(r.shape, 2, dtype=torch.long, device=r.device)
    out = torch.where(r >= cfg.high, torch.full_like(out, 3), out)
    out = torch.where(r <= cfg.low, torch.full_like(out, 1), out)
    return torch.where(torch.isnan(r), torch.zeros_like(out), out)


def pass_rate_weights(rates: Tensor, cfg: CurriculumConfig) -> Tensor:
    """(N,) float64 sampling weight of each prompt: its pool's weight."""
    w = [cfg.unseen_weight, cfg.hard_weight, cfg.normal_weight, cfg.easy_weight]
    return torch.tensor(w, dtype=torch.float64, device=rates.device)[pools(rates, cfg)]


def weighted_sample(weights: Sequence[float], n: int, key: int) -> list[int]:
    """``n`` distinct indices drawn with probability proportional to ``weights`` (successive sampling without
    replacement), as Efraimidis & Spirakis 2006: the n largest keys u^(1/w), u uniform in (0, 1] from
    ``random.Random(key)``, in order. Zero weights come after every positive one, in random order (a uniform fill)."""
    if not 0 <= n <= len(weights):
        raise ValueError(f"cannot draw {n} of {len(weights)} items")
    rng = random.Random(key)
    keys = []
    for i, wi in enumerate(weights):
        u = 1.0 - rng.random()  # in (0, 1]
        keys.append((1, math.log(u) / wi, i) if wi > 0 else (0, u, i))  # log u / w: the key in log space
    return [i for *_, i in sorted(keys, reverse=True)[:n]]


def curriculum_sample(
    rates: Tensor, n: int, cfg: CurriculumConfig, *, seed: int, step: int
) -> tuple[list[int], dict[str, float]]:
    """The prompt indices of step ``step``: ``n`` distinct prompts drawn with probability proportional to
    :func:`pass_rate_weights` (module docstring), deterministic in (rates, n, cfg, seed, step).

    When fewer than ``n`` prompts have a positive weight, all of them are taken and the rest is filled uniformly from
    the zero-weight prompts (counted in ``n_filled``), so a step always has its ``n`` questions.

    Returns:
        (indices in draw order, metrics): ``pool_<name>`` (prompts in each pool), ``sampled_<name>`` (of the sample),
        ``n_filled``, ``sampled_pass_rate_mean`` (mean rate of the sampled prompts already seen; NaN if none).
    """
    N = rates.shape[0]
    if not 0 < n <= N:
        raise ValueError(f"curriculum_sample needs 0 < n <= {N} prompts, got n={n}")
    w = pass_rate_weights(rates, cfg).tolist()
    chosen = weighted_sample(w, n, seed * 1_000_003 + step)
    pool = pools(rates, cfg).cpu()
    metrics: dict[str, float] = {}
    for k, name in enumerate(POOLS):
        metrics[f"pool_{name}"] = float((pool == k).sum())
        metrics[f"sampled_{name}"] = float((pool[chosen] == k).sum())
    metrics["n_filled"] = float(sum(1 for i in chosen if w[i] <= 0))
    seen = rates.to(torch.float64).cpu()[chosen]
    seen = seen[~torch.isnan(seen)]
    metrics["sampled_pass_rate_mean"] = float(seen.mean()) if seen.numel() else math.nan
    return chosen, metrics


class PassRateCurriculum:
    """The curriculum of a run (``grpo.curriculum``): the (N,) table of pass rates of the prompt rows and the draws of
    the steps' questions from it. Deterministic in (rates, seed, step): :meth:`state_dict` goes into the resumable
    checkpoint, so a resumed run draws the questions the uninterrupted one would have.

    ``questions(step, n)``: step ``step``'s n prompts (:func:`curriculum_sample`); ``more(step, round_, n, exclude)``:
    n further prompts of the step for dynamic sampling's extra round ``round_`` (the same weights, drawn among the
    prompts the step has not used yet); ``observe(prompts, accuracies)``: the update after a step (every generated
    group, in order)."""

    def __init__(self, n_rows: int, cfg: CurriculumConfig, seed: int) -> None:
        if n_rows < 1:
            raise ValueError("the curriculum needs at least one prompt")
        self.cfg = cfg
        self.seed = seed
        self.rates = torch.full((n_rows,), math.nan, dtype=torch.float64)

    @classmethod
    def from_params(cls, c: Any, n_rows: int, seed: int) -> PassRateCurriculum:
        """From the ``grpo.curriculum`` params group ``c``."""
        names = ("low", "high", "hard_weight", "easy_weight", "normal_weight", "unseen_weight", "ema")
        return cls(n_rows, CurriculumConfig(**{k: getattr(c, k) for k in names}), seed)

    def questions(self, step: int, n: int) -> tuple[list[int], dict[str, float]]:
        """The ``n`` prompts of step ``step`` and the pools' metrics (``curriculum_<metric>``)."""
        chosen, m = curriculum_sample(self.rates, n, self.cfg, seed=self.seed, step=step)
        return chosen, {f"curriculum_{k}": v for k, v in m.items()}

    def more(self, step: int, round_: int, n: int, exclude: set[int]) -> list[int]:
        """Up to ``n`` prompts not in ``exclude``, drawn by the pools' weights (zero weights last, as
        :func:`weighted_sample`), for round ``round_`` >= 1 of step ``step``."""
        free = [i for i in range(self.rates.shape[0]) if i not in exclude]
        w = pass_rate_weights(self.rates[free], self.cfg).tolist() if free else []
        picks = weighted_sample(w, min(n, len(free)), (self.seed * 1_000_003 + step) * 7_919 + round_)
        return [free[k] for k in picks]

    def observe(self, prompts: Sequence[int], accuracies: Sequence[float]) -> None:
        """Update the pass rates with the group accuracies of ``prompts`` (NaN: no scored output, no change)."""
        if prompts:
            self.rates = update_pass_rates(
                self.rates,
                torch.tensor(list(prompts), dtype=torch.long),
                torch.tensor(list(accuracies), dtype=torch.float64),
                ema=self.cfg.ema,
            )

    def state_dict(self) -> dict[str, Any]:
        return {"rates": self.rates.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rates = torch.tensor(state["rates"], dtype=torch.float64)
        if rates.shape != self.rates.shape:
            raise ValueError(f"curriculum state has {rates.shape[0]} prompts, the run {self.rates.shape[0]}")
        self.rates = rates

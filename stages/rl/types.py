"""What the RL step's phases pass along (stages/rl/step.py), in one module that the step, the algorithms
(stages/rl/algorithms.py) and the driver (stages/rl/run.py) all import and that imports none of them.

- :class:`StepContext`: everything a run's steps work with, built once by :func:`stages.rl.run.setup`;
- :class:`Batch` (phase 1), :class:`Targets` with its :class:`RewardStats` (phase 3), :class:`LogProbs` (phase 4).
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from stages.rl.paradigm import RftPool
from stages.rl.rewards import RewardSet, RewardSource
from stages.rl.rollout import Rollout
from stages.rl.value import Critic
from stages.train.update import Updater


@dataclass(frozen=True)
class RewardStats:
    """This rank's sums behind the reward metrics of a step (summed over ranks by the step)."""

    acc_sum: float
    acc_n: float
    rew_sum: float
    rew_n: float
    n_zero: float
    n_groups: float
    std_sum: float
    n_fail: float

    def as_list(self) -> list[float]:
        return [self.acc_sum, self.acc_n, self.rew_sum, self.rew_n, self.n_zero, self.n_groups, self.std_sum,
                self.n_fail]


@dataclass(frozen=True)
class Targets:
    """What the update trains towards (phase 3 of the step; N outputs, T completion tokens).

    loss_mask: (N, T) tokens in the loss (0 for excluded outputs). weights: per output (N,) or per token (N, T), the
    advantages (policy-gradient losses) or gradient coefficients (the nll loss); None until ``finish_targets``
    (PPO). returns: (N, T) the value model's targets (PPO), else None. stats: the reward metrics' sums.
    metrics: extra per-step metrics of the algorithm. rewards: the (Q, G) per-output rewards the step reports."""

    loss_mask: Tensor
    weights: Tensor | None
    stats: RewardStats
    rewards: Tensor
    returns: Tensor | None = None
    metrics: dict[str, float] | None = None

    @property
    def train_rows(self) -> Tensor:
        """Indices of the outputs with at least one loss token."""
        return torch.nonzero(self.loss_mask.sum(-1) > 0).view(-1)


@dataclass
class Batch:
    """Phase 1: the step, this rank's question indices and their outputs (None when rft kept nothing for the step)."""

    step: int
    questions: list[int]
    rollout: Rollout | None


@dataclass
class LogProbs:
    """Phase 4, (N, T) each: pi_old (None: the update's first forward is pi_old), pi_ref (None: no reference) and the
    value model's V(s_t) at sampling time (None: no value model)."""

    old: Tensor | None
    ref: Tensor | None
    values: Tensor | None


@dataclass
class StepContext:
    """What every step of a run works with, built once by :func:`stages.rl.run.setup`.

    What a step computes with: p (the grpo params), the policy ``model`` and its ``updater``, the rollout
    ``generator``, the prompt ``rows``, the ``algorithm`` (a strategy of stages/rl/algorithms.py), the rule
    ``reward_set`` (the accuracy metric with every source) and the reward ``source`` (stages/rl/sources/; for rule,
    the reward set itself), ``ref_model`` (pi_ref or None), ``critic`` (PPO's value model or None), ``pool`` (rft's
    offline samples), ``offload`` (reference / reward model in CPU memory while idle) and ``sandbox_pool`` (the
    threads that run pot / tir programs, or None).

    What the loop keeps (:func:`stages.rl.run.train`): ``history`` (a metrics row per step), ``samples`` (the
    completion tables), ``info`` (run facts for the stage metrics), ``heldout`` (the held-out evaluation, or None),
    ``ckpt_dir`` (resumable checkpoints, or None), ``total_steps`` (the run's steps over all iterations),
    ``on_step`` (called with each row), ``step`` (the next step to run), ``iteration`` (Algorithm 1's, from 1),
    ``cache`` (what iterations continue with: rft's pool, PPO's value model), and with a reward-model source the
    ``reward_model`` and the examples it was trained on (``rm_examples``); ``curriculum``: the pass-rate curriculum
    (stages.rl.curriculum.PassRateCurriculum) when ``grpo.curriculum`` is on, else None; ``ledger``: the rollout
    ledger's writer (stages/rl/ledger.py) or None."""

    p: Any
    model: Any
    tokenizer: Any
    generator: Any
    updater: Updater
    rows: list[dict[str, Any]]
    algorithm: Any
    reward_set: RewardSet
    source: RewardSource | None = None
    ref_model: Any = None
    critic: Critic | None = None
    pool: RftPool | None = None
    offload: bool = False
    sandbox_pool: Executor | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    heldout: Any = None
    ckpt_dir: Path | None = None
    total_steps: int = 0
    on_step: Any = None
    step: int = 0
    iteration: int = 1
    cache: dict[str, Any] = field(default_factory=dict)
    reward_model: Any = None
    rm_examples: list[dict[str, Any]] = field(default_factory=list)
    validation: Any = None
    """The validation split's evaluations and best checkpoints (stages/rl/validation.py), or None."""
    tracker: Any = None
    """The per-step dvclive log (stages/rl/tracking.py), or None."""
    curriculum: Any = None
    ledger: Any = None

    @property
    def device(self) -> torch.device:
        return self.updater.device

"""What the RL loop (stages/rl/loop.py) works with and what its phases pass along, in one module below the loop, the
algorithms (stages/rl/algorithms.py) and the recipes (stages/rl/recipes.py):

- :class:`RunSpec`: what the run is, fixed from setup to the end (the params, the prompts, the strategy, where it
  reports); :class:`Models`: what the steps compute with (the policy and its update path, the sampler, the reference,
  the reward scorers, PPO's value model, RFT's pool); :class:`LoopState`: what the loop carries from step to step
  and a checkpoint restores;
- per step: :class:`Batch` (the sampled outputs), :class:`Targets` with its :class:`RewardStats` (advantages or
  gradient coefficients and the loss mask), :class:`LogProbs` (pi_old, pi_ref, the values).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from stages.rl.paradigm import RftPool
from stages.rl.rewards import RewardSet, RewardSource
from stages.rl.rollout import Rollout
from stages.train.update import Updater

Row = dict[str, Any]


@dataclass(frozen=True)
class RunSpec:
    """What the run is: ``p`` (the grpo params), the prompt ``rows``, the ``algorithm`` (a strategy of
    stages/rl/algorithms.py), the run's steps over all iterations, and what it reports to: the held-out and
    validation evaluations (stages/rl/heldout.py, stages/rl/validation.py), the per-step dvclive log
    (stages/rl/tracking.py), the rollout ledger (stages/rl/ledger.py) and ``on_step`` (called with each row); each
    None when off."""

    p: Any
    rows: list[Row]
    algorithm: Any
    total_steps: int
    heldout: Any = None
    validation: Any = None
    tracker: Any = None
    ledger: Any = None
    on_step: Callable[[Row], None] | None = None


@dataclass
class Models:
    """What a step computes with: the ``policy`` (trained in place), its ``updater`` and ``tokenizer``, the rollout
    ``generator``, the rule ``reward_set`` (the rule reward, and the accuracy metric with every source), the reward
    source's ``scorer`` (for rule, the reward set itself), the frozen ``reference`` (pi_ref) or None, PPO's
    ``critic`` or None, the ``reward_model`` of a reward-model source (and the examples it was trained on), RFT's
    offline ``pool``, the ``sandbox`` threads of pot / tir rollouts, the sync check's ``probe`` (None until the first
    sync makes it; False: no check), and ``offload`` (the reference and reward models in CPU memory while idle)."""

    policy: Any
    tokenizer: Any
    updater: Updater
    generator: Any
    reward_set: RewardSet
    scorer: RewardSource | None = None
    reference: Any = None
    critic: Any = None
    reward_model: Any = None
    rm_examples: list[Row] = field(default_factory=list)
    pool: RftPool | None = None
    sandbox: Executor | None = None
    probe: Any = None
    offload: bool = False

    @property
    def device(self) -> torch.device:
        return self.updater.device


@dataclass
class LoopState:
    """What the loop carries and a checkpoint restores: ``step`` (the next one), ``iteration`` (Algorithm 1's, from
    1), ``history`` (a metrics row per step), ``samples`` (the completion tables), ``info`` (run facts for the stage
    metrics), the pass-rate ``curriculum`` or None, the checkpoint directory ``ckpt_dir`` or None, ``resumed``:
    the iteration checkpoint a restarted run continues from, until PPO's value model has read its optimizer state;
    ``stopped``: the divergence guard ended the run, ``scratch``: its temporary directory without ``ckpt_dir``."""

    step: int = 0
    iteration: int = 1
    history: list[Row] = field(default_factory=list)
    samples: list[Row] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    curriculum: Any = None
    ckpt_dir: Path | None = None
    resumed: dict[str, Any] | None = None
    stopped: bool = False
    scratch: Any = None


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
    """What the update trains towards (N outputs, T completion tokens).

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
    """The step, this rank's question indices and their outputs (None when rft kept nothing for the step)."""

    step: int
    questions: list[int]
    rollout: Rollout | None


@dataclass
class LogProbs:
    """(N, T) each: pi_old (None: the update's first forward is pi_old), pi_ref (None: no reference) and the value
    model's V(s_t) at sampling time (None: no value model)."""

    old: Tensor | None
    ref: Tensor | None
    values: Tensor | None

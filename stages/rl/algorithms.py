"""The RL algorithms as small strategy objects in one registry (``grpo.algorithm``; its allowed values are the names
registered here). The paper's unified paradigm (section 5.2.1, stages/rl/paradigm.py has the table) plus PPO
(section 4.1.1), the method GRPO is argued against.

An algorithm says what differs between methods; the step (stages/rl/step.py) does the rest the same way for all:

- ``collect``: where the step's outputs come from (sampled from the current policy; rft: the offline pool);
- ``score``: the rewards (the run's reward source; rft: the pool's, all correct);
- ``targets``: per-output advantages or gradient coefficients, and which outputs train (the loss mask);
- ``finish_targets``: targets that need the log-prob phase's values and reference log-probs (PPO's GAE);
- ``policy_loss`` / ``loss_config``: the registered loss (stages/rl/losses.py) and its settings;
- ``uses_reference`` / ``needs_old_logprobs`` / ``make_critic``: the models the step needs.

sft has no sampling loop (``samples = False``): the stage runs the continued SFT of stages/rl/baseline.py for it.

Adding an algorithm: subclass :class:`Algorithm`, decorate it with ``@register_algorithm("name")``, and give the
params validator (stages/params.py, ``GrpoParams``) any pairing rule it needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from stages.rl.advantages import AdvantageConfig, AdvantageInput, Advantages, estimate_advantages, outcome_advantages
from stages.rl.losses import LossConfig
from stages.rl.paradigm import rft_coefficients
from stages.rl.rewards import Rewards, RewardSet

if TYPE_CHECKING:
    from stages.rl.rollout import Rollout
    from stages.rl.step import Batch, LogProbs, StepContext


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


def group_stats(rewards: Rewards, adv: Advantages, n_fail: int) -> RewardStats:
    """The reward metrics' sums of a sampled step: mean reward over valid outputs, answer accuracy (the rule
    functions' ``accuracy`` part), zero-std groups and the mean group std."""
    out = adv.rewards if adv.rewards is not None else rewards.output
    shown = torch.where(adv.valid, out, torch.full_like(out, math.nan))
    fin = shown[torch.isfinite(shown)]
    acc = [v for v in rewards.parts.get("accuracy", []) if math.isfinite(v)]
    return RewardStats(float(sum(acc)), float(len(acc)), float(fin.sum()), float(fin.numel()),
                       float(adv.n_zero_std_groups), float(out.shape[0]), float(adv.group_std.sum()), float(n_fail))


def exclude_invalid(mask: Tensor, adv: Advantages) -> int:
    """Mask out the outputs whose reward is invalid (in place); returns how many."""
    valid = adv.valid.reshape(-1)
    mask[~valid] = 0
    return int((~valid).sum())


class Algorithm:
    """Base strategy: sample G outputs per question from the current policy, score them with the run's reward
    source; subclasses give the targets and the loss."""

    name: ClassVar[str] = ""
    samples: ClassVar[bool] = True
    loss_metrics: ClassVar[tuple[str, ...]] = ()

    def check(self, p: Any) -> str | None:
        """A one-line problem with the params for this algorithm, or None (GrpoParams' validator calls it).
        Default: the rule reward only (the paradigm's sft / rft / online_rft, paper section 5.2.1)."""
        if p.reward.source != "rule":
            return (f"algorithm {self.name} uses the rule reward (paper section 5.2.1); set reward_source: rule, or "
                    "algorithm: grpo for a reward model")
        return None

    def reward_functions(self, p: Any) -> RewardSet:
        """The rule / custom reward functions of the run (the rewards of ``reward_source: rule``, and the accuracy
        metric with every source)."""
        return RewardSet.from_params(p.reward.accuracy_weight, p.reward.format_weight, p.reward.custom,
                                     p.reward.custom_weights, template=p.template)

    def uses_reference(self, p: Any) -> bool:
        """Whether the step needs the frozen reference model pi_ref."""
        return False

    def needs_old_logprobs(self, p: Any) -> bool:
        """Whether pi_old needs its own pass before the update (else the update's first forward is pi_old)."""
        return False

    def policy_loss(self, p: Any) -> str:
        """The registered policy loss (stages.rl.losses.POLICY_LOSSES) of the update."""
        return "nll"

    def loss_config(self, p: Any) -> LossConfig:
        return LossConfig(clip_eps=p.loss.clip_eps, clip_eps_high=p.loss.clip_eps_high, beta=0.0, aggregation=p.loss.aggregation)

    def make_critic(self, ctx: StepContext, cache: dict[str, Any]) -> Any:
        """A value model with its updater (PPO), or None."""
        return None

    def offline_pool(self, model: Any, generator: Any, rows: list[dict[str, Any]], p: Any, total_steps: int) -> Any:
        """Samples drawn once, before training, from the start model (rft's pool), or None."""
        return None

    def collect(self, ctx: StepContext, step: int, questions: list[int]) -> Rollout | None:
        from stages.rl.step import sample_rollout

        return sample_rollout(ctx, step, questions)

    def score(self, ctx: StepContext, batch: Batch) -> Rewards:
        from stages.rl.step import score_rollout

        assert batch.rollout is not None
        return score_rollout(ctx, batch.rollout)

    def targets(self, ctx: StepContext, batch: Batch, rewards: Rewards) -> Targets:
        raise NotImplementedError

    def finish_targets(self, ctx: StepContext, batch: Batch, rewards: Rewards, tg: Targets, lp: LogProbs) -> Targets:
        return tg


ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: register one instance of the strategy under ``name``."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is registered twice")
        cls.name = name
        ALGORITHMS[name] = cls()
        return cls

    return deco


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; an unknown name is a one-line error listing the registered ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def advantage_config(p: Any) -> AdvantageConfig:
    """The estimator settings of the grpo params."""
    ppo = p.ppo
    return AdvantageConfig(scale_rewards=p.advantage.scale_rewards, eps=p.advantage.eps, gamma=ppo.gamma, lam=ppo.lam,
                           kl_coef=p.kl.beta, whiten=ppo.whiten)


@register_algorithm("sft")
class Sft(Algorithm):
    """Continued SFT on the prompt rows' gold CoT solutions (gradient coefficient 1): no sampling loop here."""

    samples = False


def rule_reward_set() -> RewardSet:
    """The paper's "Rule" reward of RFT / online RFT: answer correctness alone (accuracy_reward, weight 1)."""
    return RewardSet.from_params(1.0, 0.0, [], [])


@register_algorithm("rft")
class Rft(Algorithm):
    """RFT: the SFT loss on the correct, deduplicated outputs sampled once from the SFT model (the pool)."""

    loss_metrics = ("nll",)

    def reward_functions(self, p: Any) -> RewardSet:
        return rule_reward_set()

    def collect(self, ctx: StepContext, step: int, questions: list[int]) -> Rollout | None:
        from stages.rl.rollout import build_rollout, rollout_prompt

        if ctx.pool is None:
            raise ValueError("grpo_step: algorithm rft needs the RFT pool")
        kept = ctx.pool.step_samples(questions)
        rows = [ctx.rows[q] for q, _ in kept]
        prompts = [rollout_prompt(r["question"], getattr(c, "mode", "cot"), ctx.p.template, ctx.tokenizer)
                   for r, (_, c) in zip(rows, kept, strict=True)]
        return build_rollout(rows, prompts, [[c] for _, c in kept], ctx.tokenizer, mask_truncated=ctx.p.loss.mask_truncated,
                             mask_written=ctx.p.loss.mask_written_outputs) if kept else None

    def offline_pool(self, model: Any, generator: Any, rows: list[dict[str, Any]], p: Any, total_steps: int) -> Any:
        """``group_size`` outputs of ``model`` (the SFT model) for every question of steps 0 .. total_steps - 1 (this
        rank's share), each question in its rollout mode (``grpo.rollout``, drawn as for step -1), the correct ones
        kept once each (stages.rl.paradigm.rft_pool_from_samples)."""
        from stages.core.dist import rank, world_size
        from stages.rl.paradigm import rft_pool_from_samples, run_questions
        from stages.rl.rewards import accuracy_reward
        from stages.rl.rollout import question_modes, sample_outputs

        qidx = run_questions(len(rows), total_steps, p.questions_per_step, p.seed, rank=rank(), world=world_size())
        model.eval()
        outs, _ = sample_outputs(generator, getattr(generator, "tokenizer", None), [rows[q]["question"] for q in qidx],
                                 question_modes(p.rollout, p.seed, -1, qidx), p, seed=p.seed * 1_000_003 - 1)
        return rft_pool_from_samples(rows, qidx, outs, lambda row, c: accuracy_reward(
            completion=c.text, answer=row["answer"], mode=c.mode, program_answer=c.program_answer) == 1.0)

    def score(self, ctx: StepContext, batch: Batch) -> Rewards:
        n = 0 if batch.rollout is None else len(batch.rollout.texts)
        return Rewards(torch.ones(n, 1, dtype=torch.float64))  # every kept output is correct

    def targets(self, ctx: StepContext, batch: Batch, rewards: Rewards) -> Targets:
        ro, pool, qs = batch.rollout, ctx.pool, batch.questions
        assert pool is not None
        N = rewards.output.shape[0]
        mask = torch.zeros(N, 1) if ro is None else ro.loss_mask.clone()
        acc_sum = float(sum(pool.n_correct.get(q, 0) for q in qs))
        acc_n = float(sum(pool.n_sampled.get(q, 0) for q in qs))
        stats = RewardStats(acc_sum, acc_n, acc_sum, acc_n, 0.0, float(len(qs)), 0.0, 0.0)
        return Targets(mask, rft_coefficients(torch.ones(N, dtype=torch.bool)), stats, rewards.output,
                       metrics={"n_kept": N})


@register_algorithm("online_rft")
class OnlineRft(Algorithm):
    """Online RFT: each step G outputs per question from the current policy, the SFT loss on the correct ones
    (gradient coefficient I(o), paper eq. 10); no reference model."""

    loss_metrics = ("nll",)

    def reward_functions(self, p: Any) -> RewardSet:
        return rule_reward_set()

    def targets(self, ctx: StepContext, batch: Batch, rewards: Rewards) -> Targets:
        assert batch.rollout is not None
        mask = batch.rollout.loss_mask.clone()
        correct = torch.nan_to_num(rewards.output.reshape(-1), nan=0.0) == 1.0
        mask[~correct] = 0
        adv = replace(outcome_advantages(rewards.output, scale_rewards="group", eps=ctx.p.advantage.eps),
                      rewards=rewards.output)  # group statistics for the metrics
        n_fail = exclude_invalid(mask, adv)
        return Targets(mask, rft_coefficients(correct), group_stats(rewards, adv, n_fail), rewards.output)


@register_algorithm("grpo")
class Grpo(Algorithm):
    """GRPO (paper section 4.1): advantages from ``grpo.advantage.estimator`` (group-relative by default: outcome or
    process supervision by the reward source), the clipped surrogate with the k3 KL in the loss (eq. 3-4)."""

    loss_metrics = ("ratio_mean",)

    def check(self, p: Any) -> str | None:
        if p.advantage.estimator == "gae":
            return "advantage_estimator gae needs a value model: use algorithm ppo, or another estimator with grpo"
        return None

    def uses_reference(self, p: Any) -> bool:
        return p.kl.beta > 0

    def needs_old_logprobs(self, p: Any) -> bool:
        return not (p.optim.mu == 1 and p.optim.minibatches == 1)

    def policy_loss(self, p: Any) -> str:
        return p.loss.policy

    def loss_config(self, p: Any) -> LossConfig:
        return replace(super().loss_config(p), beta=p.kl.beta)

    def targets(self, ctx: StepContext, batch: Batch, rewards: Rewards) -> Targets:
        ro, p = batch.rollout, ctx.p
        assert ro is not None
        mask = ro.loss_mask.clone()
        adv = estimate_advantages(p.advantage.estimator, AdvantageInput(rewards, ro.completion_mask),
                                  advantage_config(p))
        n_fail = exclude_invalid(mask, adv)
        if p.advantage.skip_zero_std_groups:
            Q = adv.valid.shape[0]
            informative = (adv.advantages != 0).reshape(Q, -1).any(dim=1).repeat_interleave(p.rollout.group_size)
            mask[~informative] = 0
        shown = torch.where(adv.valid, adv.rewards, torch.full_like(adv.rewards, math.nan)) \
            if adv.rewards is not None else rewards.output
        return Targets(mask, adv.advantages.float().flatten(0, 1), group_stats(rewards, adv, n_fail), shown)


@register_algorithm("ppo")
class Ppo(Algorithm):
    """PPO (paper section 4.1.1, eq. 1-2, Figure 4): a value model, the per-token reward of eq. 2 (the reward at the
    last token minus beta x log pi_old / pi_ref: the KL in the reward, none in the loss), GAE (``grpo.ppo.gamma`` /
    ``lam``), the clipped surrogate, and the value loss (clipped when ``grpo.ppo.value_clip``). Every valid output
    trains (the value baseline gives all-equal-reward groups non-zero advantages). The G outputs per question are
    sampled as for GRPO, so the two see the same data."""

    loss_metrics = ("ratio_mean",)

    def check(self, p: Any) -> str | None:
        if p.advantage.estimator != "gae":
            return "algorithm ppo estimates advantages with its value model: set advantage_estimator: gae"
        return None

    def uses_reference(self, p: Any) -> bool:
        return p.kl.beta > 0

    def needs_old_logprobs(self, p: Any) -> bool:
        return p.kl.beta > 0 or not (p.optim.mu == 1 and p.optim.minibatches == 1)  # eq. 2 reads pi_old before the update

    def policy_loss(self, p: Any) -> str:
        return p.loss.policy

    def make_critic(self, ctx: StepContext, cache: dict[str, Any]) -> Any:
        from stages.rl.step import make_critic

        return make_critic(ctx, cache)

    def targets(self, ctx: StepContext, batch: Batch, rewards: Rewards) -> Targets:
        ro = batch.rollout
        assert ro is not None
        mask = ro.loss_mask.clone()
        valid = torch.isfinite(rewards.output)
        mask[~valid.reshape(-1)] = 0
        return Targets(mask, None, RewardStats(0, 0, 0, 0, 0, 0, 0, float((~valid).sum())), rewards.output)

    def finish_targets(self, ctx: StepContext, batch: Batch, rewards: Rewards, tg: Targets, lp: LogProbs) -> Targets:
        assert lp.values is not None
        log_ratio = None if lp.ref is None or lp.old is None else lp.old - lp.ref
        adv = estimate_advantages(ctx.p.advantage.estimator,
                                  AdvantageInput(rewards, tg.loss_mask, values=lp.values, log_ratio=log_ratio),
                                  advantage_config(ctx.p))
        assert adv.returns is not None
        stats = replace(group_stats(rewards, adv, int(tg.stats.n_fail)))
        return replace(tg, weights=adv.advantages.flatten(0, 1), returns=adv.returns.flatten(0, 1), stats=stats,
                       metrics={"adv_abs_mean": _masked_mean(adv.advantages.flatten(0, 1).abs(), tg.loss_mask),
                                "return_mean": _masked_mean(adv.returns.flatten(0, 1), tg.loss_mask)})


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    m = mask.bool()
    return float(x[m].double().mean()) if m.any() else math.nan

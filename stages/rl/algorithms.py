"""The RL algorithms as small strategy objects, the implementations of the algorithm registry (``grpo.algorithm``;
stages/rl/registry.py ALGORITHMS declares each name and what it needs). The paper's unified paradigm (section 5.2.1, stages/rl/paradigm.py has the table) plus PPO
(section 4.1.1), the method GRPO is argued against.

An algorithm says what differs between methods; the loop (stages/rl/loop.py) does the rest the same way for all.
Each method gets the run (a :class:`stages.rl.types.RunSpec`) and the models (:class:`stages.rl.types.Models`):

- ``collect``: where the step's outputs come from (sampled from the current policy; rft: the offline pool);
- ``score``: the rewards (the run's reward source; rft: the pool's, all correct);
- ``targets``: per-output advantages or gradient coefficients, and which outputs train (the loss mask);
- ``finish_targets``: targets that need the log-prob phase's values and reference log-probs (PPO's GAE);
- ``policy_loss`` / ``loss_config``: the registered loss (stages/rl/losses.py) and its settings;
- ``uses_reference`` / ``needs_old_logprobs``: the models the step needs (a value model: the spec's ``critic``).

sft has no sampling loop (its spec's ``samples`` is false): the stage runs stages/rl/baseline.py's continued SFT.

Adding an algorithm: declare its :class:`stages.rl.registry.AlgorithmSpec` in stages/rl/registry.py (what it needs:
a KL and where, a value model, the rule reward only; the params check pairs it with estimators and reward sources
from there), then subclass :class:`Algorithm` here and decorate it with ``@register_algorithm("name")``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from stages.core.dist import rank, world_size
from stages.core.modeling import on_device
from stages.rl import registry
from stages.rl.advantages import AdvantageConfig, AdvantageInput, Advantages, estimate_advantages, outcome_advantages
from stages.rl.losses import LossConfig
from stages.rl.paradigm import rft_coefficients, rft_pool_from_samples, run_questions
from stages.rl.rewards import Rewards, RewardSet, accuracy_reward
from stages.rl.rollout import Rollout, build_rollout, question_modes, rollout_prompt, sample_outputs
from stages.rl.types import Batch, LogProbs, Models, RewardStats, RunSpec, Targets


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
    source; subclasses give the targets and the loss. What an algorithm needs (a reference model, a value model,
    the rule reward only, a sampling loop) is declared in its spec (stages/rl/registry.py ALGORITHMS)."""

    name: ClassVar[str] = ""
    loss_metrics: ClassVar[tuple[str, ...]] = ()

    @property
    def spec(self) -> registry.AlgorithmSpec:
        return registry.ALGORITHMS.spec(self.name)

    @property
    def samples(self) -> bool:
        return self.spec.samples

    def reward_functions(self, p: Any) -> RewardSet:
        """The rule / custom reward functions of the run (the rewards of ``reward.source: rule``, and the accuracy
        metric with every source)."""
        return RewardSet.from_params(p.reward.accuracy_weight, p.reward.format_weight, p.reward.custom,
                                     p.reward.custom_weights, template=p.template, checker=p.reward.checker)

    def uses_reference(self, p: Any) -> bool:
        """Whether the step needs the frozen reference model pi_ref (the spec: a KL with beta > 0)."""
        return self.spec.uses_reference(p)

    def needs_old_logprobs(self, p: Any) -> bool:
        """Whether pi_old needs its own pass before the update (else the update's first forward is pi_old)."""
        return False

    def policy_loss(self, p: Any) -> str:
        """The registered policy loss (stages.rl.losses.POLICY_LOSSES) of the update."""
        return "nll"

    def loss_config(self, p: Any) -> LossConfig:
        """What every policy loss reads (the loss's own settings come from its params block)."""
        return LossConfig(clip_eps=p.loss.clip_eps, clip_eps_high=p.loss.clip_eps_high, beta=0.0,
                          aggregation=p.loss.aggregation)

    def offline_pool(self, model: Any, generator: Any, rows: list[dict[str, Any]], p: Any, total_steps: int) -> Any:
        """Samples drawn once, before training, from the start model (rft's pool), or None."""
        return None

    def collect(self, run: RunSpec, models: Models, step: int, questions: list[int]) -> Rollout | None:
        return sample_rollout(run, models, step, questions)

    def score(self, run: RunSpec, models: Models, batch: Batch) -> Rewards:
        assert batch.rollout is not None
        return score_rollout(models, batch.rollout)

    def targets(self, run: RunSpec, models: Models, batch: Batch, rewards: Rewards) -> Targets:
        raise NotImplementedError

    def finish_targets(self, p: Any, batch: Batch, rewards: Rewards, tg: Targets, lp: LogProbs) -> Targets:
        return tg


ROUND_SEED = 1_000_000_007
"""Extra round r of a step samples with seed ``seed * 1_000_003 + step + ROUND_SEED * r`` (r = 0: the step's own)."""


def sample_rollout(run: RunSpec, models: Models, step: int, questions: list[int], round_: int = 0) -> Rollout:
    """G outputs per question from the current policy, each question in its rollout mode (``grpo.rollout``; the tool
    loop of stages/core/tool_loop.py with the sandbox threads ``models.sandbox``), seeded by seed and step (and
    ``round_``, dynamic sampling's extra generation rounds of the step: stages/rl/recipes.py)."""
    p, tok = run.p, models.tokenizer
    batch = [run.rows[i] for i in questions]
    modes = question_modes(p.rollout, p.seed, step, questions)
    models.policy.eval()
    samples, metrics = sample_outputs(models.generator, tok, [r["question"] for r in batch], modes, p,
                                      seed=p.seed * 1_000_003 + step + ROUND_SEED * round_, pool=models.sandbox)
    sleep = getattr(models.generator, "sleep", None)
    if callable(sleep):
        sleep()  # vllm sleep mode: the engine's memory goes to the update
    prompts = [rollout_prompt(r["question"], m, p.template, tok) for r, m in zip(batch, modes, strict=True)]
    ro = build_rollout(batch, prompts, samples, tok, mask_truncated=p.loss.mask_truncated,
                       mask_written=p.loss.mask_written_outputs)
    ro.metrics.update(metrics)
    return ro


def score_rollout(models: Models, ro: Rollout) -> Rewards:
    """The rule / custom functions' rewards, or the run's reward source's (a reward model, the step labels, a
    function source) with the functions' values kept as ``parts`` (the accuracy metric)."""
    rule = models.reward_set.rewards(ro)
    if models.scorer is None or models.scorer is models.reward_set:
        return rule
    with on_device(getattr(models.scorer, "rm", None), models.device, models.offload):
        return models.scorer.rewards(ro).with_parts(rule.parts)


ALGORITHMS: dict[str, Algorithm] = registry.ALGORITHMS.impls
"""The registered strategies by name (stages/rl/registry.py holds their specs)."""


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: register one instance of the strategy under ``name`` (declared in stages/rl/registry.py)."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        registry.ALGORITHMS.register(name)(cls())
        return cls

    return deco


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; an unknown name is a one-line error listing the registered ones."""
    return registry.ALGORITHMS.get(name)


def advantage_config(p: Any) -> AdvantageConfig:
    """The estimator settings of the grpo params."""
    ppo = p.ppo
    return AdvantageConfig(scale_rewards=p.advantage.scale_rewards, eps=p.advantage.eps, gamma=ppo.gamma, lam=ppo.lam,
                           kl_coef=p.kl.beta, whiten=ppo.whiten)


@register_algorithm("sft")
class Sft(Algorithm):
    """Continued SFT on the prompt rows' gold CoT solutions (gradient coefficient 1): no sampling loop here (the
    driver runs stages.rl.baseline.continued_sft for it)."""


def rule_reward_set(checker: str = "strict") -> RewardSet:
    """The paper's "Rule" reward of RFT / online RFT: answer correctness alone (accuracy_reward, weight 1) under answer
    checker mode ``checker`` (``grpo.reward.checker``)."""
    return RewardSet.from_params(1.0, 0.0, [], [], checker=checker)


@register_algorithm("rft")
class Rft(Algorithm):
    """RFT: the SFT loss on the correct, deduplicated outputs sampled once from the SFT model (the pool)."""

    loss_metrics = ("nll",)

    def reward_functions(self, p: Any) -> RewardSet:
        return rule_reward_set(p.reward.checker)

    def collect(self, run: RunSpec, models: Models, step: int, questions: list[int]) -> Rollout | None:
        if models.pool is None:
            raise ValueError("algorithm rft needs the RFT pool (stages.rl.loop.begin_iteration draws it)")
        kept = models.pool.step_samples(questions)
        rows, p, tok = [run.rows[q] for q, _ in kept], run.p, models.tokenizer
        prompts = [rollout_prompt(r["question"], getattr(c, "mode", "cot"), p.template, tok)
                   for r, (_, c) in zip(rows, kept, strict=True)]
        return build_rollout(rows, prompts, [[c] for _, c in kept], tok, mask_truncated=p.loss.mask_truncated,
                             mask_written=p.loss.mask_written_outputs) if kept else None

    def offline_pool(self, model: Any, generator: Any, rows: list[dict[str, Any]], p: Any, total_steps: int) -> Any:
        """``group_size`` outputs of ``model`` (the SFT model) for every question of steps 0 .. total_steps - 1 (this
        rank's share), each question in its rollout mode (``grpo.rollout``, drawn as for step -1), the correct ones
        kept once each (stages.rl.paradigm.rft_pool_from_samples)."""
        qidx = run_questions(len(rows), total_steps, p.questions_per_step, p.seed, rank=rank(), world=world_size())
        model.eval()
        outs, _ = sample_outputs(generator, getattr(generator, "tokenizer", None), [rows[q]["question"] for q in qidx],
                                 question_modes(p.rollout, p.seed, -1, qidx), p, seed=p.seed * 1_000_003 - 1)
        return rft_pool_from_samples(rows, qidx, outs, lambda row, c: accuracy_reward(
            completion=c.text, answer=row["answer"], mode=c.mode, program_answer=c.program_answer,
            checker=p.reward.checker) == 1.0)

    def score(self, run: RunSpec, models: Models, batch: Batch) -> Rewards:
        n = 0 if batch.rollout is None else len(batch.rollout.texts)
        return Rewards(torch.ones(n, 1, dtype=torch.float64))  # every kept output is correct

    def targets(self, run: RunSpec, models: Models, batch: Batch, rewards: Rewards) -> Targets:
        ro, pool, qs = batch.rollout, models.pool, batch.questions
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
        return rule_reward_set(p.reward.checker)

    def targets(self, run: RunSpec, models: Models, batch: Batch, rewards: Rewards) -> Targets:
        assert batch.rollout is not None
        mask = batch.rollout.loss_mask.clone()
        correct = torch.nan_to_num(rewards.output.reshape(-1), nan=0.0) == 1.0
        mask[~correct] = 0
        adv = replace(outcome_advantages(rewards.output, scale_rewards="group", eps=run.p.advantage.eps),
                      rewards=rewards.output)  # group statistics for the metrics
        n_fail = exclude_invalid(mask, adv)
        return Targets(mask, rft_coefficients(correct), group_stats(rewards, adv, n_fail), rewards.output)


@register_algorithm("grpo")
class Grpo(Algorithm):
    """GRPO (paper section 4.1): advantages from ``grpo.advantage.estimator`` (group-relative by default: outcome or
    process supervision by the reward source), the clipped surrogate with the k3 KL in the loss (eq. 3-4)."""

    loss_metrics = ("ratio_mean",)

    def needs_old_logprobs(self, p: Any) -> bool:
        return not (p.optim.mu == 1 and p.optim.minibatches == 1)

    def policy_loss(self, p: Any) -> str:
        return p.loss.policy

    def loss_config(self, p: Any) -> LossConfig:
        return replace(super().loss_config(p), beta=p.kl.beta)

    def targets(self, run: RunSpec, models: Models, batch: Batch, rewards: Rewards) -> Targets:
        ro, p = batch.rollout, run.p
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

    def needs_old_logprobs(self, p: Any) -> bool:
        return p.kl.beta > 0 or not (p.optim.mu == 1 and p.optim.minibatches == 1)  # eq. 2 reads pi_old first

    def policy_loss(self, p: Any) -> str:
        return p.loss.policy

    def targets(self, run: RunSpec, models: Models, batch: Batch, rewards: Rewards) -> Targets:
        ro = batch.rollout
        assert ro is not None
        mask = ro.loss_mask.clone()
        valid = torch.isfinite(rewards.output)
        mask[~valid.reshape(-1)] = 0
        return Targets(mask, None, RewardStats(0, 0, 0, 0, 0, 0, 0, float((~valid).sum())), rewards.output)

    def finish_targets(self, p: Any, batch: Batch, rewards: Rewards, tg: Targets, lp: LogProbs) -> Targets:
        assert lp.values is not None
        log_ratio = None if lp.ref is None or lp.old is None else lp.old - lp.ref
        adv = estimate_advantages(p.advantage.estimator,
                                  AdvantageInput(rewards, tg.loss_mask, values=lp.values, log_ratio=log_ratio),
                                  advantage_config(p))
        assert adv.returns is not None
        stats = replace(group_stats(rewards, adv, int(tg.stats.n_fail)))
        return replace(tg, weights=adv.advantages.flatten(0, 1), returns=adv.returns.flatten(0, 1), stats=stats,
                       metrics={"adv_abs_mean": _masked_mean(adv.advantages.flatten(0, 1).abs(), tg.loss_mask),
                                "return_mean": _masked_mean(adv.returns.flatten(0, 1), tg.loss_mask)})


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    m = mask.bool()
    return float(x[m].double().mean()) if m.any() else math.nan

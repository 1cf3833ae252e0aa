"""One RL step as five phases, the same for every algorithm (the differences live in stages/rl/algorithms.py):

1. ``collect``   questions_per_step questions (stages.rl.data.step_questions, or the pass-rate curriculum; each rank
                 its share) and their outputs: G samples each from pi_old (``algorithm.collect``; rft: the offline
                 pool) -> :class:`Batch`;
2. ``score``     the rewards of every output (``algorithm.score``: the run's reward source, stages.rl.rewards; plus
                 the overlong penalty) -> :class:`stages.rl.rewards.Rewards`. Phases 1-2 are
                 stages.rl.recipes.collect_scored, which with dynamic sampling repeats them for new questions until
                 the batch has questions_per_step groups with reward spread;
3. ``targets``   advantages or gradient coefficients and the loss mask (``algorithm.targets``: an estimator of
                 stages.rl.advantages) -> :class:`stages.rl.algorithms.Targets`;
4. ``logprobs``  pi_old (when it cannot be the update's first forward), pi_ref and the value model's values, over
                 the outputs that train -> :class:`LogProbs` (then ``algorithm.finish_targets``: PPO's GAE);
5. ``update``    ``mu`` passes over the batch, each split into ``minibatches`` optimizer steps accumulated over
                 micro-batches of ``micro_batch_size`` with batch-wide loss normalisers (the registered policy loss
                 of stages.rl.losses; PPO also trains its value model) -> metrics. A step whose loss or gradient
                 norm is not finite is skipped (no optimizer update) and counted.

:func:`run_step` reads top to bottom; :class:`PhaseTimer` times each phase (wall and CPU seconds, ``t_<phase>`` and
``cpu_<phase>``). Log-probs come from a teacher-forced pass (logits / temperature; with top-k / top-p the truncated,
renormalised distribution the sampler drew from: stages.rl.rollout.truncation); with
``mu = 1`` and one minibatch the update's first forward is pi_old (old = logp.detach(), the ratio is exactly 1).
Several ranks: the loss normalisers are summed over ranks and ranks with fewer micro-batches pad with zero-gradient
passes (stages.train.update.Updater.dummy_backward).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stages.core import threads
from stages.core.dist import all_reduce
from stages.rl import registry
from stages.rl.corrections import step_metrics, step_weights
from stages.rl.losses import LossNormalizer, entropy_bonus, value_loss
from stages.rl.recipes import collect_scored
from stages.rl.rewards import Rewards
from stages.rl.rollout import Rollout, mismatch_metrics, token_logprobs, truncation
from stages.rl.sync import sync_policy
from stages.rl.types import Batch, LogProbs, RewardStats, StepContext, Targets
from stages.rl.update import on_device, update_adapts
from stages.train.update import Updater, micro_slices

LOSS_METRICS = ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "nll")
LOSS_METRIC_DEFAULTS = {"ratio_mean": 0.0, "nll": math.nan}


class PhaseTimer:
    """Wall and CPU seconds per phase: ``with timer("update"): ...`` adds ``t_update`` and ``cpu_update``."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            for key, v in ((f"t_{name}", time.perf_counter() - t0), (f"cpu_{name}", time.process_time() - c0)):
                self.metrics[key] = self.metrics.get(key, 0.0) + v

    def totals(self) -> dict[str, float]:
        """The phase times plus ``step_s`` / ``cpu_step_s``, their sums."""
        m = dict(self.metrics)
        m["step_s"] = sum(v for k, v in m.items() if k.startswith("t_"))
        m["cpu_step_s"] = sum(v for k, v in m.items() if k.startswith("cpu_"))
        return m


def run_step(step: int, ctx: StepContext) -> tuple[dict[str, Any], Rollout | None, Tensor]:
    """One step of ``ctx.p.algorithm``: returns (metrics row, rollout, the (Q, G) per-output rewards; (N, 1) for rft's
    kept samples). The rollout is None when rft kept nothing for the step."""
    algo, timer = ctx.algorithm, PhaseTimer()
    m: dict[str, Any] = {"step": step}
    if ctx.ledger is not None:
        ctx.ledger.begin(ctx)  # the rollout ledger: the weights that sample this step (stages/rl/ledger.py)
    batch, rewards, recipe_metrics = collect_scored(ctx, step, timer)  # timed as generation / scoring inside
    with timer("scoring"):
        tg = algo.targets(ctx, batch, rewards)
    with timer("logprobs"):
        lp = logprobs(ctx, batch, tg)
        tg = algo.finish_targets(ctx, batch, rewards, tg, lp)
    with timer("scoring"):
        m.update(reward_metrics(tg.stats, batch.rollout), **rewards.metrics, **(tg.metrics or {}))
        m.update(rollout_metrics(batch.rollout, rewards), **recipe_metrics)
    with timer("update"):
        m.update(update(ctx, batch, tg, lp))
    m["n_train_outputs"] = int(all_reduce([float(tg.train_rows.numel())])[0])
    if ctx.ledger is not None:
        ctx.ledger.record(ctx, batch, rewards, tg, lp, m)
    m.update(timer.totals())
    return m, batch.rollout, tg.rewards


# ---------------------------------------------------------------------------------------------
# 2. score


def reward_metrics(stats: RewardStats, ro: Rollout | None) -> dict[str, float]:
    """Reward mean / std, accuracy, zero-std share and failures over every rank, completion length and truncation."""
    acc_sum, acc_n, rew_sum, rew_n, n_zero, n_groups, std_sum, n_fail = all_reduce(stats.as_list())
    N = 0 if ro is None else len(ro.texts)
    return {
        "reward_mean": rew_sum / rew_n if rew_n else math.nan,
        "reward_std": std_sum / n_groups if n_groups else math.nan,
        "accuracy": acc_sum / acc_n if acc_n else math.nan,
        "zero_std_frac": n_zero / n_groups if n_groups else math.nan,
        "n_reward_failures": int(n_fail),
        "completion_len": float(ro.completion_lengths.float().mean()) if ro is not None else math.nan,
        "truncated_frac": (sum(r == "length" for r in ro.finish_reasons) / N) if ro is not None and N else 0.0,
    }


def rollout_metrics(ro: Rollout | None, rewards: Rewards) -> dict[str, float]:
    """The sampling's own metrics (programs, sandbox time, TIR rounds: Rollout.metrics) and, when the step mixes
    rollout modes, the answer accuracy of each mode's outputs (``accuracy_<mode>``; this rank's)."""
    if ro is None:
        return {}
    m = dict(ro.metrics)
    acc = rewards.parts.get("accuracy")
    if acc is not None and len(set(ro.modes)) > 1:
        for mode in sorted(set(ro.modes)):
            vals = [a for a, md in zip(acc, ro.modes, strict=True) if md == mode and math.isfinite(a)]
            m[f"accuracy_{mode}"] = sum(vals) / len(vals) if vals else math.nan
    return m


# ---------------------------------------------------------------------------------------------
# 4. log-probs


def trim(ro: Rollout, idx: Tensor) -> tuple[Tensor, Tensor, int]:
    """input_ids / attention_mask of rows ``idx`` with the completion trimmed to their longest; returns T'."""
    t = int(ro.completion_mask[idx].sum(-1).max().clamp(min=1))
    P = ro.prompt_len
    return ro.input_ids[idx, : P + t], ro.attention_mask[idx, : P + t], t


def logprobs(ctx: StepContext, batch: Batch, tg: Targets) -> LogProbs:
    """pi_old (when the algorithm needs its own pass), pi_ref and the values of the outputs that train (no grad)."""
    p, ro, dev, rows = ctx.p, batch.rollout, ctx.device, tg.train_rows
    need_old = ctx.algorithm.needs_old_logprobs(p)
    zeros = torch.zeros_like(tg.loss_mask)
    out = LogProbs(zeros.clone() if need_old else None, zeros.clone() if ctx.ref_model is not None else None,
                   zeros.clone() if ctx.critic is not None else None)
    if ro is None or not rows.numel() or (out.old is None and out.ref is None and out.values is None):
        return out
    with torch.no_grad(), on_device(ctx.ref_model, dev, ctx.offload), ctx.updater.autocast():
        for sl in micro_slices(rows, p.optim.micro_batch_size):
            ids, att, t = trim(ro, sl)
            if out.old is not None:
                lp, _ = token_logprobs(ctx.model, ids.to(dev), att.to(dev), ro.prompt_len, p.rollout.temperature,
                                       share_prompts=p.compute.share_prompt_prefix,
                                       chunk_tokens=p.compute.logprob_chunk_tokens, **truncation(p))
                out.old[sl, :t] = lp.cpu()
            if out.ref is not None:
                rdev = next(ctx.ref_model.parameters()).device
                rlp, _ = token_logprobs(ctx.ref_model, ids.to(rdev), att.to(rdev), ro.prompt_len, p.rollout.temperature,
                                        share_prompts=p.compute.share_prompt_prefix,
                                        chunk_tokens=p.compute.logprob_chunk_tokens, **truncation(p))
                out.ref[sl, :t] = rlp.float().cpu()
            if out.values is not None:
                assert ctx.critic is not None
                out.values[sl, :t] = ctx.critic.values(ids, att, ro.prompt_len, train=False).cpu()
    return out


# ---------------------------------------------------------------------------------------------
# 5. update


def accumulate(upds: list[Updater], n_micro: int, slices: list[Tensor],
               losses_of: Callable[[Tensor], list[Tensor]]) -> tuple[bool, list[int]]:
    """Backward over ``slices`` (``losses_of(slice)``: one loss per updater), padded to ``n_micro`` passes with
    zero-gradient ones under DeepSpeed (this rank has fewer micro-batches, or a loss was not finite: every rank must
    call backward equally often). Returns (a loss was not finite, the indices of the accepted slices)."""
    bad, done = False, []
    for j in range(n_micro):
        last = j == n_micro - 1
        if j < len(slices) and not bad:
            losses = losses_of(slices[j])
            if all(bool(torch.isfinite(x)) for x in losses):
                for u, x in zip(upds, losses, strict=True):
                    u.backward(x, last=last)
                done.append(j)
                continue
            bad = True
            if not upds[0].distributed:
                break
        for u in upds:
            u.dummy_backward(last=last)
    return bad, done


@dataclass
class _Micro:
    """One micro-batch's loss value and metrics (kept until the optimizer step accepts it)."""

    loss: float
    metrics: dict[str, float]
    entropy: Tensor | None
    mask: Tensor
    value_metrics: dict[str, float] | None
    bonus: float = 0.0


def _micro_losses(ctx: StepContext, batch: Batch, tg: Targets, lp: LogProbs, it: int, norm: LossNormalizer,
                  mismatch_lp: Tensor, pending: list[_Micro], sl: Tensor) -> list[Tensor]:
    """The policy loss (and PPO's value loss) of the outputs ``sl`` in update pass ``it``; records their metrics in
    ``pending`` and pi_old's log-probs (the mismatch metrics) in ``mismatch_lp`` on the first pass."""
    p, ro, upd, critic, dev = ctx.p, batch.rollout, ctx.updater, ctx.critic, ctx.device
    algo = ctx.algorithm
    assert ro is not None and tg.weights is not None
    ids, att, t = trim(ro, sl)
    coef = p.loss.entropy_coef
    with upd.autocast():
        lp_new, ent = token_logprobs(upd.forward_model, ids.to(dev), att.to(dev), ro.prompt_len, p.rollout.temperature,
                                     entropy=it == 0 or coef > 0, share_prompts=p.compute.share_prompt_prefix,
                                     chunk_tokens=p.compute.logprob_chunk_tokens, entropy_grad=coef > 0,
                                     **truncation(p))
    lp_new = lp_new.float()
    msk = tg.loss_mask[sl, :t].to(dev)
    old = lp_new.detach() if lp.old is None else lp.old[sl, :t].to(dev)
    if it == 0:
        mismatch_lp[sl, :t] = old.cpu()
    w = tg.weights[sl] if tg.weights.dim() == 1 else tg.weights[sl, :t]
    ref = None if lp.ref is None else lp.ref[sl, :t].to(dev)
    is_w = step_weights(p.correction, old, ro.sampler_logprobs[sl, :t], msk)  # grpo.correction; None: off
    loss, lm = registry.POLICY_LOSSES.get(algo.policy_loss(p))(lp_new, old, ref, w.to(dev), msk, algo.loss_config(p), norm,
                                                               **({} if is_w is None else {"is_weights": is_w}))
    bonus = 0.0
    if coef > 0:  # the entropy bonus: -coef x H aggregated like the loss, batch-wide normalisers
        assert ent is not None
        term, bm = entropy_bonus(ent.float(), msk, coef=coef, aggregation=p.loss.aggregation, normalizer=norm)
        loss, bonus = loss + term, bm["entropy_bonus"]
    out, vm = [loss], None
    if critic is not None:
        assert lp.values is not None and tg.returns is not None
        with critic.updater.autocast():
            v = critic.values(ids, att, ro.prompt_len, train=True)
        cdev = v.device
        vl, vm = value_loss(v, lp.values[sl, :t].to(cdev), tg.returns[sl, :t].to(cdev), msk.to(cdev),
                            clip=critic.clip, aggregation=p.loss.aggregation, normalizer=norm)
        out.append(vl)
    pending.append(_Micro(float(loss.detach()), lm, ent.detach() if ent is not None and it == 0 else None, msk, vm,
                          bonus))
    return out


@dataclass
class _Sums:
    """Token-weighted sums of the loss metrics over a step's accepted micro-batches."""

    keys: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_METRICS, 0.0))
    n_tok: int = 0
    entropy: float = 0.0
    n_ent: int = 0
    value: dict[str, float] = field(default_factory=lambda: {"value_loss": 0.0, "vf_clip_frac": 0.0, "value_mean": 0.0})
    n_val: int = 0

    def add(self, mi: _Micro) -> None:
        k = mi.metrics["n_tokens"]
        self.n_tok += k
        for key, v in mi.metrics.items():  # LOSS_METRICS and a loss's own (its spec's metrics)
            if key != "n_tokens":
                self.keys[key] = self.keys.get(key, 0.0) + v * k
        if mi.entropy is not None:
            mb_mask = mi.mask.bool()
            self.entropy += float(mi.entropy[mb_mask].sum())
            self.n_ent += int(mb_mask.sum())
        if mi.value_metrics is not None:
            for key in self.value:
                self.value[key] += mi.value_metrics[key] * mi.value_metrics["n_tokens"]
            self.n_val += mi.value_metrics["n_tokens"]

    def metrics(self, loss_metrics: tuple[str, ...], critic: bool) -> dict[str, float]:
        """kl and clip fractions (0 for the SFT-loss methods: no reference, no clip), the algorithm's loss metrics,
        entropy, and the value loss's metrics with a value model."""
        m = {key: self.keys[key] / self.n_tok if self.n_tok else 0.0 for key in ("kl", "clip_frac_low", "clip_frac_high")}
        for key in loss_metrics:
            m[key] = self.keys.get(key, 0.0) / self.n_tok if self.n_tok else LOSS_METRIC_DEFAULTS.get(key, math.nan)
        m["entropy"] = self.entropy / self.n_ent if self.n_ent else math.nan
        if critic:
            m.update({key: v / self.n_val if self.n_val else math.nan for key, v in self.value.items()})
        return m


def _normalizer(p: Any, tg: Targets, mb: Tensor, n_slices: int, distributed: bool) -> tuple[LossNormalizer, int]:
    """The loss normaliser of minibatch ``mb`` and its micro-batch count; several ranks: batch-wide denominators and
    equal backward counts (the most micro-batches of any rank)."""
    norm = LossNormalizer.from_mask(tg.loss_mask[mb], max_len=p.rollout.max_new_tokens) if mb.numel() \
        else LossNormalizer(0, 0, p.rollout.max_new_tokens)
    if not distributed:
        return norm, n_slices
    n_seq, n_tok = all_reduce([float(norm.num_sequences), float(norm.num_tokens)])
    n_micro = int(all_reduce([float(n_slices)], "max")[0])
    return LossNormalizer(int(n_seq), int(n_tok), p.rollout.max_new_tokens), n_micro


def update(ctx: StepContext, batch: Batch, tg: Targets, lp: LogProbs) -> dict[str, Any]:
    """``mu`` passes of ``minibatches`` optimizer steps over the outputs that train (module docstring), at the step's
    thread count where the update's kernels give the same bits at any count (float32 under strict MKL), else at the
    thread limit whatever the load (stages.core.threads.TRAINING)."""
    with threads.held(not update_adapts(ctx.updater, *([ctx.critic.updater] if ctx.critic is not None else []))):
        return _update(ctx, batch, tg, lp)


def _update(ctx: StepContext, batch: Batch, tg: Targets, lp: LogProbs) -> dict[str, Any]:
    p, ro, upd, algo, critic = ctx.p, batch.rollout, ctx.updater, ctx.algorithm, ctx.critic
    rows = tg.train_rows
    upds = [upd] + ([critic.updater] if critic is not None else [])
    ctx.model.train()
    if critic is not None:
        critic.model.train()
    gen = torch.Generator().manual_seed(p.seed * 7919 + batch.step)
    s = _Sums()
    grad_norms, value_norms, losses, bonuses, skipped, n_opt = [], [], [], [], 0, 0
    mismatch_lp = torch.zeros_like(tg.loss_mask)
    for it in range(p.optim.mu):
        order = rows[torch.randperm(rows.numel(), generator=gen)] if it or p.optim.minibatches > 1 else rows
        for mb in order.tensor_split(p.optim.minibatches):
            slices = micro_slices(mb, p.optim.micro_batch_size)
            norm, n_micro = _normalizer(p, tg, mb, len(slices), upd.distributed)
            if n_micro == 0:
                continue
            for u in upds:
                u.zero_grad()
            pending: list[_Micro] = []
            losses_of = functools.partial(_micro_losses, ctx, batch, tg, lp, it, norm, mismatch_lp, pending)
            bad, done = accumulate(upds, n_micro, slices, losses_of)
            for j in done:
                s.add(pending[j])
            gn, stepped = upd.step(bad)
            if critic is not None:
                vgn, _ = critic.updater.step(bad)
                value_norms.append(vgn)
            if stepped:
                n_opt += 1
                grad_norms.append(gn)
                losses.append(sum(pending[j].loss for j in done))
                bonuses.append(sum(pending[j].bonus for j in done))
            else:
                skipped += 1
    ctx.model.eval()
    loss_spec = registry.POLICY_LOSSES.spec(algo.policy_loss(p))
    m: dict[str, Any] = s.metrics(algo.loss_metrics + loss_spec.metrics, critic is not None)
    if p.loss.entropy_coef > 0:
        m["entropy_bonus"] = sum(bonuses) / len(bonuses) if bonuses else math.nan
    m.update(sync_policy(ctx, batch.step + 1))  # the sampler takes the new weights, checked on the probe
    m["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else math.nan
    m["loss"] = sum(losses) / len(losses) if losses else math.nan
    m["optimizer_steps"] = n_opt
    m["skipped_nonfinite"] = skipped
    if critic is not None:
        fin = [x for x in value_norms if math.isfinite(x)]
        m["value_grad_norm"] = sum(fin) / len(fin) if fin else math.nan
    if ro is not None:
        trained = torch.zeros_like(tg.loss_mask)
        trained[rows] = (tg.loss_mask[rows] > 0).float()  # the policy's own tokens (no injected tool output)
        m.update(mismatch_metrics(ro.sampler_logprobs, mismatch_lp, trained))
        m.update(step_metrics(p.correction, mismatch_lp, ro.sampler_logprobs, trained))
    return m

"""The RL stage's use of the one update path (stages/train/update.py): an :class:`Updater` for the policy (and PPO's
value model) from the grpo params, and one optimizer step of the RL update (:func:`minibatch_step`, which the loop's update phase calls ``mu`` x ``minibatches`` times: stages/rl/loop.py).

One optimizer step: the minibatch's outputs in micro-batches of ``optim.micro_batch_size``, each the registered policy
loss (stages/rl/losses.py; with ``loss.entropy_coef`` the entropy bonus, with PPO the value loss) over teacher-forced
log-probs (logits / temperature; with top-k / top-p the truncated distribution the sampler drew from:
stages.rl.rollout.truncation), accumulated with batch-wide loss normalisers; a step whose loss or gradient norm is
not finite is skipped and counted. With ``mu = 1`` and one minibatch the first forward is pi_old (old =
logp.detach(), the ratio is exactly 1).

DeepSpeed (ZeRO 0-2; ``grpo.deepspeed``, or a deepspeed / torchrun launch): the config comes from
``stages.train.ds_config.build_deepspeed_config`` (the training stages' builder): micro-batch
``grpo.optim.micro_batch_size``, clipping ``grpo.optim.max_grad_norm``, ZeRO stage / optimizer offload from ``grpo.deepspeed``,
bf16 from ``grpo.compute.precision`` (``auto``: CUDA with bf16, AMX CPUs). The optimizer is torch AdamW. Without DeepSpeed the
update is fp32, or bf16 autocast with fp32 weights when ``grpo.compute.precision`` is ``bf16`` (not ``auto``). Several ranks:
each samples and scores its share of the step's questions (whole groups, so group advantages stay local); the loss
normalisers are summed over ranks and the update pads with dummy passes (:func:`accumulate`). ZeRO-3 is not
supported (the ranks' log-prob passes differ in number, and ZeRO-3 makes every forward a collective).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stages.core import threads
from stages.core.dist import all_reduce, train_device
from stages.core.modeling import load_model
from stages.rl.corrections import step_metrics, step_weights
from stages.rl.losses import POLICY_LOSSES, LossNormalizer, entropy_bonus, settings_of, value_loss
from stages.rl.rollout import mismatch_metrics, token_logprobs, trim, truncation
from stages.rl.types import Batch, LogProbs, Models, RunSpec, Targets
from stages.train.ds_config import build_deepspeed_config
from stages.train.update import Updater, micro_slices, use_bf16, use_deepspeed

LOSS_METRICS = ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "nll")
LOSS_METRIC_DEFAULTS = {"ratio_mean": 0.0, "nll": math.nan}


def load_policy(path: Any, p: Any) -> Any:
    """A causal LM of the stage (the policy, the baseline's start), its weights read directly in the update's dtype
    (bf16 under DeepSpeed's bf16 mode, else float32) onto this rank's device, with ``compute.attn_implementation``."""
    dev = train_device()
    bf16 = use_deepspeed(p.deepspeed.enabled) and use_bf16(p.compute.precision, dev)
    return load_model(path, dtype=torch.bfloat16 if bf16 else torch.float32, device=dev,
                      attn_implementation=p.compute.attn_implementation)


def rl_updater(model: torch.nn.Module, p: Any, *, lr: float | None = None, weight_decay: float | None = None,
               micro_batch_size: int | None = None, max_grad_norm: float | None = None) -> Updater:
    """The :class:`Updater` of ``model`` from the grpo params ``p``: AdamW at ``lr`` (default ``p.optim.lr``) with
    ``weight_decay`` (default ``p.optim.weight_decay``), clipping at ``max_grad_norm`` (default ``p.optim.max_grad_norm``), DeepSpeed as the module docstring
    says (micro-batch ``micro_batch_size``, default ``p.optim.micro_batch_size``)."""
    ds_cfg = None
    clip = p.optim.max_grad_norm if max_grad_norm is None else max_grad_norm
    if use_deepspeed(p.deepspeed.enabled):
        if p.deepspeed.zero_stage == 3:
            raise ValueError("the grpo stage's update does not support ZeRO-3")
        ds_cfg = build_deepspeed_config(zero_stage=p.deepspeed.zero_stage, offload_optimizer=p.deepspeed.offload_optimizer,
                                        micro_batch_size=micro_batch_size or p.optim.micro_batch_size, grad_accum=1,
                                        max_grad_norm=clip,
                                        bf16=use_bf16(p.compute.precision, train_device()))
    trained = [q for q in model.parameters() if q.requires_grad]  # a LoRA policy: the adapter alone (grpo.lora)
    opt = torch.optim.AdamW(trained, lr=p.optim.lr if lr is None else lr,
                            weight_decay=p.optim.weight_decay if weight_decay is None else weight_decay)
    return Updater(model, optimizer=opt, max_grad_norm=clip, deepspeed=ds_cfg,
                   autocast_bf16=ds_cfg is None and p.compute.precision == "bf16")


def update_adapts(*updaters: Any) -> bool:
    """Whether RL updates on ``updaters`` (the policy's, a value model's) may follow the machine's load
    (stages.core.threads.training_adapts): plain float32 under MKL's strict mode; their micro-batches vary in shape,
    so bf16 autocast and DeepSpeed hold the thread limit."""
    return all(threads.training_adapts(autocast_bf16=bool(getattr(u, "autocast_bf16", False)), fixed_shape=False,
                                       deepspeed=getattr(u, "engine", None) is not None) for u in updaters)


def as_updater(model: torch.nn.Module, optimizer: Any, p: Any) -> Updater:
    """``optimizer`` as an :class:`Updater` (benchmarks and tests may pass a plain torch optimizer)."""
    if isinstance(optimizer, Updater):
        return optimizer
    return Updater(model, optimizer=optimizer, max_grad_norm=p.optim.max_grad_norm)


# ---------------------------------------------------------------------------------------------
# one optimizer step of the RL update


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


def micro_losses(run: RunSpec, models: Models, batch: Batch, tg: Targets, lp: LogProbs, it: int,
                 norm: LossNormalizer, mismatch_lp: Tensor, pending: list[_Micro], sl: Tensor) -> list[Tensor]:
    """The policy loss (and PPO's value loss) of the outputs ``sl`` in update pass ``it``; records their metrics in
    ``pending`` and pi_old's log-probs (the mismatch metrics) in ``mismatch_lp`` on the first pass."""
    p, ro, upd, critic, dev, algo = run.p, batch.rollout, models.updater, models.critic, models.device, run.algorithm
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
    name = algo.policy_loss(p)
    loss, lm = POLICY_LOSSES.get(name)(lp_new, old, ref, w.to(dev), msk, algo.loss_config(p), norm,
                                       settings_of(name, p.loss), **({} if is_w is None else {"is_weights": is_w}))
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
class UpdateSums:
    """What a step's update adds up over its accepted micro-batches and optimizer steps: token-weighted loss metrics,
    the entropy, the value loss's metrics, gradient norms, losses, entropy bonuses, skipped steps, and pi_old's
    log-probs of the first pass (``mismatch_lp``: the mismatch metrics)."""

    mismatch_lp: Tensor
    keys: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_METRICS, 0.0))
    n_tok: int = 0
    entropy: float = 0.0
    n_ent: int = 0
    value: dict[str, float] = field(default_factory=lambda: {"value_loss": 0.0, "vf_clip_frac": 0.0, "value_mean": 0.0})
    n_val: int = 0
    grad_norms: list[float] = field(default_factory=list)
    value_norms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    bonuses: list[float] = field(default_factory=list)
    skipped: int = 0

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

    def loss_metrics(self, run: RunSpec, critic: bool) -> dict[str, float]:
        """kl and clip fractions (0 for the SFT-loss methods: no reference, no clip), the algorithm's and its loss's
        metrics, entropy, the value loss's metrics with a value model, and the entropy bonus when it is on."""
        p, algo = run.p, run.algorithm
        names = algo.loss_metrics + POLICY_LOSSES.spec(algo.policy_loss(p)).metrics
        m = {key: self.keys[key] / self.n_tok if self.n_tok else 0.0 for key in ("kl", "clip_frac_low", "clip_frac_high")}
        for key in names:
            m[key] = self.keys.get(key, 0.0) / self.n_tok if self.n_tok else LOSS_METRIC_DEFAULTS.get(key, math.nan)
        m["entropy"] = self.entropy / self.n_ent if self.n_ent else math.nan
        if critic:
            m.update({key: v / self.n_val if self.n_val else math.nan for key, v in self.value.items()})
        if p.loss.entropy_coef > 0:
            m["entropy_bonus"] = sum(self.bonuses) / len(self.bonuses) if self.bonuses else math.nan
        return m

    def step_metrics(self, p: Any, batch: Batch, tg: Targets, critic: bool) -> dict[str, float]:
        """The optimizer steps' gradient norm, loss, counts, and the sampler / trainer mismatch (and the rollout
        correction's metrics) over the policy's own tokens."""
        m: dict[str, Any] = {"grad_norm": _mean(self.grad_norms), "loss": _mean(self.losses),
                             "optimizer_steps": len(self.grad_norms), "skipped_nonfinite": self.skipped}
        if critic:
            m["value_grad_norm"] = _mean([x for x in self.value_norms if math.isfinite(x)])
        ro, rows = batch.rollout, tg.train_rows
        if ro is not None:
            trained = torch.zeros_like(tg.loss_mask)
            trained[rows] = (tg.loss_mask[rows] > 0).float()  # the policy's own tokens (no injected tool output)
            m.update(mismatch_metrics(ro.sampler_logprobs, self.mismatch_lp, trained))
            m.update(step_metrics(p.correction, self.mismatch_lp, ro.sampler_logprobs, trained))
        return m


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


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


def minibatch_step(run: RunSpec, models: Models, batch: Batch, tg: Targets, lp: LogProbs, it: int, mb: Tensor,
                   sums: UpdateSums) -> None:
    """One optimizer step (the policy's, and PPO's value model's) on the outputs ``mb`` in update pass ``it``: their
    micro-batches' losses accumulated with the minibatch's normalisers (several ranks: padded to equal backward
    counts); a non-finite loss or gradient norm skips the step. Adds its figures to ``sums``."""
    p, upd, critic = run.p, models.updater, models.critic
    upds = [upd] + ([critic.updater] if critic is not None else [])
    slices = micro_slices(mb, p.optim.micro_batch_size)
    norm, n_micro = _normalizer(p, tg, mb, len(slices), upd.distributed)
    if n_micro == 0:
        return
    for u in upds:
        u.zero_grad()
    pending: list[_Micro] = []
    losses_of = functools.partial(micro_losses, run, models, batch, tg, lp, it, norm, sums.mismatch_lp, pending)
    bad, done = accumulate(upds, n_micro, slices, losses_of)
    for j in done:
        sums.add(pending[j])
    gn, stepped = upd.step(bad)
    if critic is not None:
        vgn, _ = critic.updater.step(bad)
        sums.value_norms.append(vgn)
    if stepped:
        sums.grad_norms.append(gn)
        sums.losses.append(sum(pending[j].loss for j in done))
        sums.bonuses.append(sum(pending[j].bonus for j in done))
    else:
        sums.skipped += 1

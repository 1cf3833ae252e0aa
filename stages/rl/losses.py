"""Policy losses (DeepSeekMath paper eq. 1, 3 and 5), the value loss of PPO, and the registry of policy losses.

Registry (verl's ``core_algos.py`` shape): every policy loss has one signature,
``fn(logprobs, old_logprobs, ref_logprobs, weights, mask, cfg: LossConfig, normalizer) -> (loss, metrics)``, with
``weights`` the per-output or per-token advantages (policy-gradient losses) or gradient coefficients (the SFT-like
losses of eq. 5). Registered: ``clipped`` (:func:`grpo_loss`: the clipped surrogate of eq. 1 / eq. 3, plus the k3 KL
when the algorithm puts beta in the loss) and ``nll`` (:func:`weighted_nll_loss`, RFT / online RFT). A new loss is
one function decorated with ``@register_policy_loss("name")``.

The GRPO loss (paper eq. 3 with the k3 KL of eq. 4):

Per token t of output i (all tensors (B, T), B outputs in the (micro-)batch, T completion tokens)::

    rho_{i,t}  = exp(logp_{i,t} - old_{i,t})                              ratio, paper eq. 3
    pg_{i,t}   = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)  clipped surrogate (negated)
    kl_{i,t}   = exp(ref - logp) - (ref - logp) - 1                       k3 estimator, paper eq. 4
    l_{i,t}    = pg_{i,t} + beta * kl_{i,t}                               KL in the loss, not the reward

and the loss aggregates m * l (m = mask: completion tokens that are neither padding nor tool output)
with one of three modes (the matching TRL ``loss_type`` and verl ``loss_agg_mode`` in parentheses):

- "seq-mean-token-mean" (paper eq. 3, default; TRL "grpo", verl "seq-mean-token-mean"):
  (1/N_seq) sum_i (1/|o_i|) sum_t m l;
- "token-mean" (DAPO; TRL "dapo"/"bnpo", verl "token-mean"): (1/N_tok) sum_{i,t} m l;
- "seq-mean-token-sum-norm" (Dr. GRPO): (1/(N_seq * L_max)) sum_{i,t} m l, L_max the max completion
  length (the generation limit), so no length bias; = TRL "dr_grpo", = verl's mode divided by B.

Gradient accumulation: N_seq, N_tok and L_max are taken from a :class:`LossNormalizer` built once
over the whole optimizer batch, so summing the losses (or gradients) of k micro-batches gives exactly
the one-batch loss (gradient) in every mode (TRL #6024 and verl #5625 got this wrong). |o_i| is the
per-sequence token count and is local to its sequence. N_seq counts outputs with at least one loss
token (an output whose tokens are all masked, e.g. a failed reward, adds nothing and is not counted).

Departures from the paper: eps_high may differ from eps_low (DAPO clip-higher; None = symmetric as in
the paper); the ratio and the KL are not clamped (as TRL); the paper has a single update per
exploration stage (mu = 1), in which case rho == 1 exactly and only the gradient of the loss matters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossNormalizer:
    """Denominators of the aggregation modes, counted over the whole optimizer batch.

    num_sequences: outputs with at least one loss token; num_tokens: loss tokens (sum of the mask);
    max_len: L_max of "seq-mean-token-sum-norm" (the generation limit, max_new_tokens).
    """

    num_sequences: int
    num_tokens: int
    max_len: int

    @classmethod
    def from_mask(cls, mask: Tensor, max_len: int | None = None) -> LossNormalizer:
        """Count over a (B, T) mask (the whole optimizer batch); ``max_len`` defaults to T."""
        m = mask.to(torch.float64)
        return cls(
            num_sequences=int((m.sum(-1) > 0).sum()),
            num_tokens=int(m.sum()),
            max_len=int(mask.shape[-1] if max_len is None else max_len),
        )


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref), paper eq. 4: exp(ref - logp) - (ref - logp) - 1.

    (B, T) -> (B, T); non-negative; gradient flows through ``logprobs``.
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def aggregate(per_token: Tensor, mask: Tensor, aggregation: Aggregation, normalizer: LossNormalizer) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar with ``aggregation`` (see the module docstring)."""
    m = mask.to(per_token.dtype)
    ml = per_token * m
    if aggregation == "seq-mean-token-mean":
        per_seq = ml.sum(-1) / m.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(normalizer.num_sequences, 1)
    if aggregation == "token-mean":
        return ml.sum() / max(normalizer.num_tokens, 1)
    if aggregation == "seq-mean-token-sum-norm":
        return ml.sum() / (max(normalizer.num_sequences, 1) * max(normalizer.max_len, 1))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float,
    clip_eps_high: float | None = None,
    beta: float,
    aggregation: Aggregation = "seq-mean-token-mean",
    normalizer: LossNormalizer | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO surrogate loss to minimise (the negated objective of paper eq. 3), with metrics.

    Args:
        logprobs: (B, T) log pi_theta(o_t | q, o_<t) of the sampled tokens, with gradient.
        old_logprobs: (B, T) log pi_old of the same tokens (detached; teacher-forced, not the sampler's).
        ref_logprobs: (B, T) log pi_ref, or None when ``beta == 0`` (no reference model).
        advantages: (B,) per-output (outcome supervision, broadcast over tokens) or (B, T) per-token
            (process supervision).
        mask: (B, T) 1 for tokens in the loss, 0 for padding, tool-injected output and excluded outputs.
        clip_eps: epsilon of the clip (lower side; also the upper side unless ``clip_eps_high``).
        clip_eps_high: upper clip epsilon (DAPO clip-higher); None = ``clip_eps``.
        beta: KL coefficient (paper: 0.04).
        aggregation: one of :data:`AGGREGATIONS`.
        normalizer: denominators over the whole optimizer batch; None = count over this batch.

    Returns:
        (loss, metrics). Metrics are means over this batch's loss tokens: ``pg_loss`` (policy term,
        same aggregation), ``kl`` (mean k3), ``clip_frac_low`` (rho < 1 - eps and A < 0: clipped, zero
        gradient), ``clip_frac_high`` (rho > 1 + eps_high and A > 0), ``ratio_mean``, ``n_tokens``.
    """
    if logprobs.shape != mask.shape or old_logprobs.shape != mask.shape:
        raise ValueError(f"logprobs/old_logprobs/mask shapes differ: {logprobs.shape}, {old_logprobs.shape}, {mask.shape}")
    if beta != 0.0 and ref_logprobs is None:
        raise ValueError("beta != 0 needs ref_logprobs")
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logprobs)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    norm = normalizer if normalizer is not None else LossNormalizer.from_mask(mask)

    ratio = torch.exp(logprobs - old_logprobs.detach())
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    pg = -torch.minimum(ratio * adv, clipped * adv)
    per_token = pg
    kl = None
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs.detach())
        if beta != 0.0:
            per_token = pg + beta * kl
    loss = aggregate(per_token, mask, aggregation, norm)

    with torch.no_grad():
        m = mask.to(torch.bool)
        n_tok = int(m.sum())
        denom = max(n_tok, 1)
        low = ((ratio < 1.0 - clip_eps) & (adv < 0) & m).sum().item() / denom
        high = ((ratio > 1.0 + eps_high) & (adv > 0) & m).sum().item() / denom
        metrics = {
            "pg_loss": float(aggregate(pg, mask, aggregation, norm)),
            "kl": float((kl * m).sum().item() / denom) if kl is not None else 0.0,
            "clip_frac_low": low,
            "clip_frac_high": high,
            "ratio_mean": float((ratio * m).sum().item() / denom),
            "n_tokens": n_tok,
        }
    return loss, metrics


def weighted_nll_loss(logprobs: Tensor, coefficients: Tensor, mask: Tensor, *, aggregation: Aggregation,
                      normalizer: LossNormalizer | None = None) -> tuple[Tensor, dict[str, float]]:
    """The loss whose gradient is eq. 5 with a per-output coefficient: per token ``l_{i,t} = -GC_i log pi_theta``.

    With GC = 1 on every output this is the SFT loss (negative log-likelihood of the sampled tokens); with
    GC = :func:`rft_coefficients` and the wrong outputs masked out it is the SFT loss on the correct outputs
    (RFT / online RFT). The aggregation is that of :func:`stages.rl.losses.aggregate`: ``seq-mean-token-mean``
    gives eq. 5's (1/|o|) per output and a mean over outputs; ``token-mean`` is the continued-SFT baseline's
    (sum of token NLLs / tokens).

    Args:
        logprobs: (B, T) log pi_theta(o_t | q, o_<t) of the tokens, with gradient (teacher-forced at the
            sampling temperature, as GRPO's).
        coefficients: (B,) GC per output (broadcast over its tokens) or (B, T) per token.
        mask: (B, T) 1 for tokens in the loss (completion tokens of trained outputs), 0 elsewhere.
        aggregation: one of :data:`stages.rl.losses.AGGREGATIONS`.
        normalizer: denominators over the whole optimizer batch (micro-batches then sum to the batch loss);
            None = count over this batch.

    Returns:
        (loss, metrics): ``nll`` = mean -log pi over the loss tokens, ``n_tokens``.
    """
    if logprobs.shape != mask.shape:
        raise ValueError(f"logprobs and mask shapes differ: {tuple(logprobs.shape)} vs {tuple(mask.shape)}")
    gc = coefficients.to(logprobs.dtype)
    if gc.dim() == 1:
        gc = gc.unsqueeze(-1).expand_as(logprobs)
    norm = normalizer if normalizer is not None else LossNormalizer.from_mask(mask)
    loss = aggregate(-gc * logprobs, mask, aggregation, norm)
    with torch.no_grad():
        m = mask.to(torch.bool)
        n_tok = int(m.sum())
        nll = float(-(logprobs.detach() * m).sum()) / max(n_tok, 1)
    return loss, {"nll": nll, "n_tokens": n_tok}


def _value_clipped(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> Tensor:
    """(B, T) bool: where the clipped value term is the larger, decided from the clip condition itself, in float64:
    the clamp acted (``|V_t - V_old,t| > c``) and ``(V_old,t + clip(V_t - V_old,t) - R_t)^2 > (V_t - R_t)^2``. Inside
    the band ``V_old + (V - V_old)`` is V only up to rounding (bf16 values especially), and comparing the two squared
    errors there counted rounding noise as clipping (issue 27: 0.0242 where the true fraction is 0.0226)."""
    with torch.no_grad():
        v, old, ret = values.detach().double(), old_values.detach().double(), returns.detach().double()
        delta = v - old
        clipped_err = (old + delta.clamp(-clip, clip) - ret) ** 2
        return (delta.abs() > clip) & (clipped_err > (v - ret) ** 2)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None,
               aggregation: Aggregation, normalizer: LossNormalizer | None = None) -> tuple[Tensor, dict[str, float]]:
    """PPO's value loss (paper section 4.1.1 trains the value model alongside the policy; the form is PPO's):

        l_t = 1/2 (V_t - R_t)^2                                                   (clip None)
        l_t = 1/2 max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - R_t)^2)   (clip c: clipped value loss)

    aggregated like the policy loss (:func:`aggregate` with the batch-wide ``normalizer``). The clipped form is an
    option of PPO's implementations (TRL, verl), not from the paper.

    Args:
        values: (B, T) V_t of the value model being trained (with gradient).
        old_values: (B, T) the values at sampling time (detached; the clip's centre).
        returns: (B, T) the value targets R_t (GAE's returns).
        mask: (B, T) tokens in the loss.
        clip: c, or None for the plain squared error.

    Returns:
        (loss, metrics): ``value_loss`` (same aggregation), ``vf_clip_frac`` (share of loss tokens where the clamp acted,
        ``|V_t - V_old,t| > c``, and the clipped term is the larger), ``value_mean``, ``n_tokens``.
    """
    if values.shape != mask.shape or old_values.shape != mask.shape or returns.shape != mask.shape:
        raise ValueError("values, old_values, returns and mask must have one shape")
    norm = normalizer if normalizer is not None else LossNormalizer.from_mask(mask)
    err = (values - returns) ** 2
    if clip is None:
        per_token = 0.5 * err
        clipped_more = torch.zeros_like(err, dtype=torch.bool)
    else:
        vc = old_values + torch.clamp(values - old_values, -clip, clip)
        err_c = (vc - returns) ** 2
        per_token = 0.5 * torch.maximum(err, err_c)
        clipped_more = _value_clipped(values, old_values, returns, clip)
    loss = aggregate(per_token, mask, aggregation, norm)
    with torch.no_grad():
        m = mask.to(torch.bool)
        n_tok = int(m.sum())
        denom = max(n_tok, 1)
        metrics = {"value_loss": float(loss.detach()), "vf_clip_frac": float((clipped_more & m).sum()) / denom,
                   "value_mean": float((values.detach() * m).sum()) / denom, "n_tokens": n_tok}
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# the registry of policy losses


@dataclass(frozen=True)
class LossConfig:
    """Settings a policy loss may read: the clip (eq. 1 / 3), the KL coefficient in the loss (beta; 0 for PPO, whose
    KL is in the reward) and the aggregation mode."""

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    aggregation: Aggregation = "seq-mean-token-mean"


PolicyLoss = Callable[[Tensor, Tensor, Tensor | None, Tensor, Tensor, LossConfig, LossNormalizer],
                      tuple[Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register ``fn(logprobs, old_logprobs, ref_logprobs, weights, mask, cfg, normalizer)`` as ``name``."""

    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


@register_policy_loss("clipped")
def clipped_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor,
                 mask: Tensor, cfg: LossConfig, normalizer: LossNormalizer) -> tuple[Tensor, dict[str, float]]:
    """The clipped surrogate (PPO eq. 1, GRPO eq. 3) with the k3 KL in the loss at ``cfg.beta`` (:func:`grpo_loss`)."""
    return grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=cfg.clip_eps,
                     clip_eps_high=cfg.clip_eps_high, beta=cfg.beta, aggregation=cfg.aggregation, normalizer=normalizer)


@register_policy_loss("nll")
def nll_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, coefficients: Tensor, mask: Tensor,
             cfg: LossConfig, normalizer: LossNormalizer) -> tuple[Tensor, dict[str, float]]:
    """-GC log pi (eq. 5 with a gradient coefficient per output: RFT / online RFT; :func:`weighted_nll_loss`)."""
    return weighted_nll_loss(logprobs, coefficients, mask, aggregation=cfg.aggregation, normalizer=normalizer)

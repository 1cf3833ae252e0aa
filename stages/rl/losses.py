"""The GRPO loss (DeepSeekMath paper eq. 3 with the k3 KL of eq. 4), as a pure function.

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

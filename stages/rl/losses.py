"""Policy losses (DeepSeekMath paper eq. 1, 3 and 5), the value loss of PPO, and the registry of policy losses.

Registry (verl's ``core_algos.py`` shape): every policy loss has one signature,
``fn(logprobs, old_logprobs, ref_logprobs, weights, mask, cfg: LossConfig, normalizer, settings) -> (loss, metrics)``,
with ``weights`` the per-output or per-token advantages (policy-gradient losses) or gradient coefficients (the
SFT-like losses of eq. 5), ``cfg`` what every loss reads (the clip, beta, the aggregation) and ``settings`` the loss's
own (an instance of its settings class, or None). Registered: ``clipped`` (:func:`grpo_loss`: the clipped surrogate of
eq. 1 / eq. 3, plus the k3 KL when the algorithm puts beta in the loss) and ``nll`` (:func:`weighted_nll_loss`, RFT /
online RFT). A new loss is one function decorated with ``@register_policy_loss(name, summary, settings=...)`` and,
when it has settings, one settings class: the params block ``grpo.loss.<name>`` is derived from it
(stages/schema/grpo.py). torch is bound at its first use (stages.rl.registry.torch), so that the params check reads
these declarations without loading it.

Not in the paper: :func:`gspo_loss` (sequence-level ratio, GSPO; registered ``gspo``),
:func:`cispo_loss` (clipped stop-gradient IS weights, CISPO; registered ``cispo``), each with the same aggregations,
and :func:`entropy_bonus`, which the step adds to any policy loss when ``grpo.loss.entropy_coef`` > 0. Every policy-gradient loss takes ``is_weights``, the sampler / trainer correction of
:mod:`stages.rl.corrections` (TIS / MIS), on its policy term.

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
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from stages.rl.registry import Registry, torch
from stages.schema.base import PosFloat, Section

if TYPE_CHECKING:
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


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, mask: Tensor,
              *, clip_eps: float, clip_eps_high: float | None = None, beta: float,
              aggregation: Aggregation = "seq-mean-token-mean", normalizer: LossNormalizer | None = None,
              is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
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
        is_weights: (B, T) detached rollout-correction weights multiplying the policy term pg (not the KL), as TRL
            and verl (:func:`stages.rl.corrections.rollout_correction`); None = 1.

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
    if is_weights is not None:
        pg = pg * is_weights.detach().to(pg.dtype)
    per_token = pg
    kl = None
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs.detach())
        if beta != 0.0:
            per_token = pg + beta * kl
    loss = aggregate(per_token, mask, aggregation, norm)
    with torch.no_grad():
        metrics = _loss_metrics(pg, kl, mask, aggregation, norm, {"clip_frac_low": (ratio < 1.0 - clip_eps) & (adv < 0),
                                "clip_frac_high": (ratio > 1.0 + eps_high) & (adv > 0)}, ratio)
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
    errors there would count rounding noise as clipping."""
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
# sequence-level and clipped-weight policy losses, and the entropy bonus (not in the paper)


def _prepare(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, mask: Tensor, beta: float
) -> Tensor:
    """Check shapes and the reference; return the advantages as (B, T) in the log-probs' dtype."""
    if logprobs.shape != mask.shape or old_logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs/old_logprobs/mask shapes differ: {tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, "
            f"{tuple(mask.shape)}"
        )
    if beta != 0.0 and ref_logprobs is None:
        raise ValueError("beta != 0 needs ref_logprobs")
    adv = advantages.to(logprobs.dtype)
    return adv.unsqueeze(-1).expand_as(logprobs) if adv.dim() == 1 else adv


def _add_kl(pg: Tensor, logprobs: Tensor, ref_logprobs: Tensor | None, beta: float) -> tuple[Tensor, Tensor | None]:
    """(pg + beta * k3, k3), or (pg, k3 or None) when beta == 0 (k3 still computed for the metric when ref is given)."""
    kl = k3_kl(logprobs, ref_logprobs.detach()) if ref_logprobs is not None else None
    return (pg + beta * kl if kl is not None and beta != 0.0 else pg), kl


def _weighted(pg: Tensor, is_weights: Tensor | None) -> Tensor:
    """The policy term times the (detached) rollout-correction weights; the KL is not weighted (TRL, verl)."""
    return pg if is_weights is None else pg * is_weights.detach().to(pg.dtype)


def _loss_metrics(pg: Tensor, kl: Tensor | None, mask: Tensor, aggregation: Aggregation, norm: LossNormalizer,
                  fractions: dict[str, Tensor], ratio: Tensor, **values: float) -> dict[str, float]:
    """The metrics of a policy loss (no gradient): ``pg_loss`` (the policy term, the loss's aggregation), ``kl``
    (mean k3 over the loss tokens; 0 without a reference), the share of loss tokens where each (B, T) boolean of
    ``fractions`` holds, ``values`` as given, ``ratio_mean`` (mean ratio over loss tokens) and ``n_tokens``."""
    m = mask.to(torch.bool)
    n_tok = int(m.sum())
    denom = max(n_tok, 1)
    out = {"pg_loss": float(aggregate(pg.detach(), mask, aggregation, norm)),
           "kl": float((kl.detach() * m).sum()) / denom if kl is not None else 0.0}
    out.update({key: float((v & m).sum()) / denom for key, v in fractions.items()})
    out.update(values)
    out.update(ratio_mean=float((ratio.detach() * m).sum()) / denom, n_tokens=n_tok)
    return out


def gspo_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, mask: Tensor,
              *, clip_eps: float, clip_eps_high: float | None = None, beta: float,
              aggregation: Aggregation = "seq-mean-token-mean", normalizer: LossNormalizer | None = None,
              is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """GSPO: the clipped surrogate with the length-normalised sequence importance ratio (Zheng et al. 2025,
    "Group Sequence Policy Optimization", arXiv:2507.18071: the objective of eq. 5 with s_i of eq. 7, in its
    token-level form GSPO-token).

    Per output i and token t (all (B, T); m the loss mask, |o_i| = sum_t m_{i,t})::

        s_i     = exp( (1/|o_i|) sum_t m_{i,t} (logp_{i,t} - old_{i,t}) )      sequence ratio (geometric mean)
        s_{i,t} = sg[s_i] * exp(logp_{i,t} - sg[logp_{i,t}])                  GSPO-token: value s_i, gradient
                                                                               s_i * grad logp_{i,t}
        pg_{i,t} = -min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t})
        l_{i,t}  = w_{i,t} pg_{i,t} + beta * k3_{i,t}                         w: rollout correction (default 1)

    aggregated by :func:`aggregate`. With per-output advantages (A_{i,t} = A_i) and "seq-mean-token-mean" this is
    GSPO's objective exactly, value and gradient: every token of output i carries the same clipped term, so the
    token mean is min(s_i A_i, clip(s_i) A_i) and the gradient of the mean of s_i * logp_{i,t} is grad s_i. TRL's
    ``importance_sampling_level="sequence"`` (a (B, 1) ratio broadcast over the tokens) gives the same value and
    gradient in every aggregation; verl's ``loss_mode: gspo`` is this GSPO-token form. Per-token advantages (process
    supervision) give GSPO-token's objective.

    Departures: the paper has no KL term (beta = 0 reproduces it; the k3 KL of DeepSeekMath eq. 4 is added per token
    otherwise, as TRL does); the paper's clip range is 3e-4 / 4e-4 (v2, section 5.1), the arguments' meaning is the
    same (1 - eps_low <= s <= 1 + eps_high); no clamp of log s_i (verl clamps it at 10); a sequence without loss
    tokens has s_i = 1 and adds nothing.

    Args:
        logprobs: (B, T) log pi_theta of the sampled tokens, with gradient.
        old_logprobs: (B, T) log pi_old (detached).
        ref_logprobs: (B, T) log pi_ref, or None when ``beta == 0``.
        advantages: (B,) per output or (B, T) per token.
        mask: (B, T) loss tokens.
        clip_eps, clip_eps_high: the clip of s (lower / upper epsilon; upper None = lower).
        beta: the KL coefficient.
        aggregation, normalizer: as :func:`grpo_loss`.
        is_weights: (B, T) rollout-correction weights on the policy term (:mod:`stages.rl.corrections`), or None.

    Returns:
        (loss, metrics): ``pg_loss`` (the policy term, same aggregation), ``kl`` (mean k3 over loss tokens),
        ``clip_frac_low`` / ``clip_frac_high`` (share of loss tokens whose s was clipped with A < 0 / A > 0: zero
        gradient), ``seq_ratio_mean`` (mean s_i over outputs with loss tokens), ``ratio_mean`` (mean s_{i,t}), ``n_tokens``.
    """
    adv = _prepare(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    norm = normalizer if normalizer is not None else LossNormalizer.from_mask(mask)
    m = mask.to(logprobs.dtype)
    log_s = ((logprobs.detach() - old_logprobs.detach()) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(1.0)
    ratio = torch.exp(log_s + logprobs - logprobs.detach())  # value s_i, gradient s_i * grad logp
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    pg = _weighted(-torch.minimum(ratio * adv, clipped * adv), is_weights)
    per_token, kl = _add_kl(pg, logprobs, ref_logprobs, beta)
    loss = aggregate(per_token, mask, aggregation, norm)
    with torch.no_grad():
        r, has = ratio.detach(), mask.to(torch.bool).any(-1)
        metrics = _loss_metrics(pg, kl, mask, aggregation, norm, {"clip_frac_low": (r < 1.0 - clip_eps) & (adv < 0),
                                "clip_frac_high": (r > 1.0 + eps_high) & (adv > 0)}, r,
                                seq_ratio_mean=float(torch.exp(log_s[:, 0])[has].mean()) if bool(has.any()) else 1.0)
    return loss, metrics


def cispo_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, mask: Tensor,
               *, max_ratio: float, min_ratio: float | None = None, beta: float, aggregation: Aggregation = "token-mean",
               normalizer: LossNormalizer | None = None, is_weights: Tensor | None = None
               ) -> tuple[Tensor, dict[str, float]]:
    """CISPO: REINFORCE with clipped, stop-gradient importance-sampling weights (MiniMax-M1, MiniMax 2025,
    arXiv:2506.13585, section 3.1: the CISPO objective and its clipped weight r-hat).

    Per token (all (B, T))::

        r_{i,t}    = exp(logp_{i,t} - old_{i,t})
        rhat_{i,t} = clip(r_{i,t}, min_ratio, max_ratio)                         (the paper: 1 - eps_low^IS, 1 + eps_high^IS)
        l_{i,t}    = -w_{i,t} sg[rhat_{i,t}] A_{i,t} logp_{i,t} + beta * k3_{i,t}   w: rollout correction (default 1)

    aggregated by :func:`aggregate` (the paper: "token-mean", 1 / sum_i |o_i|). Unlike the PPO clip no token's
    gradient is dropped: a clipped ratio only caps the token's weight. On-policy (r = 1) the gradient equals the
    GRPO loss's. The value of the loss is -rhat A logp (not a surrogate of the objective's value; TRL's and verl's
    value too): compare gradients, not values, with :func:`grpo_loss`.

    Peers: TRL ``loss_type="cispo"`` clips r from above only, at ``epsilon_high`` used as the bound itself (ScaleRL's
    eps_max, recommended 5.0): ``max_ratio = epsilon_high``, ``min_ratio = None`` (the paper also sets no effective
    lower bound: "we did not impose a lower bound on the IS weight"). verl ``policy_loss.loss_mode: cispo`` clips to
    [1 - clip_ratio_low, 1 + clip_ratio_high]: ``min_ratio = 1 - clip_ratio_low``, ``max_ratio = 1 + clip_ratio_high``.

    Departures: the KL term (beta; the paper has none) is DeepSeekMath's k3 per token, as TRL adds it; no clamp of
    logp - old before exp (verl clamps it to +-20).

    Args:
        logprobs: (B, T) log pi_theta, with gradient. old_logprobs: (B, T) log pi_old (detached).
        ref_logprobs: (B, T) log pi_ref, or None when ``beta == 0``.
        advantages: (B,) or (B, T). mask: (B, T) loss tokens.
        max_ratio: upper bound of the weight (> 0). min_ratio: lower bound, or None for none.
        beta, aggregation, normalizer, is_weights: as :func:`gspo_loss`.

    Returns:
        (loss, metrics): ``pg_loss``, ``kl``, ``clip_frac_low`` / ``clip_frac_high`` (share of loss tokens whose weight
        was raised to min_ratio / lowered to max_ratio), ``clip_frac_high_pos`` (lowered and A > 0: TRL's
        ``cispo_clip_ratio``), ``ratio_mean``, ``n_tokens``.
    """
    if not max_ratio > 0 or (min_ratio is not None and not 0 <= min_ratio <= max_ratio):
        raise ValueError(f"cispo needs 0 <= min_ratio <= max_ratio and max_ratio > 0, got {min_ratio}, {max_ratio}")
    adv = _prepare(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta)
    norm = normalizer if normalizer is not None else LossNormalizer.from_mask(mask)
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    weight = torch.clamp(ratio, min=min_ratio, max=max_ratio)
    pg = _weighted(-weight * adv * logprobs, is_weights)
    per_token, kl = _add_kl(pg, logprobs, ref_logprobs, beta)
    loss = aggregate(per_token, mask, aggregation, norm)
    with torch.no_grad():
        high = ratio > max_ratio
        low = (ratio < min_ratio) if min_ratio is not None else torch.zeros_like(high)
        metrics = _loss_metrics(pg, kl, mask, aggregation, norm, {"clip_frac_low": low, "clip_frac_high": high,
                                "clip_frac_high_pos": high & (adv > 0)}, ratio)
    return loss, metrics


def entropy_bonus(
    entropy: Tensor,
    mask: Tensor,
    *,
    coef: float,
    aggregation: Aggregation = "token-mean",
    normalizer: LossNormalizer | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The entropy bonus to add to a policy loss: ``-coef * aggregate(H, mask)`` (to minimise; maximises entropy).

    H_{i,t} = -sum_v pi_theta(v | q, o_<t) log pi_theta(v | q, o_<t), the entropy of the full next-token distribution
    at each completion position (at the sampling temperature), with gradient. An exploration regulariser of policy
    gradient methods (Williams & Peng 1991; the A3C / PPO entropy term), not in the DeepSeekMath paper.

    Aggregation: TRL (``entropy_coef``) takes the mean over the micro-batch's loss tokens whatever its ``loss_type``:
    ``aggregation="token-mean"`` (with one micro-batch, or a batch-wide ``normalizer``, equal to TRL's); verl
    (``actor.entropy_coeff``) aggregates the entropy with the policy loss's own ``loss_agg_mode``: pass the loss's
    aggregation. TRL's adaptive coefficient (``entropy_target``) is not here: the caller owns ``coef``.

    Args:
        entropy: (B, T) per-token entropy, with gradient (the bonus has no effect on a detached tensor).
        mask: (B, T) loss tokens.
        coef: the coefficient (>= 0 for a bonus; 0 gives an exact zero).
        aggregation, normalizer: as :func:`aggregate` (batch-wide denominators for gradient accumulation).

    Returns:
        (term, metrics): the scalar to add to the loss, and ``entropy`` (the aggregated entropy) and
        ``entropy_bonus`` (the term's value).
    """
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy and mask shapes differ: {tuple(entropy.shape)} vs {tuple(mask.shape)}")
    norm = normalizer if normalizer is not None else LossNormalizer.from_mask(mask)
    h = aggregate(entropy, mask, aggregation, norm)
    term = -coef * h
    return term, {"entropy": float(h.detach()), "entropy_bonus": float(term.detach())}


# ---------------------------------------------------------------------------------------------
# the registry of policy losses: each declared once, with its settings class (adding one: a decorated function, its
# settings class and a test; docs/rl-algorithms.md)


@dataclass(frozen=True)
class LossConfig:
    """What every policy loss reads besides its own settings: the clip (eq. 1 / 3; GSPO's clip of the sequence
    ratio), the KL coefficient in the loss (beta; 0 for PPO, whose KL is in the reward) and the aggregation mode."""

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    aggregation: Aggregation = "seq-mean-token-mean"


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss (``grpo.loss.policy``). settings: its settings class (the params block ``grpo.loss.<name>``; the
    loss receives its instance), or None. metrics: the loss's own metrics the step logs besides kl, clip fractions
    and ratio_mean (means over the loss tokens). takes_is_weights: it accepts ``is_weights=`` (the rollout
    correction's per-token weights on its policy term, ``grpo.correction``); a loss without it cannot be paired
    with a correction."""

    name: str
    summary: str
    settings: type[Section] | None = None
    metrics: tuple[str, ...] = ()
    takes_is_weights: bool = False


PolicyLoss = Callable[..., "tuple[Tensor, dict[str, float]]"]
POLICY_LOSSES: Registry[PolicyLossSpec] = Registry("policy loss", "grpo.loss.policy")
"""``grpo.loss.policy``: the losses declared below."""


def register_policy_loss(name: str, summary: str, *, settings: type[Section] | None = None,
                         metrics: tuple[str, ...] = (), takes_is_weights: bool = False
                         ) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: declare the policy loss ``name`` (:class:`PolicyLossSpec`) implemented by ``fn(logprobs,
    old_logprobs, ref_logprobs, weights, mask, cfg, normalizer, settings[, is_weights=])``."""
    return POLICY_LOSSES.declare(PolicyLossSpec(name, summary, settings, metrics, takes_is_weights))


@register_policy_loss("clipped", "the clipped surrogate (eq. 1 / 3), with beta x k3 KL for grpo", takes_is_weights=True)
def clipped_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor,
                 mask: Tensor, cfg: LossConfig, normalizer: LossNormalizer, settings: None = None, *,
                 is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """The clipped surrogate (PPO eq. 1, GRPO eq. 3) with the k3 KL in the loss at ``cfg.beta`` (:func:`grpo_loss`);
    ``is_weights``: the rollout correction's weights on the policy term (``grpo.correction``; None = 1)."""
    return grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=cfg.clip_eps,
                     clip_eps_high=cfg.clip_eps_high, beta=cfg.beta, aggregation=cfg.aggregation, normalizer=normalizer,
                     is_weights=is_weights)


@register_policy_loss("nll", "the SFT loss weighted by gradient coefficients (eq. 5)")
def nll_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, coefficients: Tensor, mask: Tensor,
             cfg: LossConfig, normalizer: LossNormalizer, settings: None = None) -> tuple[Tensor, dict[str, float]]:
    """-GC log pi (eq. 5 with a gradient coefficient per output: RFT / online RFT; :func:`weighted_nll_loss`)."""
    return weighted_nll_loss(logprobs, coefficients, mask, aggregation=cfg.aggregation, normalizer=normalizer)


@register_policy_loss("gspo", "GSPO: the clipped surrogate on the length-normalised sequence ratio (arXiv:2507.18071; "
                      "not in the paper)", metrics=("seq_ratio_mean",), takes_is_weights=True)
def gspo_policy_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor,
                     mask: Tensor, cfg: LossConfig, normalizer: LossNormalizer, settings: None = None, *,
                     is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """GSPO (:func:`gspo_loss`): the clip of the sequence ratio is ``cfg.clip_eps`` / ``clip_eps_high``, the k3 KL at
    ``cfg.beta``, ``is_weights`` the rollout correction's (``grpo.correction``; None = 1). On-policy (mu = 1, one
    minibatch: every ratio is 1) its gradient is the clipped loss's."""
    return gspo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=cfg.clip_eps,
                     clip_eps_high=cfg.clip_eps_high, beta=cfg.beta, aggregation=cfg.aggregation, normalizer=normalizer,
                     is_weights=is_weights)


class CispoSettings(Section):
    """The clipped importance-sampling weight of ``loss.policy: cispo`` (MiniMax-M1, arXiv:2506.13585, section 3.1;
    :func:`cispo_loss`): sg(clip(ratio, min_ratio, max_ratio)) x A x log pi."""

    max_ratio: PosFloat = 5.0
    """Upper bound of the weight (TRL loss_type cispo: epsilon_high, recommended 5.0; verl: 1 + clip_ratio_high)."""
    min_ratio: Annotated[float, Field(ge=0.0)] | None = None
    """Lower bound of the weight; null = none (the paper and TRL; verl: 1 - clip_ratio_low)."""

    @model_validator(mode="after")
    def _bounds(self) -> CispoSettings:
        if self.min_ratio is not None and self.min_ratio > self.max_ratio:
            raise ValueError(f"min_ratio ({self.min_ratio}) is above max_ratio ({self.max_ratio}); lower it, or null")
        return self


@register_policy_loss("cispo", "CISPO: REINFORCE with clipped stop-gradient IS weights (MiniMax-M1, arXiv:2506.13585; "
                      "not in the paper)", settings=CispoSettings, metrics=("clip_frac_high_pos",),
                      takes_is_weights=True)
def cispo_policy_loss(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor,
                      mask: Tensor, cfg: LossConfig, normalizer: LossNormalizer, settings: CispoSettings, *,
                      is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """CISPO (:func:`cispo_loss`) with its weight bounds ``settings`` (``grpo.loss.cispo``), the k3 KL at
    ``cfg.beta``, ``is_weights`` the rollout correction's. On-policy its gradient is the clipped loss's."""
    return cispo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, max_ratio=settings.max_ratio,
                      min_ratio=settings.min_ratio, beta=cfg.beta, aggregation=cfg.aggregation, normalizer=normalizer,
                      is_weights=is_weights)


def settings_of(name: str, block: Any) -> Any:
    """The settings instance of the registered loss ``name`` in the grpo params' ``loss`` block (its ``<name>``
    field), or None for a loss without settings."""
    return getattr(block, name) if POLICY_LOSSES.spec(name).settings is not None else None

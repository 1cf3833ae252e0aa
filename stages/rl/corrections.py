"""Importance-sampling correction between the sampler's policy and the trainer's (rollout correction).

The rollouts come from a sampler (vLLM in real mode: bf16 kernels, its own sampler) and the loss from the trainer
(HF kernels, fp32 or bf16 autocast). The two assign different probabilities to the same tokens, so the "on-policy"
samples are in fact drawn from pi_sampler, not from the pi_old the loss's ratio is taken against. The correction
re-weights each token's policy-gradient term by the ratio of the two (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"), truncated (TIS) or with out-of-range tokens / sequences masked out
(MIS; IcePop, "Small leak can sink a great ship", 2025), at token or sequence level.

Per token t of output i (all (B, T); m = the loss mask)::

    delta_{i,t} = log pi_old(o_t) - log pi_sampler(o_t)         (0 where the sampler's log-prob is NaN, as TRL)
    rho^tok_{i,t} = exp(delta_{i,t})                               token level
    rho^seq_i     = exp(sum_t m delta_{i,t})                       sequence level: the product of the token ratios
    rho^geo_i     = exp(sum_t m delta_{i,t} / sum_t m)             geometric mean (length-normalised; seq-mask-tis)

The correction has two independent parts, each at a level of its own:

- the **weight** ``w`` (``weight_level``: token, sequence, geometric, or None for w = 1), truncated (TIS) to
  ``[truncate_low, truncate_high]`` (either bound may be None: no bound on that side);
- a **rejection** (``reject_level``, or None): a token (token level) or a whole sequence (sequence / geometric level)
  whose ratio at that level lies outside ``[reject_low, reject_high]`` gets weight 0 (MIS / IcePop).

so that ``weights = w * keep * m``, detached. The loss multiplies its per-token policy-gradient term by ``weights``
(:func:`stages.rl.losses.grpo_loss`, ``gspo_loss``, ``cispo_loss``: ``is_weights``); the KL term is not weighted (as
TRL and verl). A rejected token keeps its place in the loss's denominators (TRL, OpenRLHF, NeMo-RL); to drop it from
them as well (verl's rejection sampling, which edits ``response_mask``), pass ``mask * keep`` as the loss mask.

The peers' settings as :data:`IS_METHODS` presets (``low`` / ``high`` the two thresholds):

=============== =============================================== ==========================================================
preset          weight / rejection                              peers
=============== =============================================== ==========================================================
``tis``         w = clip(rho^tok, low, high)                    TRL ``token_truncate``, OpenRLHF / NeMo-RL ``tis``,
                                                                verl ``rollout_is: token`` (upper bound only: low None)
``mis``         w = rho^tok, reject token outside [low, high]   TRL ``token_mask``, OpenRLHF / NeMo-RL ``icepop``
``seq-tis``     w = clip(rho^seq, low, high)                    TRL ``sequence_truncate``, verl ``rollout_is: sequence``
``seq-mis``     w = rho^seq, reject sequence outside [low, high] TRL ``sequence_mask``
``seq-mask-tis`` w = rho^tok, reject sequence whose rho^geo is   OpenRLHF / NeMo-RL ``seq-mask-tis``
                outside [low, high]
=============== =============================================== ==========================================================

In the RL step (``grpo.correction.method``, :data:`CORRECTIONS`: each preset declared once, below, as the weight and
rejection it is): ``none`` (the default, the paper's GRPO) or one of the presets above with ``grpo.correction.low`` /
``high`` as the thresholds. The trainer's
log-probs are pi_old's (the update's first forward with ``mu = 1``, else the separate pi_old pass), the sampler's are
those the rollout reported for the tokens it drew (``Rollout.sampler_logprobs``; with top-k / top-p both sides use
the truncated, renormalised distribution the sampler drew from, stages.core.logprobs). :func:`step_weights` gives a
micro-batch's weights for the loss (``is_weights=`` of a policy loss whose spec says ``takes_is_weights``), and
:func:`step_metrics` the step's metrics over its whole batch (every loss token of the step: the same numbers for any
micro-batch split), also with ``none``: the raw ratio's distribution, what would be corrected.

Departures: no clamp of delta before exp (verl clamps to +-20; TRL does not); an overflowing sequence ratio (inf) is
truncated or rejected like any other out-of-range value, and the metrics are computed in float64. verl's rejection
statistics other than the ratio (k2 / k3 divergences, seq_max) are not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from stages.rl.registry import Registry, torch

if TYPE_CHECKING:
    from torch import Tensor

ISLevel = Literal["token", "sequence", "geometric"]
IS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class ISCorrection:
    """The result of :func:`rollout_correction`.

    weights: (B, T) detached importance weights for the per-token policy-gradient term: w * keep, 0 where the mask is 0.
    keep: (B, T) bool, loss tokens not rejected (mask & within the rejection bounds).
    metrics: the ratio's distribution and what was truncated or rejected (:func:`rollout_correction`).
    """

    weights: Tensor
    keep: Tensor
    metrics: dict[str, float]


def log_ratio(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, level: ISLevel) -> Tensor:
    """log rho at ``level`` (module docstring): (B, T) for token, (B, 1) for sequence / geometric; detached.

    A NaN sampler log-prob (a token the sampler could not score) gives delta 0 (ratio 1) there, as TRL does.
    Masked-out positions give delta 0; a sequence without loss tokens has log rho^seq = log rho^geo = 0.
    """
    if trainer_logprobs.shape != mask.shape or sampler_logprobs.shape != mask.shape:
        raise ValueError(
            f"trainer_logprobs, sampler_logprobs and mask shapes differ: {tuple(trainer_logprobs.shape)}, "
            f"{tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    dtype = torch.promote_types(trainer_logprobs.dtype, torch.float32)
    m = mask.to(dtype)
    d = torch.nan_to_num((trainer_logprobs.detach().to(dtype) - sampler_logprobs.detach().to(dtype)) * m, nan=0.0)
    if level == "token":
        return d
    total = d.sum(-1, keepdim=True)
    if level == "sequence":
        return total
    if level == "geometric":
        return total / m.sum(-1, keepdim=True).clamp(min=1.0)
    raise ValueError(f"level must be one of {IS_LEVELS}, got {level!r}")


def _check_bounds(name: str, low: float | None, high: float | None) -> None:
    for v in (low, high):
        if v is not None and (not math.isfinite(v) or v < 0):
            raise ValueError(f"{name} bounds must be finite and >= 0, got low={low}, high={high}")
    if low is not None and high is not None and low > high:
        raise ValueError(f"{name}: low ({low}) must not exceed high ({high})")


def rollout_correction(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *,
                       weight_level: ISLevel | None = "token", truncate_low: float | None = None,
                       truncate_high: float | None = None, reject_level: ISLevel | None = None,
                       reject_low: float | None = None, reject_high: float | None = None) -> ISCorrection:
    """Importance weights pi_old / pi_sampler, truncated and / or with rejection (formulas in the module docstring).

    Args:
        trainer_logprobs: (B, T) log pi_old(o_t) as the trainer computes it (teacher-forced; detached here).
        sampler_logprobs: (B, T) log pi_sampler(o_t) the sampler reported for the tokens it drew (NaN: unknown).
        mask: (B, T) 1 for loss tokens (completion tokens that are not padding or tool output), 0 elsewhere.
        weight_level: level of the weight w, or None for w = 1 (rejection only, as verl's ``rollout_rs``).
        truncate_low, truncate_high: clip w to these bounds (TIS); None = unbounded on that side.
        reject_level: level of the rejection statistic, or None for no rejection.
        reject_low, reject_high: a unit (token or sequence, per ``reject_level``) whose ratio is outside
            [reject_low, reject_high] is rejected (weight 0); None = unbounded on that side.

    Returns:
        :class:`ISCorrection`: (B, T) weights and keep, and metrics (floats; "units" are loss tokens at token level,
        sequences with at least one loss token at sequence / geometric level):

        - ``is_ratio_{mean,std,min,max}``: the raw ratio at the weight level (the rejection level when
          ``weight_level`` is None), over its units, before truncation or rejection;
        - ``is_weight_{mean,min,max}``: the final weights over the same units (a rejected unit counts as 0);
          TRL's ``sampling/importance_sampling_ratio/{mean,min,max}``;
        - ``is_truncated_low_frac`` / ``is_truncated_high_frac``: share of units whose w was raised / lowered;
        - ``is_rejected_token_frac``: share of loss tokens rejected; ``is_rejected_seq_frac``: share of sequences
          with at least one rejected token;
        - ``is_ess``: normalised effective sample size (sum w)^2 / (n sum w^2) of the final weights over the
          units (1 = all equal; verl's ``rollout_is_eff_sample_size``);
        - ``mismatch_log_ratio_mean``: mean of log pi_old - log pi_sampler over loss tokens (minus the k1
          estimate of KL(sampler || trainer)); ``mismatch_k3``: the k3 estimate of the same KL;
          ``mismatch_abs_mean`` / ``mismatch_abs_max``: mean / max |delta| (TRL's
          ``sampling/sampling_logp_difference/{mean,max}``); ``n_nan_sampler``: loss tokens whose sampler log-prob
          was NaN (excluded from these four).
    """
    if weight_level is not None and weight_level not in IS_LEVELS:
        raise ValueError(f"weight_level must be one of {IS_LEVELS} or None, got {weight_level!r}")
    if reject_level is not None and reject_level not in IS_LEVELS:
        raise ValueError(f"reject_level must be one of {IS_LEVELS} or None, got {reject_level!r}")
    _check_bounds("truncate", truncate_low, truncate_high)
    _check_bounds("reject", reject_low, reject_high)
    m = mask.to(torch.bool)
    dtype = torch.promote_types(trainer_logprobs.dtype, torch.float32)
    raw = None if weight_level is None else \
        torch.exp(log_ratio(trainer_logprobs, sampler_logprobs, mask, weight_level)).expand(mask.shape)
    if raw is None:
        w = torch.ones(mask.shape, dtype=dtype, device=mask.device)
    elif truncate_low is not None or truncate_high is not None:
        w = torch.clamp(raw, min=truncate_low, max=truncate_high)
    else:
        w = raw
    keep, rej_ratio = _reject(trainer_logprobs, sampler_logprobs, mask, reject_level, reject_low, reject_high)
    weights = torch.where(keep, w, torch.zeros_like(w)).detach()
    with torch.no_grad():
        metrics = _metrics(trainer_logprobs, sampler_logprobs, m, keep, weights,
                           raw if raw is not None else rej_ratio, weight_level or reject_level or "token", raw,
                           truncate_low, truncate_high)
    return ISCorrection(weights=weights, keep=keep, metrics=metrics)


def _reject(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, level: ISLevel | None,
            low: float | None, high: float | None) -> tuple[Tensor, Tensor | None]:
    """(keep: the loss tokens whose unit's ratio at ``level`` is within [low, high], the ratio at ``level`` or None
    without rejection)."""
    keep = mask.to(torch.bool).clone()
    if level is None:
        return keep, None
    ratio = torch.exp(log_ratio(trainer_logprobs, sampler_logprobs, mask, level)).expand(mask.shape)
    inside = torch.ones_like(keep)
    if low is not None:
        inside &= ratio >= low
    if high is not None:
        inside &= ratio <= high
    return keep & inside, ratio


def _units(x: Tensor, m: Tensor, level: str) -> Tensor:
    """The values of a (B, T) tensor at the units of ``level``: loss tokens (token level), or the first position of
    each sequence with at least one loss token (sequence / geometric level: the value is shared by its tokens)."""
    if level == "token":
        return x[m]
    return x[:, 0][m.any(-1)] if x.shape[-1] else x.new_zeros(0)


def _metrics(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    m: Tensor,
    keep: Tensor,
    weights: Tensor,
    ratio: Tensor | None,
    level: str,
    raw: Tensor | None,
    low: float | None,
    high: float | None,
) -> dict[str, float]:
    """The metrics of :func:`rollout_correction` (its docstring)."""
    out: dict[str, float] = {}
    r = _units(ratio if ratio is not None else torch.ones_like(weights), m, level).double()
    n = r.numel()
    out["is_ratio_mean"] = float(r.mean()) if n else 1.0
    out["is_ratio_std"] = float(r.std(unbiased=False)) if n else 0.0
    out["is_ratio_min"] = float(r.min()) if n else 1.0
    out["is_ratio_max"] = float(r.max()) if n else 1.0
    if level == "token":
        fw = weights[m].double()
    else:  # a sequence's weight: that of its kept tokens (they share it), 0 when all were rejected
        fw = _units(weights.double().amax(-1, keepdim=True), m, level)
    out["is_weight_mean"] = float(fw.mean()) if n else 1.0
    out["is_weight_min"] = float(fw.min()) if n else 1.0
    out["is_weight_max"] = float(fw.max()) if n else 1.0
    sq = float((fw * fw).sum())
    out["is_ess"] = float(fw.sum()) ** 2 / (n * sq) if sq > 0 else float(n == 0)
    rv = _units(raw, m, level) if raw is not None else None
    out["is_truncated_low_frac"] = (
        float((rv < low).double().mean()) if rv is not None and n and low is not None else 0.0
    )
    out["is_truncated_high_frac"] = (
        float((rv > high).double().mean()) if rv is not None and n and high is not None else 0.0
    )
    rejected = m & ~keep
    out["is_rejected_token_frac"] = float(rejected.sum()) / max(int(m.sum()), 1)
    out["is_rejected_seq_frac"] = float(rejected.any(-1).sum()) / max(int(m.any(-1).sum()), 1)
    d = (trainer_logprobs.detach().double() - sampler_logprobs.detach().double())[m]
    nan = torch.isnan(d)
    d = d[~nan]
    out["mismatch_log_ratio_mean"] = float(d.mean()) if d.numel() else 0.0
    out["mismatch_k3"] = float((torch.exp(d) - d - 1).mean()) if d.numel() else 0.0
    out["mismatch_abs_mean"] = float(d.abs().mean()) if d.numel() else 0.0
    out["mismatch_abs_max"] = float(d.abs().max()) if d.numel() else 0.0
    out["n_nan_sampler"] = float(nan.sum())
    return out


# ---------------------------------------------------------------------------------------------
# the presets (grpo.correction.method), each declared once, and the step's use of them


@dataclass(frozen=True)
class CorrectionSpec:
    """A rollout correction (``grpo.correction.method``): the :func:`rollout_correction` it is, the weight's level
    (truncated to [low, high] when ``truncate``) and the rejection's level (outside [low, high]), each None for none;
    ``peers``: the same setting in TRL / verl / OpenRLHF / NeMo-RL. ``bounded``: it needs at least one of
    ``grpo.correction.low`` / ``high`` (every preset but ``none``)."""

    name: str
    summary: str
    weight_level: ISLevel | None = None
    reject_level: ISLevel | None = None
    truncate: bool = False
    peers: str = ""

    @property
    def bounded(self) -> bool:
        return self.weight_level is not None or self.reject_level is not None

    @property
    def level(self) -> str:
        """Where the ratio is taken: token, sequence (a sequence-level weight or rejection), or none."""
        levels = {self.weight_level, self.reject_level} - {None}
        return "none" if not levels else ("token" if levels == {"token"} else "sequence")

    def kwargs(self, low: float | None, high: float | None) -> dict[str, Any]:
        """The :func:`rollout_correction` keywords of this preset with the thresholds ``low`` / ``high``."""
        kw: dict[str, Any] = {"weight_level": self.weight_level}
        if self.truncate:
            kw.update(truncate_low=low, truncate_high=high)
        if self.reject_level is not None:
            kw.update(reject_level=self.reject_level, reject_low=low, reject_high=high)
        return kw

    def __call__(self, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, low: float | None,
                 high: float | None) -> ISCorrection | None:
        """The correction of a batch (None for ``none``: the loss's policy term as it is)."""
        if not self.bounded:
            return None
        return rollout_correction(trainer_logprobs, sampler_logprobs, mask, **self.kwargs(low, high))


CORRECTIONS: Registry[CorrectionSpec] = Registry("rollout correction", "grpo.correction.method")
"""``grpo.correction.method``: the presets below (the module docstring's table)."""
for _spec in (
    CorrectionSpec("none", "no correction: the loss trusts the sampler's tokens as pi_old's (the paper's GRPO)"),
    CorrectionSpec("tis", "truncated IS per token: w = clip(pi_old / pi_sampler, low, high)", "token", truncate=True,
                   peers="TRL token_truncate, verl rollout_is token, OpenRLHF / NeMo-RL tis"),
    CorrectionSpec("mis", "masked IS per token: w = pi_old / pi_sampler, tokens outside [low, high] get 0 (IcePop)",
                   "token", "token", peers="TRL token_mask, OpenRLHF / NeMo-RL icepop"),
    CorrectionSpec("seq-tis", "truncated IS per sequence: w = clip(prod_t ratio, low, high)", "sequence",
                   truncate=True, peers="TRL sequence_truncate, verl rollout_is sequence"),
    CorrectionSpec("seq-mis", "masked IS per sequence: w = prod_t ratio, sequences outside [low, high] get 0",
                   "sequence", "sequence", peers="TRL sequence_mask"),
    CorrectionSpec("seq-mask-tis", "token ratios, sequences whose geometric-mean ratio is outside [low, high] get 0",
                   "token", "geometric", peers="OpenRLHF / NeMo-RL seq-mask-tis"),
):
    CORRECTIONS.declare(_spec)(_spec)
IS_METHODS: tuple[str, ...] = tuple(n for n in CORRECTIONS.names() if CORRECTIONS.spec(n).bounded)
"""The presets that correct (every one but ``none``)."""


def method_kwargs(method: str, low: float | None, high: float | None) -> dict[str, Any]:
    """The :func:`rollout_correction` keywords of the preset ``method`` with thresholds low, high."""
    return CORRECTIONS.spec(method).kwargs(low, high)


def correct(method: str, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, low: float | None,
            high: float | None) -> ISCorrection:
    """:func:`rollout_correction` with the preset ``method`` (one of :data:`IS_METHODS`) and its two thresholds."""
    return rollout_correction(trainer_logprobs, sampler_logprobs, mask, **method_kwargs(method, low, high))


def step_weights(c: Any, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor | None:
    """The (B, T) detached weights of one micro-batch for the loss's policy term, with the grpo params' correction
    group ``c`` (method, low, high); None with method ``none``."""
    out = CORRECTIONS.get(c.method)(
        trainer_logprobs, sampler_logprobs.to(trainer_logprobs.device), mask, low=c.low, high=c.high
    )
    return None if out is None else out.weights


_DUPLICATES = ("mismatch_abs_mean", "mismatch_abs_max", "mismatch_k3")  # the step's mismatch_metrics has them


def step_metrics(c: Any, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """The correction's metrics over a whole step's loss tokens (:func:`rollout_correction`'s, less the mismatch
    figures the step reports anyway; ``n_nan_sampler`` as ``mismatch_nan_tokens``). With method ``none``: the raw
    token ratio's distribution (``is_ratio_*``), the signed mean log ratio and the NaN count, i.e. what a correction
    would see."""
    if c.method == "none":
        out = rollout_correction(trainer_logprobs, sampler_logprobs, mask, weight_level="token").metrics
        keep = ("is_ratio_mean", "is_ratio_std", "is_ratio_min", "is_ratio_max", "mismatch_log_ratio_mean")
        m = {k: out[k] for k in keep}
    else:
        out = correct(c.method, trainer_logprobs, sampler_logprobs, mask, low=c.low, high=c.high).metrics
        m = {k: v for k, v in out.items() if k not in _DUPLICATES and k != "n_nan_sampler"}
    m["mismatch_nan_tokens"] = out["n_nan_sampler"]
    return m

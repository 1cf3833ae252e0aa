"""Reward parts computed from a rollout's token counts rather than its text: DAPO's soft overlong penalty.

Pure functions of tensors (:func:`overlong_penalty`) and of a source's rewards (:func:`with_overlong_penalty`, the
reward part ``grpo.reward.overlong`` adds to every output in the step, stages/rl/recipes.py); the reward functions of
text are in :mod:`stages.rl.rewards`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stages.rl.guards import add_to_last_step
from stages.rl.rewards import Rewards


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer_len: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", arXiv:2503.14476, eq. 13), scaled by ``factor``.

    With L_max = ``max_len`` (the generation limit), L_cache = ``buffer_len`` and |y| the completion length::

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max

    times ``factor``: a penalty that grows linearly from 0 to -factor over the last L_cache tokens before the limit,
    added to the task reward (a reward part). A completion cut at the limit (|y| = L_max) gets -factor.

    Peers, same values: TRL ``trl.rewards.get_soft_overlong_punishment(max_completion_len, soft_punish_cache)``
    (factor 1); verl ``reward_model.overlong_buffer`` (``len``, ``penalty_factor``; ``min(-(|y| - (L_max - L_cache)) /
    L_cache * factor, 0)``, the same up to |y| = L_max, beyond which verl's response cannot go); OpenRLHF
    ``--reward.overlong_buffer_len`` / ``overlong_penalty_factor`` (exceed capped at L_cache: -factor beyond L_max);
    NeMo-RL ``reward_shaping.overlong_buffer_length``.

    Departure: ``buffer_len = 0`` (TRL: "no minimum length") is the hard limit alone: 0 up to L_max, -factor beyond
    (the middle case is empty; no division by zero).

    Args:
        lengths: (B,) integer completion lengths in tokens (the generated tokens, tool output included: what counts
            against the generation limit).
        max_len: L_max >= 1. buffer_len: L_cache, 0 <= L_cache <= L_max. factor: the penalty's size (>= 0).

    Returns:
        (B,) float64 penalties in [-factor, 0].
    """
    if max_len < 1 or not 0 <= buffer_len <= max_len or factor < 0:
        raise ValueError(
            f"overlong penalty needs max_len >= 1, 0 <= buffer_len <= max_len and factor >= 0, got max_len={max_len}, "
            f"buffer_len={buffer_len}, factor={factor}"
        )
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be integer token counts, got dtype {lengths.dtype}")
    if bool((lengths < 0).any()):
        raise ValueError("lengths must be >= 0")
    L = lengths.to(torch.float64)
    start = float(max_len - buffer_len)
    if buffer_len > 0:
        ramp = (start - L) / float(buffer_len)
    else:
        ramp = torch.zeros_like(L)
    out = torch.where(L <= start, torch.zeros_like(L), ramp)
    out = torch.where(L > max_len, torch.full_like(L, -1.0), out)
    return out * factor


def with_overlong_penalty(
    rewards: Rewards, lengths: Tensor, *, max_len: int, buffer_len: int, factor: float
) -> Rewards:
    """``rewards`` with :func:`overlong_penalty` of the (N,) completion ``lengths`` added, N = Q x G in row order: to
    every output's reward and, for a per-step source, to its last scored step (so the process advantages see it too);
    a NaN (unscored) output stays NaN. The penalty is the ``overlong`` part (``parts["overlong"]``, per output) and
    its mean the metric ``overlong_penalty_mean``; ``overlong_frac`` is the share of outputs it touched."""
    Q, G = rewards.output.shape
    pen = overlong_penalty(lengths.long(), max_len=max_len, buffer_len=buffer_len, factor=factor).view(Q, G)
    pen = pen.to(rewards.output.dtype)
    steps = add_to_last_step(rewards.steps, pen) if rewards.steps is not None else None
    output = torch.nanmean(steps, dim=-1) if steps is not None else rewards.output + pen
    parts = {**rewards.parts, "overlong": pen.reshape(-1).tolist()}
    metrics = {
        **rewards.metrics,
        "overlong_penalty_mean": float(pen.mean()) if pen.numel() else 0.0,
        "overlong_frac": float((pen < 0).double().mean()) if pen.numel() else 0.0,
    }
    return Rewards(output, steps, rewards.step_ends, parts, metrics)

"""Learning-rate schedules as multiplicative factors of the peak LR (for ``torch.optim.lr_scheduler.LambdaLR``)."""

from __future__ import annotations

from typing import Literal

MULTISTEP_MILESTONES: tuple[tuple[float, float], ...] = ((0.8, 0.316), (0.9, 0.1))
"""(fraction of steps, factor of peak): DeepSeekMath's pretraining schedule ([P] section 2.3): 31.6% of the
peak after 80% of training and 10% after 90% (the DeepSeek LLM multi-step schedule)."""


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: Literal["multistep", "constant"]) -> float:
    """Factor of the peak LR used for optimizer step ``step`` (0-based) of ``total_steps``.

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (linear, reaches the peak at the last
    warm-up step). Then ``constant``: 1.0; ``multistep``: 1.0 until ``0.8 * total_steps``, 0.316 until
    ``0.9 * total_steps``, then 0.1.
    """
    if step < 0 or total_steps <= 0:
        raise ValueError(f"step {step} / total_steps {total_steps} out of range")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "multistep":
        raise ValueError(f"unknown schedule {schedule!r}")
    factor = 1.0
    for frac, f in MULTISTEP_MILESTONES:
        if step >= frac * total_steps:
            factor = f
    return factor

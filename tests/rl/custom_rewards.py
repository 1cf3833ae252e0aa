"""Custom reward functions used by the RL tests through import paths (``tests.rl.custom_rewards:...``)."""

from __future__ import annotations

from typing import Any


def length_reward(*, completion: str, **_: Any) -> float:
    """A dense toy reward (text length / 100) so that a random tiny model gets non-zero advantages."""
    return len(completion) / 100.0


def flaky_reward(*, completion: str, **_: Any) -> float:
    """Raises for completions of odd length and returns NaN for length divisible by 4."""
    if len(completion) % 2:
        raise RuntimeError("odd")
    return float("nan") if len(completion) % 4 == 0 else 1.0

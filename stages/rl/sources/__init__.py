"""Reward sources (``grpo.reward.source``), one module each: every module here declares ``SOURCES``, a tuple of
:class:`stages.rl.registry.RewardSourceSpec`, and imports no torch (the params check reads these specs). A source
that needs models names a ``build`` function (``"module:function"``, imported when a run starts) that gets
:class:`SourceInputs`; a source that needs none gives a per-output ``score`` function instead.

Add a source: a new module here with ``SOURCES = (RewardSourceSpec(name=..., summary=..., score=fn),)`` (or
``build=``), and a test; ``grpo.reward.source: <name>`` then selects it (stages/rl/sources/math_verify.py is one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SourceInputs:
    """What a source's ``build`` function may use: the grpo params, the tokenizer, the rule reward functions (a
    stages.rl.rewards.RewardSet), and with ``reward_model`` sources the reward model and the examples it was trained
    on (the guards' length target)."""

    p: Any
    tokenizer: Any
    reward_set: Any
    reward_model: Any = None
    rm_examples: list[dict[str, Any]] = field(default_factory=list)

"""Reward sources (``grpo.reward.source``), one module each: every module here declares ``SOURCES``, a tuple of
:class:`stages.rl.registry.RewardSourceSpec`, and imports no torch (the params check reads these specs). A source
that needs models names a ``build`` function (``"module:function"``, imported when a run starts) that gets
:class:`SourceInputs`; a source that needs none gives a per-output ``score`` function instead.

Add a source: a new module here with ``SOURCES = (RewardSourceSpec(name=..., summary=..., score=fn),)`` (or
``build=``), and a test; ``grpo.reward.source: <name>`` then selects it (stages/rl/sources/math_verify.py is one).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from stages.rl.registry import Registry, RewardSourceSpec


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


def _discover() -> Iterator[RewardSourceSpec]:
    """The ``SOURCES`` of every module of this package (by module name; ``_``-prefixed modules skipped)."""
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            yield from importlib.import_module(f"{__name__}.{mod.name}").SOURCES


REWARD_SOURCES: Registry[RewardSourceSpec] = Registry("reward source", "grpo.reward.source", discover=_discover)
"""``grpo.reward.source``: the sources declared by this package's modules (found on first use)."""

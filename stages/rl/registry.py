"""The RL registries' machinery, torch-free: a :class:`Registry` maps a name (the value of a ``grpo`` params field) to
a *spec* (what the entry is and needs: a reference model, a value model, a reward model, its own settings class)
and to its implementation.

Each entry is declared once, beside its implementation, with the registry's decorator: a policy loss in
stages/rl/losses.py (``@register_policy_loss(name, summary, settings=...)``), an advantage estimator in
stages/rl/advantages.py, a rollout correction in stages/rl/corrections.py, a reward source in its module of
stages/rl/sources/. Those modules import torch on first use (:data:`torch` below), so the params schema
(stages/schema/grpo.py), the whole-file check (stages/params.py), the planner and preflight read the specs, and the
schema derives each entry's params block from its settings class, without loading torch (~5 s). The algorithms'
strategies (stages/rl/algorithms.py) need torch at import: their specs are declared here, :data:`ALGORITHMS`, and the
strategies registered by name. What a run needs from all of them: stages/rl/needs.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar


@dataclass(frozen=True)
class AlgorithmSpec:
    """An RL method (``grpo.algorithm``) and what it needs.

    samples: it has a sampling loop (false: sft, continued SFT on the rows' gold solutions, one process).
    rule_reward: it scores with the rule reward only (the paradigm's methods, paper section 5.2.1).
    advantages: it trains on the advantages of ``grpo.advantage.estimator`` (else on its own gradient coefficients).
    critic: it trains a value model (an estimator that needs one must be paired with it, and only with it).
    kl: where ``grpo.kl.beta`` acts: in the loss (GRPO eq. 3), in the per-token reward (PPO eq. 2) or nowhere; with
    beta > 0 and kl not none, the run keeps a frozen reference model pi_ref."""

    name: str
    summary: str
    module: str
    samples: bool = True
    rule_reward: bool = False
    advantages: bool = False
    critic: bool = False
    kl: Literal["none", "loss", "reward"] = "none"

    def uses_reference(self, p: Any) -> bool:
        """Whether a run with the grpo params ``p`` keeps the frozen reference model."""
        return self.kl != "none" and p.kl.beta > 0


@dataclass(frozen=True)
class RewardSourceSpec:
    """A reward source (``grpo.reward.source``): where the reward of a sampled output comes from.

    reward_model: it scores with the trained reward model (data/models/reward_model: the planner counts it, preflight
    requires it, the driver loads it, and iterative RL trains it further between iterations).
    supervision: outcome (one reward per output) or process (a reward per reasoning step: process-supervised
    advantages, paper 4.1.3).
    modes: the rollout modes it scores (``grpo.rollout.mode``; a PoT output is scored by its program's answer, which
    only the rule reward reads).
    row_fields: fields every prompt row must have (process_rule: the known running ``values``).
    build: ``"module:function"``: ``function(inputs)`` returns the scorer (an object with ``rewards(rollout)``;
    ``inputs`` is stages.rl.sources.SourceInputs) -- or None with ``score``.
    score: a per-output function ``score(*, completion, answer, row, **_) -> float`` (NaN or a raise excludes the
    output), for a source that needs no model: the driver scores every output with it, in threads."""

    name: str
    summary: str
    reward_model: bool = False
    supervision: Literal["outcome", "process"] = "outcome"
    modes: tuple[str, ...] = ("cot",)
    row_fields: tuple[str, ...] = ()
    build: str | None = None
    score: Callable[..., float] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if (self.build is None) == (self.score is None):
            raise ValueError(f"reward source {self.name!r}: give exactly one of build and score")


S = TypeVar("S")


class Registry(Generic[S]):
    """Specs by name, and the implementations registered for them (``impls``)."""

    def __init__(self, kind: str, field_path: str, specs: tuple[S, ...] = (),
                 discover: Callable[[], Iterator[S]] | None = None) -> None:
        self.kind = kind
        self.field_path = field_path
        self._specs: dict[str, S] = {}
        self._discover = discover
        self.impls: dict[str, Any] = {}
        for s in specs:
            self._add(s)

    def _add(self, spec: S) -> None:
        name = spec.name  # type: ignore[attr-defined]
        if name in self._specs:
            raise ValueError(f"{self.kind} {name!r} is declared twice")
        self._specs[name] = spec

    def _loaded(self) -> dict[str, S]:
        if self._discover is not None:
            found, self._discover = self._discover, None
            for s in found():
                self._add(s)
        return self._specs

    def names(self) -> list[str]:
        """The registered names, in declaration order."""
        return list(self._loaded())

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def spec(self, name: str) -> S:
        """The spec of ``name``; an unknown name is a one-line ValueError listing the registered ones."""
        specs = self._loaded()
        if name not in specs:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(specs)}")
        return specs[name]

    def declare(self, spec: S) -> Callable[[Any], Any]:
        """Decorator: declare ``spec`` and register the decorated object as its implementation (the one declaration
        of an entry)."""

        def deco(obj: Any) -> Any:
            self._add(spec)
            self.impls[spec.name] = obj  # type: ignore[attr-defined]
            return obj

        return deco

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator of the implementation of ``name``, an entry declared with its spec elsewhere (ALGORITHMS)."""

        def deco(obj: Any) -> Any:
            if name not in self._loaded():
                raise ValueError(f"{self.kind} {name!r} has no spec: declare it in stages/rl/registry.py")
            if name in self.impls and self.impls[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self.impls[name] = obj
            return obj

        return deco

    def get(self, name: str) -> Any:
        """The implementation of ``name`` (its module imported on demand)."""
        spec = self.spec(name)
        if name not in self.impls:
            importlib.import_module(spec.module)  # type: ignore[attr-defined]
        return self.impls[name]


class _Torch:
    """torch, imported at its first use: the modules that declare registry entries bind ``torch`` to
    :data:`torch` so that reading their declarations (the params check) does not load it."""

    def __getattr__(self, name: str) -> Any:
        import torch as _t

        return getattr(_t, name)


torch: Any = _Torch()
"""``from stages.rl.registry import torch``: torch for the entries' modules (losses, advantages, corrections)."""


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm", "grpo.algorithm", (
    AlgorithmSpec("sft", "continued SFT on the prompt rows' gold CoT solutions (gradient coefficient 1; paper 5.2.1)",
                  "stages.rl.algorithms", samples=False, rule_reward=True),
    AlgorithmSpec("rft", "the SFT loss on the correct, deduplicated outputs sampled once from the SFT model",
                  "stages.rl.algorithms", rule_reward=True),
    AlgorithmSpec("online_rft", "each step G outputs per question from the current policy, the SFT loss on the "
                  "correct ones (gradient coefficient I(o), paper eq. 10)", "stages.rl.algorithms", rule_reward=True),
    AlgorithmSpec("grpo", "GRPO (paper 4.1): group-relative advantages, the clipped surrogate with the k3 KL in the "
                  "loss (eq. 3-4)", "stages.rl.algorithms", advantages=True, kl="loss"),
    AlgorithmSpec("ppo", "PPO (paper 4.1.1): a value model, GAE, the KL in the per-token reward (eq. 2)",
                  "stages.rl.algorithms", advantages=True, critic=True, kl="reward"),
))
"""``grpo.algorithm``; implementations: stages/rl/algorithms.py."""

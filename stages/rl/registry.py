"""The RL registries, torch-free: algorithms, advantage estimators, policy losses, reward sources and rollout
corrections.

Each registry maps a name (the value of a ``grpo`` params field) to a *spec*: what the entry is and what it needs
(a reference model, a value model, a reward model, fields of the prompt rows), declared once, in plain Python.
The params schema (stages/schema/grpo.py), the whole-file check (stages/params.py), the planner (stages/plan.py),
the preflight checks (stages/preflight.py) and the loop (stages/rl/loop.py) all ask these specs (through
stages/rl/needs.py for what a run needs); nothing tests a
name as a string elsewhere. Importing this module imports no torch, so validating params.yaml stays cheap.

The *implementation* of an entry lives in a torch module that registers it with the registry's decorator
(``@register_algorithm("grpo")`` in stages/rl/algorithms.py, ``@register_estimator`` in stages/rl/advantages.py,
``@register_policy_loss`` in stages/rl/losses.py); :meth:`Registry.get` imports that module on demand. A
decorator refuses a name that has no spec here, and tests/rl/test_registry.py checks that every spec has its
implementation.

Reward sources are discovered instead: every module of the package stages/rl/sources/ declares a tuple
``SOURCES`` of :class:`RewardSourceSpec` and is importable without torch, so a new source is one file there; that
package holds their registry (``stages.rl.sources.REWARD_SOURCES``), and stages/rl/needs.py what a run of the four
registries' entries needs.
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
class EstimatorSpec:
    """An advantage estimator (``grpo.advantage.estimator``); critic: it needs a value model's values (gae)."""

    name: str
    summary: str
    module: str
    critic: bool = False


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss (``grpo.loss.policy``): a pure function of stages/rl/losses.py.

    metrics: the loss's own metrics the step logs besides kl, clip fractions and ratio_mean (means over the loss
    tokens). takes_is_weights: its registered function accepts ``is_weights=`` (the rollout correction's per-token
    weights on its policy term, ``grpo.correction``); a loss without it cannot be paired with a correction."""

    name: str
    summary: str
    module: str
    metrics: tuple[str, ...] = ()
    takes_is_weights: bool = False


@dataclass(frozen=True)
class CorrectionSpec:
    """A rollout correction (``grpo.correction.method``): importance weights pi_old / pi_sampler between the trainer's
    and the sampler's policies on the policy-gradient term (stages/rl/corrections.py).

    level: where the ratio is taken (token, sequence, or none for the uncorrected loss); bounded: it needs at least
    one of ``grpo.correction.low`` / ``high``; peers: the same setting in TRL / verl / OpenRLHF / NeMo-RL."""

    name: str
    summary: str
    module: str
    level: Literal["none", "token", "sequence"] = "token"
    bounded: bool = True
    peers: str = ""


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


S = TypeVar("S", AlgorithmSpec, EstimatorSpec, PolicyLossSpec, RewardSourceSpec, CorrectionSpec)


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
        if spec.name in self._specs:
            raise ValueError(f"{self.kind} {spec.name!r} is declared twice")
        self._specs[spec.name] = spec

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

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator of an implementation of the declared entry ``name``."""

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
            importlib.import_module(spec.module)  # type: ignore[union-attr]
        return self.impls[name]


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

ADVANTAGE_ESTIMATORS: Registry[EstimatorSpec] = Registry("advantage estimator", "grpo.advantage.estimator", (
    EstimatorSpec("grpo", "group-relative: outcome (eq. 3) or process supervision (4.1.3) by the reward source",
                  "stages.rl.advantages"),
    EstimatorSpec("gae", "PPO's generalised advantage estimation from the value model", "stages.rl.advantages",
                  critic=True),
    EstimatorSpec("rloo", "leave-one-out baseline (not in the paper)", "stages.rl.advantages"),
))
"""``grpo.advantage.estimator``; implementations: stages/rl/advantages.py."""

POLICY_LOSSES: Registry[PolicyLossSpec] = Registry("policy loss", "grpo.loss.policy", (
    PolicyLossSpec("clipped", "the clipped surrogate (eq. 1 / 3), with beta x k3 KL for grpo", "stages.rl.losses",
                   takes_is_weights=True),
    PolicyLossSpec("nll", "the SFT loss weighted by gradient coefficients (eq. 5)", "stages.rl.losses"),
    PolicyLossSpec("gspo", "GSPO: the clipped surrogate on the length-normalised sequence ratio (arXiv:2507.18071; not "
                   "in the paper)", "stages.rl.losses", metrics=("seq_ratio_mean",), takes_is_weights=True),
    PolicyLossSpec("cispo", "CISPO: REINFORCE with clipped stop-gradient IS weights (MiniMax-M1, arXiv:2506.13585; not "
                   "in the paper)", "stages.rl.losses", metrics=("clip_frac_high_pos",), takes_is_weights=True),
))
"""``grpo.loss.policy``; implementations: stages/rl/losses.py."""

CORRECTIONS: Registry[CorrectionSpec] = Registry("rollout correction", "grpo.correction.method", (
    CorrectionSpec("none", "no correction: the loss trusts the sampler's tokens as pi_old's (the paper's GRPO)",
                   "stages.rl.corrections", level="none", bounded=False),
    CorrectionSpec("tis", "truncated IS per token: w = clip(pi_old / pi_sampler, low, high)", "stages.rl.corrections",
                   peers="TRL token_truncate, verl rollout_is token, OpenRLHF / NeMo-RL tis"),
    CorrectionSpec("mis", "masked IS per token: w = pi_old / pi_sampler, tokens outside [low, high] get 0 (IcePop)",
                   "stages.rl.corrections", peers="TRL token_mask, OpenRLHF / NeMo-RL icepop"),
    CorrectionSpec("seq-tis", "truncated IS per sequence: w = clip(prod_t ratio, low, high)", "stages.rl.corrections",
                   level="sequence", peers="TRL sequence_truncate, verl rollout_is sequence"),
    CorrectionSpec("seq-mis", "masked IS per sequence: w = prod_t ratio, sequences outside [low, high] get 0",
                   "stages.rl.corrections", level="sequence", peers="TRL sequence_mask"),
    CorrectionSpec("seq-mask-tis", "token ratios, sequences whose geometric-mean ratio is outside [low, high] get 0",
                   "stages.rl.corrections", level="sequence", peers="OpenRLHF / NeMo-RL seq-mask-tis"),
))
"""``grpo.correction.method``; implementations: stages/rl/corrections.py."""

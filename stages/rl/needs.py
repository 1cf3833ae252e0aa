"""What a run of the grpo params needs, and whether its registry entries go together: the one place that answers
"does this run need a reference model / a reward model / a value model / row fields?" from the specs of
stages/rl/registry.py and stages/rl/sources/ (torch-free). The params check (stages/schema/grpo.py,
stages/params.py), the planner (stages/plan.py), preflight (stages/preflight.py) and the loop (stages/rl/loop.py)
call it instead of testing names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stages.rl.advantages import ADVANTAGE_ESTIMATORS
from stages.rl.registry import ALGORITHMS
from stages.rl.sources import REWARD_SOURCES


@dataclass(frozen=True)
class RunNeeds:
    """What a run of the grpo params needs besides the policy (:func:`run_needs`)."""

    reference: bool
    """A frozen reference model pi_ref (the algorithm puts a KL with beta > 0 somewhere)."""
    reward_model: bool
    """data/models/reward_model: a reward-model source, or PPO's value model initialised from it."""
    scoring_model: bool
    """The reward source scores with the reward model (it is held, and moved in to score, every step)."""
    critic: bool
    """A value model trained alongside the policy (PPO)."""
    row_fields: tuple[str, ...]
    """Fields every prompt row must have (the reward source's)."""


def run_needs(p: Any) -> RunNeeds:
    """What a run of the grpo params ``p`` needs, from its algorithm's and reward source's specs."""
    algo, source = ALGORITHMS.spec(p.algorithm), REWARD_SOURCES.spec(p.reward.source)
    scoring = algo.samples and source.reward_model
    return RunNeeds(reference=algo.uses_reference(p),
                    reward_model=scoring or (algo.critic and p.ppo.value_init == "reward_model"),
                    scoring_model=scoring, critic=algo.critic, row_fields=source.row_fields if algo.samples else ())


def check_run(p: Any) -> str | None:
    """A one-line problem with how the grpo params ``p`` combine the registries' entries, or None."""
    algo = ALGORITHMS.spec(p.algorithm)
    source = REWARD_SOURCES.spec(p.reward.source)
    if algo.rule_reward and p.reward.source != "rule":
        return (f"algorithm {algo.name} uses the rule reward (paper section 5.2.1); set reward.source: rule, or "
                "algorithm: grpo for another source")
    if algo.advantages:
        est = ADVANTAGE_ESTIMATORS.spec(p.advantage.estimator)
        if est.critic and not algo.critic:
            return (f"advantage.estimator {est.name} needs a value model: use algorithm ppo, or another estimator "
                    f"with {algo.name}")
        if algo.critic and not est.critic:
            users = [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.spec(n).critic]
            return (f"algorithm {algo.name} estimates advantages with its value model: set advantage.estimator to "
                    f"one that uses it ({', '.join(users)})")
    modes = {p.rollout.mode} if p.rollout.mode != "mixture" else \
        {m for m in ("cot", "pot", "tir") if getattr(p.rollout.mixture, m) > 0}
    unscored = sorted(modes - set(source.modes))
    if unscored:
        return (f"rollout.mode {p.rollout.mode}: reward source {source.name} scores {'/'.join(source.modes)} "
                f"outputs only, not {'/'.join(unscored)}; use rollout.mode cot or a source that scores them (rule)")
    return None

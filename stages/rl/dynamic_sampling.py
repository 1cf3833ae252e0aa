"""DAPO's dynamic sampling: keep only groups with reward spread, generate more until the batch is full.
The bookkeeping as a pure function; the driver generates and scores.

A group whose rewards are all equal has zero group-relative advantage and gives no gradient (DeepSeekMath's GRPO
trains on it anyway, for nothing). DAPO (Yu et al. 2025, arXiv:2503.14476, section 3.2, "Dynamic Sampling", the
constraint 0 < |{o_i : is_equivalent(a, o_i)}| < G of its eq. 11) over-samples and filters such groups out until the
batch holds ``target`` informative groups. One step is a sequence of generation rounds::

    state = RefillState(target)
    rewards = generate(target prompts)                  # round 1: the usual step
    state, d = refill_round(state, rewards, ...)        # d.keep: the groups of this round that enter the batch
    while not d.done:
        rewards = generate(d.n_more new prompts)        # the next prompts in the step's order
        state, d = refill_round(state, rewards, ...)

A group is informative when it has at least two finite rewards and they are not all equal (exactly: max != min, the
degenerate test of :func:`stages.rl.advantages.outcome_advantages`). Kept groups are the first informative ones in
round order, up to the room left (the batch never exceeds ``target``; later informative groups of a round that fills
it are dropped, as verl truncates its batch). A round after which ``max_rounds`` rounds have run ends the step even
when the batch is short (``reason = "max_rounds"``; the step then trains on the groups it has, and ``shortfall`` is
logged): the number of rounds is bounded.

Size of the next round: the rate of informative groups so far, p = informative / generated, predicts how many more
prompts fill the missing m groups::

    n_more = min(max_per_round, ceil(oversample * m / p))          (max_per_round when p = 0)

``oversample = math.inf`` gives verl's and DAPO's fixed rounds (every round generates ``max_per_round`` prompts, verl
``algorithm.filter_groups`` with ``max_num_gen_batches = max_rounds`` and ``data.gen_batch_size = max_per_round``);
verl raises when its rounds run out, this returns a short batch instead. Peers: OpenRLHF ``dynamic_filtering_enable``,
NeMo-RL ``use_dynamic_sampling``, slime ``--over-sampling-batch-size``.

The criterion is on whatever per-output score the caller passes (DAPO: the accuracy; verl's ``filter_groups.metric``:
``acc``, ``score`` or ``seq_reward``). Process supervision (per-step rewards) needs its own criterion (a group is
informative when its step rewards are not all equal): pass them flattened to (Q, G * S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor


def informative_groups(rewards: Tensor) -> Tensor:
    """(Q, G) rewards (NaN = not scored) -> (Q,) bool: at least two finite rewards, not all equal."""
    r = rewards.to(torch.float64)
    ok = torch.isfinite(r)
    hi = torch.where(ok, r, torch.full_like(r, -math.inf)).amax(-1)
    lo = torch.where(ok, r, torch.full_like(r, math.inf)).amin(-1)
    return (ok.sum(-1) >= 2) & (hi != lo)


@dataclass(frozen=True)
class RefillState:
    """Counts of one step's dynamic sampling so far: ``target`` groups wanted, ``kept`` in the batch, ``informative``
    seen (kept or dropped for lack of room), ``generated`` groups, ``rounds`` done."""

    target: int
    kept: int = 0
    informative: int = 0
    generated: int = 0
    rounds: int = 0


@dataclass(frozen=True)
class RefillDecision:
    """What :func:`refill_round` decided for one round.

    keep: (Q,) bool, the round's groups that enter the batch. done: the step's generation is over. n_more: prompts to
    generate in the next round (0 when done). reason: "full" (kept == target), "max_rounds" (rounds ran out) or
    "more" (not done). shortfall: target - kept when done (0 when full).
    """

    keep: Tensor
    done: bool
    n_more: int
    reason: Literal["full", "max_rounds", "more"]
    shortfall: int

    def metrics(self, state: RefillState) -> dict[str, float]:
        """The step's dynamic-sampling metrics from the state after the round."""
        return {
            "ds_rounds": float(state.rounds),
            "ds_generated_groups": float(state.generated),
            "ds_kept_groups": float(state.kept),
            "ds_informative_frac": state.informative / state.generated if state.generated else 0.0,
            "ds_shortfall": float(self.shortfall),
        }


def refill_round(
    state: RefillState, rewards: Tensor, *, max_rounds: int, max_per_round: int, oversample: float = 1.0
) -> tuple[RefillState, RefillDecision]:
    """One round of dynamic sampling (module docstring): which of its (Q, G) groups to keep and how many prompts the
    next round needs. Pure: returns the new state.

    Args:
        state: the counts before this round (``RefillState(target)`` before the first).
        rewards: (Q, G) this round's per-output scores (NaN = not scored).
        max_rounds: the most generation rounds of a step, the first included (>= 1).
        max_per_round: the most prompts one extra round may generate (>= 1).
        oversample: the factor over the predicted need (>= 1; ``math.inf``: always ``max_per_round``).
    """
    if state.target < 1 or max_rounds < 1 or max_per_round < 1 or not oversample >= 1:
        raise ValueError(
            f"dynamic sampling needs target, max_rounds, max_per_round >= 1 and oversample >= 1, got "
            f"{state.target}, {max_rounds}, {max_per_round}, {oversample}"
        )
    if state.rounds >= max_rounds or state.kept >= state.target:
        raise ValueError(f"dynamic sampling is already done ({state})")
    info = informative_groups(rewards)
    room = state.target - state.kept
    keep = info & (torch.cumsum(info.to(torch.long), 0) <= room)
    new = replace(
        state,
        kept=state.kept + int(keep.sum()),
        informative=state.informative + int(info.sum()),
        generated=state.generated + int(rewards.shape[0]),
        rounds=state.rounds + 1,
    )
    if new.kept >= new.target:
        return new, RefillDecision(keep, True, 0, "full", 0)
    if new.rounds >= max_rounds:
        return new, RefillDecision(keep, True, 0, "max_rounds", new.target - new.kept)
    missing = new.target - new.kept
    p = new.informative / new.generated if new.generated else 0.0
    if p <= 0 or math.isinf(oversample):
        n_more = max_per_round
    else:
        n_more = min(max_per_round, math.ceil(oversample * missing / p))
    return new, RefillDecision(keep, False, max(n_more, 1), "more", 0)

"""The recipes that change phases 1-3 of the RL step (stages/rl/loop.py ``run_step``), as the loop's named hooks
(none is in the DeepSeekMath paper, each is off in params.yaml, and then the step is the paper's):

- :func:`draw_questions`: the pass-rate curriculum (``grpo.curriculum``; stages/rl/curriculum.py) draws the step's
  questions by their recent group accuracy instead of the shuffled order of stages.rl.data.step_questions;
  :func:`observe` feeds it every generated group's accuracy;
- :func:`shape_rewards`: DAPO's soft overlong penalty (``grpo.reward.overlong``; stages/rl/reward_shaping.py), a
  reward part added to the reward source's rewards;
- :func:`filter_groups`: DAPO's dynamic sampling with refill (``grpo.dynamic_sampling``;
  stages/rl/dynamic_sampling.py): a group whose criterion (accuracy or reward) is equal over its G outputs is dropped
  and new questions are sampled and scored in extra rounds until the step has ``questions_per_step`` informative
  groups or ``max_rounds`` rounds have run::

    round 1: the step's own batch (the loop's phases 1-3)
    keep the informative groups; while short and rounds remain:
        n more questions (curriculum draw | a per-step shuffle of the prompts the step has not used)
        outputs = sample_rollout(..., round r)   seeds: stages.rl.algorithms.ROUND_SEED
        rewards = ...; keep the informative groups, up to the room left

The kept groups of all rounds become one batch (stages.rl.rollout.Rollout re-padded to the longest prompt and
completion), in round order. A step that keeps no group at all trains on its first round as the plain step does
(its groups then carry only the KL term, or nothing with ``advantage.skip_zero_std_groups``). Several ranks: each
round's questions are split over the ranks as the step's are; the keep decision and the curriculum's update are made
on every rank from the gathered per-group figures, so all ranks agree; the extra rounds run in lockstep (a rank whose
share of a round is empty samples nothing; a rank that keeps no group trains on its first round, as above).

Everything is a pure function of (seed, step, the pass rates), so a resumed run (the rates are in the checkpoint,
stages/rl/checkpoint.py) samples what the uninterrupted run would have.
"""

from __future__ import annotations

import math
import random
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from stages.core.dist import all_gather_list
from stages.rl.algorithms import sample_rollout
from stages.rl.data import step_questions
from stages.rl.dynamic_sampling import RefillState, refill_round
from stages.rl.reward_shaping import with_overlong_penalty
from stages.rl.rewards import Rewards, accuracy_reward
from stages.rl.rollout import Rollout
from stages.rl.types import Batch, Models, RunSpec

Round = tuple[list[int], Batch, Rewards]
"""One generation round of a step: every rank's questions, this rank's batch and its rewards."""


def draw_questions(run: RunSpec, curriculum: Any, step: int) -> tuple[list[int], dict[str, float]]:
    """The ``questions_per_step`` questions of step ``step`` (every rank's; each takes its share ``[rank::world]``):
    the curriculum's draw (and its ``curriculum_*`` metrics) when it is on, else the seeded shuffle."""
    p = run.p
    if curriculum is not None:
        return curriculum.questions(step, p.questions_per_step)
    return step_questions(len(run.rows), step, p.questions_per_step, p.seed), {}


def observe(curriculum: Any, models: Models, rounds: list[Round]) -> None:
    """The curriculum's pass rates updated with every generated group's accuracy (the same on every rank)."""
    observed = [gathered(models, qs, group_accuracy(b, r)) for qs, b, r in rounds]
    curriculum.observe([q for ob in observed for q, _ in ob], [a for ob in observed for _, a in ob])


def shape_rewards(p: Any, batch: Batch, rewards: Rewards) -> Rewards:
    """The rewards with the reward parts of ``grpo.reward`` that are computed from the rollout itself: the overlong
    penalty (factor > 0)."""
    ov = p.reward.overlong
    if not ov.factor or batch.rollout is None or not rewards.output.numel():
        return rewards
    return with_overlong_penalty(
        rewards,
        batch.rollout.completion_lengths,
        max_len=p.rollout.max_new_tokens,
        buffer_len=ov.buffer_len,
        factor=ov.factor,
    )


# ---------------------------------------------------------------------------------------------
# dynamic sampling


def filter_groups(run: RunSpec, models: Models, curriculum: Any, step: int, timer: Any, rounds: list[Round],
                  metrics: dict[str, float]) -> tuple[Batch, Rewards]:
    """Dynamic sampling from the step's first round (``rounds[0]``): extra rounds appended to ``rounds`` until the
    batch is full or the rounds run out; returns the kept groups as one batch and writes the ``ds_*`` metrics.
    ``timer``: the step's PhaseTimer (generation / scoring)."""
    p, ds, upd = run.p, run.p.dynamic_sampling, models.updater
    per_round = ds.max_per_round or p.questions_per_step
    state = RefillState(target=p.questions_per_step)
    used = set(rounds[0][0])
    kept: list[tuple[Batch, Rewards, list[int]]] = []
    shortfall = 0
    while True:
        qs, b, r = rounds[-1]
        crit = [c for _, c in gathered(models, qs, criterion(b, r, ds.metric))]
        width = max((len(c) for c in crit), default=1)  # per-step rewards: ranks' step counts may differ
        table = torch.tensor([c + [math.nan] * (width - len(c)) for c in crit], dtype=torch.float64)
        state, d = refill_round(
            state,
            table.view(len(qs), width),
            max_rounds=ds.max_rounds,
            max_per_round=per_round,
            oversample=ds.oversample,
        )
        mine = range(upd.rank, len(qs), upd.world)  # this rank's positions in the round's list
        kept.append((b, r, [k for k, pos in enumerate(mine) if bool(d.keep[pos])]))
        shortfall = d.shortfall
        if d.done:
            break
        more = more_questions(run, curriculum, step, len(rounds), d.n_more, used)
        if not more:  # every prompt has been tried in this step
            shortfall = state.target - state.kept
            break
        used.update(more)
        share = more[upd.rank :: upd.world]
        with timer("generation"):
            ro = sample_rollout(run, models, step, share, round_=len(rounds)) if share else None
        nb = Batch(step, share, ro)
        with timer("scoring"):
            nr = (
                shape_rewards(p, nb, run.algorithm.score(run, models, nb))
                if share
                else Rewards(torch.zeros(0, p.rollout.group_size, dtype=torch.float64))
            )
        rounds.append((more, nb, nr))
    metrics.update(
        {
            "ds_rounds": float(state.rounds),
            "ds_generated_groups": float(state.generated),
            "ds_kept_groups": float(state.kept),
            "ds_informative_frac": state.informative / state.generated if state.generated else 0.0,
            "ds_shortfall": float(shortfall),
        }
    )
    acc = [a for _, b, r in rounds for a in output_accuracy(b, r)]
    metrics["ds_accuracy_generated"] = sum(acc) / len(acc) if acc else math.nan
    parts = [(b, r, keep) for b, r, keep in kept if keep]
    if not parts:  # nothing informative (on this rank): the plain step on the first round
        return rounds[0][1], rounds[0][2]
    return merge_batches(models.tokenizer.pad_token_id, parts, all_rounds=[b for _, b, _ in rounds])


def criterion(batch: Batch, rewards: Rewards, metric: str) -> Tensor:
    """(Q, K) per-group values whose spread makes a group informative: the outputs' answer accuracy, or their
    rewards (per-step rewards flattened, NaN pads)."""
    Q, G = rewards.output.shape
    if metric == "accuracy":
        return torch.tensor(output_accuracy(batch, rewards), dtype=torch.float64).view(Q, G)
    x = rewards.steps if rewards.steps is not None else rewards.output
    return x.reshape(Q, x.numel() // Q if Q else G).to(torch.float64)


def output_accuracy(batch: Batch, rewards: Rewards) -> list[float]:
    """Per output, answer correctness: the rule functions' ``accuracy`` part, computed when the run has none (NaN
    where scoring failed)."""
    acc = rewards.parts.get("accuracy")
    if acc is not None:
        return [float(a) for a in acc]
    ro = batch.rollout
    if ro is None:
        return []
    return [
        accuracy_reward(
            completion=t,
            answer=row["answer"],
            mode=ro.modes[n] if ro.modes else "cot",
            program_answer=ro.program_answers[n] if ro.program_answers else None,
        )
        for n, (t, row) in enumerate(zip(ro.texts, ro.rows, strict=True))
    ]


def group_accuracy(batch: Batch, rewards: Rewards) -> Tensor:
    """(Q,) each group's mean accuracy over its scored outputs (NaN: none)."""
    acc = torch.tensor(output_accuracy(batch, rewards), dtype=torch.float64).view(rewards.output.shape)
    ok = torch.isfinite(acc)
    n = ok.sum(-1)
    return torch.where(n > 0, torch.where(ok, acc, 0.0).sum(-1) / n.clamp(min=1), math.nan)


def gathered(models: Models, questions: list[int], local: Tensor) -> list[tuple[int, Any]]:
    """(question, row of ``local``) for every question of a round, in the round's order, from every rank's share
    (rank r holds positions r, r + world, ...): the same list on every rank."""
    pos = range(models.updater.rank, len(questions), models.updater.world)
    rows = [(k, local[i].tolist()) for i, k in enumerate(pos)]
    return [(questions[k], row) for k, row in sorted(all_gather_list(rows))]


def more_questions(run: RunSpec, curriculum: Any, step: int, round_: int, n: int, used: set[int]) -> list[int]:
    """Up to ``n`` questions for extra round ``round_`` of step ``step`` that the step has not used: the curriculum's
    draw, else the next ones of a per-step shuffle of the prompts (seeded by seed and step)."""
    if curriculum is not None:
        return curriculum.more(step, round_, n, used)
    order = list(range(len(run.rows)))
    random.Random((run.p.seed * 1_000_003 + step) * 7_919 + 1).shuffle(order)
    return [q for q in order if q not in used][:n]


# ---------------------------------------------------------------------------------------------
# one batch from the kept groups of several rounds


def merge_batches(
    pad_id: int, parts: list[tuple[Batch, Rewards, list[int]]], all_rounds: list[Batch] | None = None
) -> tuple[Batch, Rewards]:
    """One (Batch, Rewards) of the groups ``keep`` of each (batch, rewards, keep), in order; the rollout's own
    metrics (sandbox time, programs, TIR rounds) are those of ``all_rounds`` (every generation of the step)."""
    ros = [select_groups(b.rollout, keep) for b, _, keep in parts if b.rollout is not None]
    questions = [b.questions[k] for b, _, keep in parts for k in keep]
    ro = concat_rollouts(ros, pad_id) if ros else None
    if ro is not None and all_rounds is not None:
        ro.metrics = merged_metrics(
            [(b.rollout.metrics, len(b.rollout.texts)) for b in all_rounds if b.rollout is not None]
        )
    rw = concat_rewards([select_rewards(r, keep) for _, r, keep in parts])
    return Batch(parts[0][0].step, questions, ro), rw


def select_groups(ro: Rollout, groups: list[int]) -> Rollout:
    """The rollout of groups ``groups`` only (every per-output field of :class:`Rollout` taken along its rows)."""
    G = ro.group_size
    rows = [q * G + g for q in groups for g in range(G)]
    idx = torch.tensor(rows, dtype=torch.long)
    N = len(ro.texts)
    kw: dict[str, Any] = {}
    for f in fields(Rollout):
        v = getattr(ro, f.name)
        if isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == N:
            kw[f.name] = v.index_select(0, idx)
        elif isinstance(v, list) and len(v) == N:
            kw[f.name] = [v[n] for n in rows]
        else:
            kw[f.name] = v
    return Rollout(**kw)


def concat_rollouts(ros: list[Rollout], pad_id: int) -> Rollout:
    """One rollout of several, re-padded: prompts left-padded to the longest P, completions right-padded to the
    longest T. A (N, P + T) tensor field (input_ids: ``pad_id``; the attention mask: 0) is split at its P and
    re-placed, an (N, T) field right-padded with 0, any other per-output field concatenated."""
    if len(ros) == 1:
        return ros[0]
    P = max(r.prompt_len for r in ros)
    T = max(r.completion_mask.shape[1] for r in ros)
    G = ros[0].group_size
    kw: dict[str, Any] = {"prompt_len": P, "group_size": G}
    for f in fields(Rollout):
        if f.name in kw:
            continue
        vals = [getattr(r, f.name) for r in ros]
        v0 = vals[0]
        if isinstance(v0, Tensor):
            out = []
            for r, v in zip(ros, vals, strict=True):
                n, p_i, t_i = len(r.texts), r.prompt_len, r.completion_mask.shape[1]
                if v.dim() >= 2 and v.shape[1] == p_i + t_i:
                    new = v.new_full((n, P + T, *v.shape[2:]), pad_id if f.name == "input_ids" else 0)
                    new[:, P - p_i : P + t_i] = v
                elif v.dim() >= 2 and v.shape[1] == t_i:
                    new = v.new_zeros((n, T, *v.shape[2:]))
                    new[:, :t_i] = v
                else:
                    new = v
                out.append(new)
            kw[f.name] = torch.cat(out, dim=0)
        elif isinstance(v0, list):
            kw[f.name] = [x for v in vals for x in v]
        elif f.name == "metrics":
            kw[f.name] = merged_metrics([(v, len(r.texts)) for r, v in zip(ros, vals, strict=True)])
        else:
            kw[f.name] = v0
    return Rollout(**kw)


_MEAN_SUFFIXES = ("_mean", "_frac", "_per_s")


def merged_metrics(parts: list[tuple[dict[str, float], int]], mean_all: bool = False) -> dict[str, float]:
    """Several generations' metrics as one: rates, fractions and means (``*_mean``, ``*_frac``, ``*_per_s``,
    ``mode_frac_*``; every one with ``mean_all``) averaged weighted by the outputs, counts and seconds summed."""
    out: dict[str, float] = {}
    total = sum(n for _, n in parts) or 1
    for key in dict.fromkeys(k for m, _ in parts for k in m):
        vals = [(m[key], n) for m, n in parts if key in m]
        if mean_all or key.endswith(_MEAN_SUFFIXES) or key.startswith("mode_frac_"):
            out[key] = sum(v * n for v, n in vals) / (sum(n for _, n in vals) or total)
        else:
            out[key] = sum(v for v, _ in vals)
    return out


def select_rewards(r: Rewards, groups: list[int]) -> Rewards:
    """The rewards of groups ``groups`` only."""
    G = r.output.shape[1]
    rows = [q * G + g for q in groups for g in range(G)]
    idx = torch.tensor(groups, dtype=torch.long)
    return Rewards(
        r.output.index_select(0, idx),
        None if r.steps is None else r.steps.index_select(0, idx),
        None if r.step_ends is None else r.step_ends.index_select(0, idx),
        {k: [v[n] for n in rows] for k, v in r.parts.items()},
        dict(r.metrics),
    )


def concat_rewards(rs: list[Rewards]) -> Rewards:
    """One Rewards of several (per-step rewards NaN-padded to the most steps); the sources' metrics averaged over
    the groups."""
    if len(rs) == 1:
        return rs[0]
    output = torch.cat([r.output for r in rs])
    steps = ends = None
    if rs[0].steps is not None:
        S = max(r.steps.shape[-1] for r in rs if r.steps is not None)
        steps = torch.cat(
            [
                torch.nn.functional.pad(r.steps, (0, S - r.steps.shape[-1]), value=math.nan)
                for r in rs
                if r.steps is not None
            ]
        )
        ends = torch.cat(
            [
                torch.nn.functional.pad(r.step_ends, (0, S - r.step_ends.shape[-1]), value=0)
                for r in rs
                if r.step_ends is not None
            ]
        )
    keys = dict.fromkeys(k for r in rs for k in r.parts)
    parts = {k: [x for r in rs for x in r.parts.get(k, [math.nan] * r.output.numel())] for k in keys}
    metrics = merged_metrics([(r.metrics, r.output.shape[0]) for r in rs], mean_all=True)
    return Rewards(output, steps, ends, parts, metrics)

"""How good a reward model is: outcome / step / within-question AUCs and best-of-n reranking, on labelled examples
(stages/rl/rm/labels.py) scored by the model (stages/rl/rm/model.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stages.rl.rm.model import example_scores


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """ROC AUC (Mann-Whitney U with average ranks for ties); NaN when only one class is present."""
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    r_pos = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def evaluate_reward_model(rm: Any, tokenizer: Any, examples: Sequence[dict[str, Any]], batch_size: int = 32,
                          best_of: int = 0, share_prompts: bool = True, *, shard: bool = False) -> dict[str, Any]:
    """Outcome AUC (last-token score vs outcome label), ``outcome_auc_within`` (the same over pairs of samples of one
    question only, :func:`within_question_auc`: what GRPO's group-relative advantages see), step AUC (every step end
    vs its label), and, over the examples with exact labels (``value_labels``), ``step_auc_values``: the step AUC
    against those exact labels whatever the RM was trained on. ``best_of`` > 0 adds ``best_of_n``
    (:func:`best_of_n`). ``shard``: the ranks (holding the same ``examples``) score a block each
    (:func:`example_scores`)."""
    if not examples:
        return {"outcome_auc": None, "step_auc": None, "step_auc_values": None, "n_examples": 0, "n_steps": 0}
    sc = example_scores(rm, tokenizer, examples, batch_size, shard=shard, share_prompts=share_prompts)
    o_s = [s[-1] for s in sc]
    o_y = [int(ex["outcome"]) for ex in examples]
    st_s = [v for s in sc for v in s]
    st_y = [int(y) for ex in examples for y in ex["step_labels"]]
    ex_v = [(s, ex["value_labels"]) for s, ex in zip(sc, examples, strict=True) if "value_labels" in ex]
    v_s = [v for s, _ in ex_v for v in s]
    v_y = [int(y) for _, labels in ex_v for y in labels]
    out: dict[str, Any] = {
        "outcome_auc": _r(auc(o_s, o_y)), "outcome_auc_within": _r(within_question_auc(examples, o_s, o_y)),
        "step_auc": _r(auc(st_s, st_y)),
        "step_auc_values": _r(auc(v_s, v_y)) if v_y else None, "n_examples": len(examples), "n_steps": len(st_y),
        "outcome_pos_frac": _r(sum(o_y) / len(o_y)), "step_pos_frac": _r(sum(st_y) / len(st_y))}
    if best_of:
        out["best_of_n"] = best_of_n(examples, sc, best_of)
    return out


def within_question_auc(examples: Sequence[dict[str, Any]], scores: Sequence[float], labels: Sequence[int]) -> float:
    """AUC over the (right, wrong) pairs of samples of the same question only: the share of such pairs in which the
    right sample scores higher (ties count 1/2); NaN without such a pair. Unlike the pooled AUC it cannot be won by
    telling easy questions from hard ones, which GRPO's per-group normalisation removes anyway."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(str(ex.get("id")) + "\0" + ex["question"], []).append(i)
    won, pairs = 0.0, 0
    for idx in groups.values():
        pos = [scores[i] for i in idx if labels[i]]
        neg = [scores[i] for i in idx if not labels[i]]
        for a in pos:
            for b in neg:
                won += 1.0 if a > b else 0.5 if a == b else 0.0
        pairs += len(pos) * len(neg)
    return won / pairs if pairs else math.nan


def best_of_n(examples: Sequence[dict[str, Any]], scores: Sequence[Sequence[float]], n: int) -> dict[str, Any]:
    """Best-of-n reranking of the examples' outputs, per question (the first ``n`` samples of each question with at
    least ``n``), scored by the rule grader (the outcome label: answer correctness):

    - ``random``: the mean accuracy of one sample (a uniformly random pick);
    - ``rm_last``: the accuracy of the sample with the highest last-step (outcome) score (ties: the first);
    - ``rm_min``: the same with the lowest step score of each sample as its score (a PRM's min aggregation,
      Math-Shepherd's);
    - ``majority``: majority vote over the extracted answers (``pred``; ties: the answer seen first);
    - ``oracle``: a correct sample among the n (pass@n);
    - ``gain``: rm_last - random. ``questions``: how many questions were ranked."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(str(ex.get("id")) + "\0" + ex["question"], []).append(i)
    picks = {"random": 0.0, "rm_last": 0.0, "rm_min": 0.0, "majority": 0.0, "oracle": 0.0}
    k = 0
    for idx in groups.values():
        if len(idx) < n:
            continue
        idx = idx[:n]
        k += 1
        ok = [int(examples[i]["outcome"]) for i in idx]
        last = [scores[i][-1] for i in idx]
        low = [min(scores[i]) for i in idx]
        picks["random"] += sum(ok) / n
        picks["rm_last"] += ok[last.index(max(last))]
        picks["rm_min"] += ok[low.index(max(low))]
        picks["oracle"] += float(any(ok))
        votes: dict[str, int] = {}
        for i in idx:
            pred = examples[i].get("pred")
            if pred is not None:
                votes[str(pred)] = votes.get(str(pred), 0) + 1
        if votes:
            top = max(votes.values())
            winner = next(a for a, c in votes.items() if c == top)
            picks["majority"] += float(any(ok[j] for j, i in enumerate(idx) if str(examples[i].get("pred")) == winner))
    if not k:
        return {"n": n, "questions": 0}
    out: dict[str, Any] = {"n": n, "questions": k, **{key: _r(v / k) for key, v in picks.items()}}
    out["gain"] = _r((picks["rm_last"] - picks["random"]) / k)
    return out


def _r(x: float) -> float | None:
    """Rounded for the metrics JSON; None (JSON null) when undefined (e.g. an AUC with one class)."""
    return round(x, 4) if math.isfinite(x) else None

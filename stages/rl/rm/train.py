"""Training the reward model: binary cross-entropy on the labelled step ends (or the last token), or Bradley-Terry on
same-question pairs (:func:`pairwise_loss`), or both; AdamW through the one update path (stages.train.update.Updater),
resumable batch by batch; and the data plumbing of its updates in iterative RL (paper 4.1.4, Algorithm 1): held-out
split by question and :func:`replay_mix`, which adds a random ``fraction`` of the historical examples (paper: 10%) to
the new ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from stages.core.dist import all_reduce
from stages.core.errors import PipelineError
from stages.rl.rm.model import _grouped_batch, completion_scores
from stages.train.update import Updater

TrainOn = Literal["process", "outcome"]
Objective = Literal["pointwise", "pairwise", "both"]


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry loss per pair: ``-log sigmoid(r_chosen - r_rejected)``, shape (K,) from two (K,) score
    tensors (logits; pair k = chosen[k] preferred to rejected[k]). Its mean is InstructGPT's RM loss (Ouyang et al.
    2022, eq. 1), TRL's RewardTrainer (``-nn.functional.logsigmoid(rewards_chosen - rewards_rejected).mean()``,
    trl/trainer/reward_trainer.py) and OpenRLHF's PairWiseLoss (openrlhf/models/loss.py) without their margin."""
    return -torch.nn.functional.logsigmoid(chosen - rejected)


def same_question_pairs(examples: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """Every (right, wrong) pair of indices of ``examples`` with the same question (id and text) and outcome 1 and
    0: all n_right x n_wrong pairs of a question, as InstructGPT trains on all K-choose-2 comparisons of a prompt
    (and as :func:`stages.rl.rm.metrics.within_question_auc` counts them)."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(str(ex.get("id")) + "\0" + ex["question"], []).append(i)
    return [(a, b) for idx in groups.values() for a in idx if int(examples[a]["outcome"])
            for b in idx if not int(examples[b]["outcome"])]


def _targets(examples: Sequence[dict[str, Any]], train_on: TrainOn) -> tuple[list[tuple[int, int]], list[float]]:
    """(row, completion position) of every labelled step end of the batch, and its label."""
    pos, lab = [], []
    for i, ex in enumerate(examples):
        pairs = list(zip(ex["step_ends"], ex["step_labels"], strict=True))
        if train_on == "outcome":
            pairs = [(ex["step_ends"][-1], ex["outcome"])]
        for e, y in pairs:
            pos.append((i, e))
            lab.append(float(y))
    return pos, lab


def _share(n: int, r: int, w: int) -> tuple[int, int]:
    """Rank ``r``'s contiguous share ``[start, end)`` of ``n`` items among ``w`` ranks (the first ``n % w`` take one
    more)."""
    base, extra = divmod(n, w)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def epoch_order(examples: Sequence[dict[str, Any]], seed: int, epoch: int) -> list[int]:
    """The example order of one training epoch: the questions in a permutation seeded by (seed, epoch), each with
    all its samples together (they share the prompt's forward pass, :func:`completion_scores`), so that a resumed
    run rebuilds the batches it had not trained yet."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(ex["question"], []).append(i)
    keys = list(groups)
    random.Random(seed * 1_000_003 + epoch).shuffle(keys)
    return [i for k in keys for i in groups[k]]


def train_reward_model(rm: Any, tokenizer: Any, examples: Sequence[dict[str, Any]], *, epochs: int, lr: float,
                       batch_size: int, seed: int, train_on: TrainOn, max_grad_norm: float = 1.0,
                       weight_decay: float = 0.0, updater: Updater | None = None,
                       resume: dict[str, Any] | None = None,
                       on_step: Callable[[int, Updater, list[list[float]]], None] | None = None,
                       share_prompts: bool = True, objective: Objective = "pointwise",
                       pair_weight: float = 1.0) -> list[float]:
    """Train ``rm`` in place; return the mean loss per epoch (pointwise: per labelled position; else per batch).

    ``objective="pointwise"``: binary cross-entropy on the labelled positions, ``train_on="process"``: every step
    end with its step label; ``"outcome"``: the last token with the outcome label; the batch's loss is the mean
    over its labelled positions. ``"pairwise"``: the mean :func:`pairwise_loss` over the batch's
    :func:`same_question_pairs` (per rank share: a question split between two ranks' shares or two batches loses
    the pairs across), each output scored at its last step end (a process RM's outcome score) whatever
    ``train_on``; a batch without a pair makes no update. ``"both"``: the pointwise mean + ``pair_weight`` x the
    pairwise mean. AdamW, constant ``lr``, through the one update path: ``updater`` (e.g. DeepSpeed on the
    accelerator, stages.rl.update.rl_updater) or a plain :class:`stages.train.update.Updater` (clipping, a non-finite
    batch skipped). Epoch e visits the examples in
    :func:`epoch_order` (seed, e), ``batch_size`` at a time, scored by :func:`completion_scores` (``share_prompts``).

    Resuming: ``resume`` = ``{"step": optimizer steps done, "loss_sums": [[sum, n] per epoch begun]}`` (the model's
    weights, and the updater's optimizer state, already loaded: stages.rl.checkpoint.load_updaters; or the optimizer
    state dict as ``"optimizer"``) continues with the next batch, so an interrupted and resumed run trains on the
    same batches in the same order as an uninterrupted one. ``on_step(step, updater, loss_sums)`` is called after
    every optimizer step, on every rank (the stage checkpoints there).

    Several ranks (a DeepSpeed updater in a multi-rank launch): each rank scores its contiguous share of every batch
    (the samples of a question stay together), normalised by the whole batch's labelled positions, so a step equals
    one process's on the whole batch; a rank without a share runs a zero-gradient pass. The loss sums are summed
    over the ranks every step (every rank holds the same ``loss_sums``).
    """
    if not examples:
        raise PipelineError("reward model: no training examples (every sampled output was empty)")
    upd = updater or Updater(rm, max_grad_norm=max_grad_norm,
                             optimizer=torch.optim.AdamW(rm.parameters(), lr=lr, weight_decay=weight_decay))
    r, w = upd.rank, upd.world
    per_epoch = math.ceil(len(examples) / batch_size)
    step, sums = _resumed(resume, epochs, upd)
    cache: dict[str, list[int]] = {}
    rm.train()
    for epoch in range(step // per_epoch, epochs):
        order = epoch_order(examples, seed, epoch)
        for b in range(step - epoch * per_epoch, per_epoch):
            batch = [examples[i] for i in order[b * batch_size:(b + 1) * batch_size]]
            n_lab, n_pairs = _counts(batch, train_on, objective, w)
            lo, hi = _share(len(batch), r, w)
            bad, tot = _train_batch(upd, batch[lo:hi], n_lab, tokenizer, cache, train_on, share_prompts,
                                    objective, pair_weight, n_pairs)
            if w > 1:
                tot, n_bad = all_reduce([tot, float(bad)])
                bad = n_bad > 0
            if not bad and (objective != "pairwise" or n_pairs):
                sums[epoch][0] += tot
                sums[epoch][1] += n_lab if objective == "pointwise" else 1
            step += 1
            if on_step is not None:
                on_step(step, upd, sums)
    rm.eval()
    return [tot / max(n, 1) for tot, n in sums]


def _resumed(resume: dict[str, Any] | None, epochs: int, upd: Updater) -> tuple[int, list[list[float]]]:
    """The optimizer steps done and the loss sums per epoch that ``resume`` holds (:func:`train_reward_model`),
    with its optimizer state, if any, loaded into ``upd``; none: ``(0, zeros)``."""
    sums: list[list[float]] = [[0.0, 0] for _ in range(epochs)]
    if resume is None:
        return 0, sums
    for e, v in enumerate(resume.get("loss_sums", [])[:epochs]):
        sums[e] = [float(v[0]), int(v[1])]
    if resume.get("optimizer") is not None:
        upd.optimizer.load_state_dict(resume["optimizer"])
    return int(resume["step"]), sums


def _counts(batch: Sequence[dict[str, Any]], train_on: TrainOn, objective: Objective, world: int) -> tuple[int, int]:
    """A whole batch's labelled positions and its same-question pairs (0 for the pointwise objective; pairs form
    within each of the ``world`` ranks' shares)."""
    n_lab = sum(len(ex["step_ends"]) if train_on == "process" else 1 for ex in batch)
    n_pairs = 0 if objective == "pointwise" else sum(
        len(same_question_pairs(batch[slice(*_share(len(batch), q, world))])) for q in range(world))
    return n_lab, n_pairs


def _train_batch(upd: Updater, mine: Sequence[dict[str, Any]], n_lab: int, tokenizer: Any,
                 cache: dict[str, list[int]], train_on: TrainOn, share_prompts: bool, objective: Objective = "pointwise",
                 pair_weight: float = 1.0, n_pairs: int = 0) -> tuple[bool, float]:
    """One optimizer step on this rank's share ``mine`` of a batch of ``n_lab`` labelled positions and ``n_pairs``
    same-question pairs (a zero-gradient pass when it has nothing to fit, or when its loss is not finite under
    several ranks); returns (the loss was not finite, this rank's loss: pointwise the summed BCE, else its part of
    the batch's objective)."""
    upd.zero_grad()
    bad, tot = False, 0.0
    pairs = same_question_pairs(mine) if objective != "pointwise" else []
    if mine and (objective != "pairwise" or pairs):
        ids, att, P = _grouped_batch(mine, tokenizer, cache)
        s = completion_scores(upd.forward_model, ids, att, P, share_prompts=share_prompts)
        loss = torch.zeros(())
        if objective != "pairwise":
            pos, lab = _targets(mine, train_on)
            rows_, cols = zip(*pos, strict=True)
            logit = s[list(rows_), list(cols)]
            loss_sum = torch.nn.functional.binary_cross_entropy_with_logits(logit, torch.tensor(lab), reduction="sum")
            loss = loss_sum / n_lab
        if pairs:
            last = s[torch.arange(len(mine)), torch.tensor([ex["step_ends"][-1] for ex in mine])]
            right, wrong = (torch.tensor(x) for x in zip(*pairs, strict=True))
            loss = loss + (1.0 if objective == "pairwise" else pair_weight) * pairwise_loss(
                last[right], last[wrong]).sum() / n_pairs
        bad = not bool(torch.isfinite(loss))
        if bad and upd.distributed:
            upd.dummy_backward(last=True)
        elif not bad:
            upd.backward(loss, last=True)
            tot = float(loss_sum.detach()) if objective == "pointwise" else float(loss.detach())
    elif upd.distributed:
        upd.dummy_backward(last=True)
    upd.step(bad=bad or (objective == "pairwise" and not n_pairs))  # no pair in the whole batch: no update
    return bad, tot


def split_by_question(examples: Sequence[dict[str, Any]], heldout_fraction: float, seed: int
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) with every sample of a question on the same side."""
    qs = sorted({str(ex["id"]) + "\0" + ex["question"] for ex in examples})
    random.Random(seed).shuffle(qs)
    n_held = round(heldout_fraction * len(qs))
    held = set(qs[:n_held])
    tr = [ex for ex in examples if str(ex["id"]) + "\0" + ex["question"] not in held]
    he = [ex for ex in examples if str(ex["id"]) + "\0" + ex["question"] in held]
    return tr, he


def replay_mix(new: Sequence[dict[str, Any]], history: Sequence[dict[str, Any]], fraction: float, seed: int
               ) -> tuple[list[dict[str, Any]], int]:
    """New examples plus round(fraction * len(history)) historical ones drawn without replacement (paper 4.1.4:
    "a replay mechanism that incorporates 10% of historical data"); returns (mixed, number replayed)."""
    k = round(fraction * len(history))
    replay = random.Random(seed).sample(list(history), k) if k else []
    return list(new) + replay, k

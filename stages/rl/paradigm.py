"""The paper's unified paradigm (DeepSeekMath section 5.2.1, eq. 5, Table 10, Appendix A.1), as pure functions.

Every method is one gradient, differing in data source D, reward function pi_rf and gradient coefficient GC::

    grad J_A = E_{(q, o) ~ D} [ (1/|o|) sum_t GC_A(q, o, t, pi_rf) grad log pi_theta(o_t | q, o_<t) ]   (eq. 5)

============  ====================================  ===========  ==============================================
algorithm     data source D                         reward       gradient coefficient GC
============  ====================================  ===========  ==============================================
sft           q, o ~ P_sft (the gold CoT solutions)  --           1
rft           q ~ P_sft, o ~ pi_sft(O|q), once      rule         I(o) = 1 if o's answer is correct, else 0 (eq. 10)
online_rft    q ~ P_sft, o ~ pi_theta(O|q)          rule         I(o) (eq. 10)
grpo          q ~ P_sft, {o_i} ~ pi_theta(O|q)      rule/model   A_{i,t} + beta (pi_ref/pi_theta - 1) (eq. 21)
============  ====================================  ===========  ==============================================

``grpo`` is :func:`stages.rl.losses.grpo_loss`; ``sft`` is the continued SFT of :mod:`stages.rl.baseline`;
``rft`` and ``online_rft`` minimise :func:`weighted_nll_loss` with GC = :func:`rft_coefficients`.

Departure (both RFT variants): the paper's expectation runs over every sampled output, wrong ones contributing 0,
so its loss is (1/N) sum_{i correct} (1/|o_i|) sum_t -log pi; the stage masks the wrong outputs out of the loss
*and* out of the normaliser, i.e. the SFT loss on the correct outputs, (1/N_correct) sum_{i correct} ... (RFT
literally fine-tunes on the filtered samples). The gradient direction is the same; its scale differs by
N_correct / N per step. RFT keeps each distinct correct output once (:func:`select_rft_samples`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stages.rl.data import step_questions
from stages.rl.losses import weighted_nll_loss  # noqa: F401 - re-exported: the loss of eq. 5 with GC


def rft_coefficients(correct: Tensor) -> Tensor:
    """Gradient coefficient of (online) RFT, paper eq. 10: GC(o) = I(o), 1.0 for a correct output, else 0.0.

    Args:
        correct: (B,) bool (or 0/1) per output: its extracted answer equals the gold answer.

    Returns:
        (B,) float32 coefficients, constant over the output's tokens.
    """
    return correct.to(torch.bool).to(torch.float32)


def run_questions(n_rows: int, total_steps: int, per_step: int, seed: int, *, rank: int = 0, world: int = 1
                  ) -> list[int]:
    """Sorted row indices of every question the run's steps 0 .. total_steps-1 take (its rank's share of each step:
    ``step_questions(...)[rank::world]``); RFT samples exactly these once, before training."""
    out: set[int] = set()
    for step in range(total_steps):
        out.update(step_questions(n_rows, step, per_step, seed)[rank::world])
    return sorted(out)


def _norm_text(text: str) -> str:
    return " ".join(text.split())


def select_rft_samples(texts: Sequence[Sequence[str]], correct: Sequence[Sequence[bool]]) -> list[list[int]]:
    """RFT's data filter: for each question, the indices of its correct outputs, each distinct output kept once.

    Two outputs are the same when their texts are equal after collapsing whitespace; the first one is kept.

    Args:
        texts: texts[q][g], output g of question q.
        correct: correct[q][g], whether that output's answer is right (the rule reward).

    Returns:
        kept[q]: increasing indices g of the outputs kept for question q.
    """
    kept: list[list[int]] = []
    for tq, cq in zip(texts, correct, strict=True):
        seen: set[str] = set()
        keep_q: list[int] = []
        for g, (t, ok) in enumerate(zip(tq, cq, strict=True)):
            key = _norm_text(t)
            if ok and key not in seen:
                seen.add(key)
                keep_q.append(g)
        kept.append(keep_q)
    return kept


@dataclass
class RftPool:
    """RFT's offline data: per question (row index), the kept outputs of the start model and the sampling counts."""

    kept: dict[int, list[Any]] = field(default_factory=dict)
    """row index -> the kept (correct, distinct) completions (stages.core.generation.Completion)."""
    n_sampled: dict[int, int] = field(default_factory=dict)
    """row index -> outputs sampled for it."""
    n_correct: dict[int, int] = field(default_factory=dict)
    """row index -> correct outputs among them (before deduplication)."""

    def step_samples(self, questions: Sequence[int]) -> list[tuple[int, Any]]:
        """(row index, completion) of every kept output of ``questions``, in question order."""
        return [(q, c) for q in questions for c in self.kept.get(q, [])]

    def accuracy(self, questions: Sequence[int]) -> float:
        """Share of correct outputs among those sampled for ``questions`` (NaN when none was sampled)."""
        n = sum(self.n_sampled.get(q, 0) for q in questions)
        return sum(self.n_correct.get(q, 0) for q in questions) / n if n else float("nan")

    def summary(self) -> dict[str, Any]:
        """Counts for the stage metrics: questions, sampled, correct, kept (distinct correct) outputs."""
        n_s, n_c = sum(self.n_sampled.values()), sum(self.n_correct.values())
        n_k = sum(len(v) for v in self.kept.values())
        return {"questions": len(self.n_sampled), "sampled": n_s, "correct": n_c, "kept": n_k,
                "accuracy": round(n_c / n_s, 6) if n_s else None,
                "questions_with_samples": sum(1 for v in self.kept.values() if v)}


def build_rft_pool(generator: Any, rows: Sequence[dict[str, Any]], questions: Sequence[int], prompts: Sequence[str],
                   sp: Any, is_correct: Any) -> RftPool:
    """Sample ``sp.n`` outputs for each question once, judge them with ``is_correct(row, completion) -> bool`` and
    keep the correct, distinct ones (:func:`select_rft_samples`). ``prompts[k]`` is the prompt of ``questions[k]``."""
    outs = generator.generate(list(prompts), sp) if questions else []
    return rft_pool_from_samples(rows, questions, outs, is_correct)


def rft_pool_from_samples(rows: Sequence[dict[str, Any]], questions: Sequence[int], outs: Sequence[Sequence[Any]],
                          is_correct: Any) -> RftPool:
    """The pool of ``outs[k]``, the outputs sampled for question ``questions[k]``: judged with
    ``is_correct(row, completion) -> bool``, the correct, distinct ones kept (:func:`select_rft_samples`)."""
    texts = [[c.text for c in group] for group in outs]
    correct = [[bool(is_correct(rows[q], c)) for c in group] for q, group in zip(questions, outs, strict=True)]
    kept = select_rft_samples(texts, correct)
    pool = RftPool()
    for q, group, ok, keep in zip(questions, outs, correct, kept, strict=True):
        pool.kept[q] = [group[g] for g in keep]
        pool.n_sampled[q] = len(group)
        pool.n_correct[q] = sum(ok)
    return pool

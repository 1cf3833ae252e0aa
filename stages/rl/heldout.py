"""GRPO's held-out curve (``grpo.heldout``): greedy CoT accuracy of the policy on fixed problems before the first
step, every ``every`` steps and after the last, scored by the evaluation stage's own code.

A held-out evaluation is one greedy zero-shot CoT run of stages/evaluate/loop.py (``evaluate_batch``: the prompt,
the stop strings, answer extraction and the equivalence check of ``evaluate@<model>``) summarised by its
``greedy_summary`` (the evaluation stage's summary of a greedy run), on the rollout generator (synced to the policy).
For the same checkpoint, problems and generation limit it gives the accuracy ``evaluate`` reports
(tests/rl/test_heldout.py). The prompt is the RL template's (``grpo.template``): for ``deepseekmath`` that is the
model's own zero-shot prompt, the one ``evaluate`` uses; ``r1`` prompts as the policy is trained.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from stages.core import paths
from stages.core.problems import Problem, load_problem_file
from stages.core.prompts import rl_prompt
from stages.evaluate.loop import LoopSettings, RunSpec, evaluate_batch, greedy_summary


@dataclass(frozen=True)
class TemplateFormat:
    """The zero-shot prompt format of an RL template (``prompt(question, mode)``, as stages.core.prompts'
    formats): every mode gets the template's CoT prompt."""

    template: str
    tokenizer: Any

    def prompt(self, question: str, mode: str = "cot") -> str:
        return rl_prompt(question, self.template, self.tokenizer)


class HeldoutEval:
    """The held-out curve: ``records`` of ``{"step": steps done, "heldout_accuracy": share correct}``; ``last``:
    the evaluation records (stages/evaluate/loop.py's, one per problem) of the latest evaluation."""

    def __init__(self, problems: list[Problem], every: int, max_new_tokens: int,
                 template: str = "deepseekmath") -> None:
        self.problems = problems
        self.every = every
        self.max_new_tokens = max_new_tokens
        self.template = template
        self.records: list[dict[str, Any]] = []
        self.last: list[dict[str, Any]] = []

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The problems as RL rows (question, answer)."""
        return [{"id": q.id, "question": q.question, "answer": q.gold} for q in self.problems]

    @classmethod
    def from_params(cls, h: Any, template: str = "deepseekmath") -> HeldoutEval | None:
        """None when ``h.every`` is 0 (off); prompts in the RL ``template`` (the one the policy is trained with)."""
        if not h.every:
            return None
        return cls(load_problem_file(h.problems_file or paths.problems_file("test"), h.limit), h.every,
                   h.max_new_tokens, template)

    def due(self, done: int, total: int) -> bool:
        """Whether the policy after ``done`` of ``total`` steps is evaluated (and was not yet)."""
        hit = done == 0 or done % self.every == 0 or done == total
        return hit and not any(r["step"] == done for r in self.records)

    def score(self, generator: Any) -> dict[str, Any]:
        """The evaluation stage's greedy CoT summary (``acc``, ``n``, ``no_answer``, ...) of ``generator``'s model on
        the problems, all in one batch."""
        spec = RunSpec(self.problems[0].benchmark, "cot", "greedy", 1)
        settings = LoopSettings(batch_size=len(self.problems), max_new_tokens=self.max_new_tokens, temperature=0.0,
                                top_p=1.0, seed=0, tir_max_rounds=1, exec_timeout_s=10.0, exec_workers=1)
        fmt = TemplateFormat(self.template, getattr(generator, "tokenizer", None))
        with ThreadPoolExecutor(max_workers=1) as pool:  # cot runs no program
            self.last = evaluate_batch(generator, self.problems, spec, settings, "zero_shot", None, 0, pool, fmt=fmt)
        return greedy_summary(self.last, spec.mode)

    def evaluate(self, done: int, generator: Any) -> float:
        """Evaluate now (``generator`` holds the current weights); record and return the accuracy."""
        acc = float(self.score(generator)["acc"])
        self.records.append({"step": done, "heldout_accuracy": acc})
        self.records.sort(key=lambda r: r["step"])
        return acc

    def metrics(self) -> dict[str, Any]:
        """The curve for the stage metrics: problem count, first / last accuracy and ``accuracy_at_step`` (a mapping
        step -> accuracy, not a list: ``dvc exp show`` drops list values, and benchmarks/paradigm.py reads it there)."""
        acc = [round(r["heldout_accuracy"], 6) for r in self.records]
        return {"n": len(self.problems), "every": self.every, "first": acc[0] if acc else None,
                "last": acc[-1] if acc else None,
                "accuracy_at_step": {str(r["step"]): a for r, a in zip(self.records, acc, strict=True)}}

"""The validation split of the RL prompts and the choice of the stage's model on it (``grpo.validation``; NeMo-RL's
``checkpointing.metric_name`` / ``keep_top_k``).

- :func:`split` takes ``size`` prompts out of the RL prompts (a seeded draw), never one whose question is in a test
  set: the held-out curve's problem file (``grpo.heldout.problems_file``) and every ``data/testsets/*.jsonl``
  (questions compared after collapsing whitespace and case). The rest trains (and the continued-SFT baseline sees the
  same questions as the policy).
- :class:`Validation` evaluates the policy on the split through the evaluation stage's code (the held-out curve's
  :class:`stages.rl.heldout.HeldoutEval`: greedy zero-shot CoT, the RL template's prompt, evaluate's extraction and
  equivalence) before the first step, every ``every`` steps and after the last. With ``select: best`` it keeps the
  ``keep_top_k`` best evaluated checkpoints (the policy as the stage would save it: a LoRA policy's merged weights and
  its adapter) on disk, and the stage saves the best instead of the last.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import torch

from stages.core import paths
from stages.core.problems import Problem
from stages.rl import lora
from stages.rl.heldout import HeldoutEval

Rows = list[dict[str, Any]]


def _norm(q: str) -> str:
    return re.sub(r"\s+", " ", q).strip().lower()


def test_questions(heldout_file: str | os.PathLike[str] | None) -> set[str]:
    """The normalised questions of every test set: ``heldout_file`` and data/testsets/*.jsonl (those that exist)."""
    files = sorted(paths.TESTSETS.glob("*.jsonl")) if paths.TESTSETS.is_dir() else []
    if heldout_file is not None and Path(heldout_file).is_file():
        files.append(Path(heldout_file))
    out: set[str] = set()
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    q = row.get("question", row.get("problem"))
                    if isinstance(q, str):
                        out.add(_norm(q))
    return out


def split(rows: Rows, size: int, seed: int, exclude: set[str]) -> tuple[Rows, Rows, int]:
    """(training rows, validation rows, candidates excluded as test questions): ``size`` rows drawn with ``seed``
    from those whose question is not in ``exclude`` (all of them when fewer); the training rows keep their order."""
    if not size:
        return rows, [], 0
    ok = [i for i, r in enumerate(rows) if _norm(r["question"]) not in exclude]
    picked = set(random.Random(seed * 1_000_003 + 97).sample(ok, min(size, len(ok))))
    val = [rows[i] for i in sorted(picked)]
    return [r for i, r in enumerate(rows) if i not in picked], val, len(rows) - len(ok)


def prepare(p: Any, rows: Rows, ckpt_dir: Path | None) -> tuple[Rows, Validation | None]:
    """(training rows, the run's :class:`Validation` or None) of the grpo params ``p`` (``grpo.validation``): the
    split of ``rows``, its best checkpoints under ``ckpt_dir/validation``."""
    v = p.validation
    if not v.size:
        return rows, None
    exclude = test_questions(p.heldout.problems_file or paths.problems_file("test"))
    train, val_rows, excluded = split(rows, v.size, p.seed, exclude)
    if not val_rows or not train:
        from stages.core.errors import PipelineError

        raise PipelineError(
            f"grpo.validation.size: {v.size} of {len(rows)} prompts ({excluded} are test questions) "
            "leaves no validation or no training prompt; lower it"
        )
    val = Validation(val_rows, p, p.template, excluded)
    val.dir = None if ckpt_dir is None else Path(ckpt_dir) / "validation"
    return train, val


def as_problems(rows: Rows) -> list[Problem]:
    """RL prompt rows as evaluation problems (the row's ``benchmark`` family, generated when it has none)."""
    return [
        Problem(
            id=str(r.get("id", i)),
            benchmark=r.get("benchmark") or "generated",
            question=r["question"],
            gold=str(r["answer"]),
            difficulty=r.get("difficulty"),
        )
        for i, r in enumerate(rows)
    ]


class Validation:
    """The validation evaluations of a run and its best checkpoints (module docstring). ``records``:
    ``{"step", "validation_accuracy"}`` per evaluation; ``snapshots``: (metric, step, file) of the kept best."""

    def __init__(self, rows: Rows, p: Any, template: str, excluded: int = 0) -> None:
        v = p.validation
        self.rows, self.select, self.keep = rows, v.select, v.keep_top_k
        self.eval = HeldoutEval(as_problems(rows), v.every, v.max_new_tokens, template)
        self.excluded = excluded
        self.iterations = p.iterative.iterations
        self.dir: Path | None = None
        self.snapshots: list[tuple[float, int, str]] = []

    @property
    def records(self) -> list[dict[str, Any]]:
        return [{"step": r["step"], "validation_accuracy": r["heldout_accuracy"]} for r in self.eval.records]

    def due(self, done: int, total: int) -> bool:
        return self.eval.due(done, total)

    def evaluate(self, done: int, generator: Any, model: Any, iteration: int) -> float:
        """Evaluate the policy after ``done`` steps (``generator`` holds its weights); with ``select: best`` keep its
        checkpoint when it is among the ``keep_top_k`` best so far. Returns the accuracy."""
        acc = self.eval.evaluate(done, generator)
        if self.select == "best" and self.dir is not None:
            self._keep(acc, done, model, iteration)
        return acc

    def _keep(self, acc: float, done: int, model: Any, iteration: int) -> None:
        ranked = sorted(self.snapshots + [(acc, done, "")], key=lambda s: (-s[0], s[1]))
        if (acc, done, "") not in ranked[: self.keep]:
            return
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        f = self.dir / f"step-{done}.pt"
        state = {
            "weights": {
                k: v.detach().to("cpu", copy=True)
                for k, v in (lora.merged_state_dict(model) if lora.has_lora(model) else model.state_dict()).items()
            },
            "adapter": lora.adapter_state_dict(model) if lora.has_lora(model) else None,
            "iteration": iteration,
            "step": done,
            "accuracy": acc,
        }
        tmp = f.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, f)
        self.snapshots = sorted(self.snapshots + [(acc, done, str(f))], key=lambda s: (-s[0], s[1]))
        for _, _, old in self.snapshots[self.keep :]:
            Path(old).unlink(missing_ok=True)
        self.snapshots = self.snapshots[: self.keep]

    def best(self) -> dict[str, Any] | None:
        """The best kept checkpoint's state (``weights``, ``adapter``, ``iteration``, ``step``, ``accuracy``)."""
        if not self.snapshots:
            return None
        return torch.load(self.snapshots[0][2], map_location="cpu", weights_only=False)

    def state_dict(self) -> dict[str, Any]:
        return {"records": list(self.eval.records), "snapshots": list(self.snapshots)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.eval.records = list(state["records"])
        self.snapshots = [tuple(s) for s in state["snapshots"] if Path(s[2]).is_file()]  # type: ignore[misc]

    def selected(self, last_step: int) -> tuple[int, dict[str, Any] | None]:
        """(step, best checkpoint state or None) of the stage's model: the best kept one with ``select: best`` (when
        one was kept), else the last step's policy (None: the policy as it is)."""
        best = self.best() if self.select == "best" else None
        return (int(best["step"]), best) if best is not None else (last_step, None)

    def metrics(self, selected_step: int | None) -> dict[str, Any]:
        """For the stage metrics: size, excluded test questions, the curve (step -> accuracy), the selection."""
        recs = self.records
        return {
            "n": len(self.rows),
            "excluded_test_questions": self.excluded,
            "select": self.select,
            "selected_step": selected_step,
            "selected_accuracy": next(
                (round(r["validation_accuracy"], 6) for r in recs if r["step"] == selected_step), None
            ),
            "best_accuracy": max((round(r["validation_accuracy"], 6) for r in recs), default=None),
            "accuracy_at_step": {str(r["step"]): round(r["validation_accuracy"], 6) for r in recs},
        }

"""The ``grpo.validation`` and ``grpo.tracking`` groups: a validation split of the RL prompts evaluated during the
run, the stage's model chosen on it (best or last; NeMo-RL ``checkpointing.metric_name`` / ``keep_top_k``), and the
per-step metrics logged with dvclive (stages/rl/validation.py, stages/rl/tracking.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from stages.schema.base import NonNegInt, PosInt, Section


class GrpoValidationParams(Section):
    """A validation split taken from the RL prompts (never from the test sets: a prompt whose question is in
    grpo.heldout.problems_file or in any data/testsets/*.jsonl is never drawn), left out of training, evaluated with
    the evaluation stage's code (greedy CoT accuracy, as the held-out curve) before the first step, every ``every``
    steps and after the last; the stage's model is the ``select`` checkpoint by ``metric``."""

    size: NonNegInt = 0
    """Prompts held out for validation (drawn by ``grpo.seed``); 0 = no validation split (every prompt trains)."""
    every: PosInt = 10
    """Evaluate the validation split every this many steps (and before the first and after the last)."""
    max_new_tokens: PosInt = 64
    """Greedy generation limit of the validation evaluation."""
    select: Literal["last", "best"] = "last"
    """The stage's model (data/models/grpo): the policy after the last step, or the validated checkpoint with the best
    ``metric`` (the earliest on ties), a step-0 evaluation included (the start model can win)."""
    metric: Literal["accuracy"] = "accuracy"
    """What ``select: best`` ranks by (higher is better): accuracy = the share of validation prompts answered right."""
    keep_top_k: PosInt = 1
    """Best validated checkpoints kept on disk during the run (under the run's checkpoint directory; removed when the
    stage finishes); ``select: best`` uses the first."""

    @model_validator(mode="after")
    def _check(self) -> GrpoValidationParams:
        if self.select == "best" and not self.size:
            raise ValueError("select: best ranks checkpoints on the validation split; set size > 0, or select: last")
        return self


def check_validation(p: Any) -> str | None:
    """A one-line problem with ``grpo.validation`` in the grpo section ``p``, or None."""
    from stages.rl.registry import ALGORITHMS

    if p.validation.size and not ALGORITHMS.spec(p.algorithm).samples:
        return (
            f"validation.size: algorithm {p.algorithm} has no RL loop to validate in (continued SFT); set "
            "validation.size 0"
        )
    return None


class GrpoTrackingParams(Section):
    """Experiment tracking the DVC way: every step's metrics (the timings excluded: a rerun of the same inputs writes
    the same bytes) logged with dvclive to data/dvclive/grpo: live while the stage runs (metrics.json after each step)
    and as plots (plots/metrics/<metric>.tsv), which the grpo stage in dvc.yaml declares, so that ``dvc exp show`` and
    ``dvc plots diff`` compare RL runs."""

    live: bool = True
    """Update data/dvclive/grpo after every step (true: live metrics during the run) or once when the run ends (the
    same files either way)."""

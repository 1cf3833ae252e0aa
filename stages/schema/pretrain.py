"""Schema of params.yaml's ``pretrain`` section: continual pretraining on a text mixture (paper 2.3)."""

from __future__ import annotations

from pydantic import field_validator

from stages.schema.base import Fraction, NonNegInt, PosInt, Section
from stages.schema.train import LauncherParams, TrainLoopParams


class MixtureSource(Section):
    """One source of the pretraining mixture."""

    path: str
    """JSONL file with a "text" field per row (relative to the project root)."""
    ratio: Fraction
    """Share of training tokens drawn from this source (the ratios must sum to 1)."""


class PretrainParams(Section):
    """Section ``pretrain``: continual pretraining of the base model on a mixture of text sources."""

    SECTION = "pretrain"

    enabled: bool
    """false: no continual pretraining; data/models/pretrain passes the base model through (a model_ref.json)."""
    mixture: list[MixtureSource]
    """Sources and token shares; the first one is the math corpus (its first eval_docs rows are held out)."""
    eval_docs: NonNegInt
    """Rows of the first source held out (never trained on) to measure math-text loss and perplexity."""
    eval_tokens: PosInt
    """At most this many held-out tokens are scored per evaluation."""
    train: TrainLoopParams
    """The training loop (paper: multistep schedule, AdamW 0.9/0.95, wd 0.1)."""
    launcher: LauncherParams
    """How the stage's ranks start: in this process, or under torchrun / the deepspeed launcher (multi-GPU)."""

    @field_validator("mixture")
    @classmethod
    def _check_mixture(cls, v: list[MixtureSource]) -> list[MixtureSource]:
        if not v:
            raise ValueError("give at least one {path, ratio} source")
        total = sum(s.ratio for s in v)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"mixture ratios must sum to 1, they sum to {total:g}")
        paths = [s.path for s in v]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a source is listed twice: {paths}")
        return v

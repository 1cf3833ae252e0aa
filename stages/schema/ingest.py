"""Schema of params.yaml's ``ingest`` section: the SFT and RL sets, read into pipeline rows and decontaminated."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from stages.schema.base import RUNTIME, Fraction, NonNegInt, Section, TimeoutS, Workers
from stages.schema.datasets import DatasetSpec, check_names


class IngestDecontamParams(Section):
    """Decontamination of every ingested row against the test sets (stages/corpus/decontaminate.py)."""

    testsets: str
    """The test sets to decontaminate against: the testsets stage's directory (data/testsets) or one file."""
    ngram: Annotated[int, Field(ge=3, le=256)] = 10
    """n of the n-gram rule (paper 2.1: 10)."""
    min_short: Annotated[int, Field(ge=1)] = 3
    """Test questions with at least this many (and fewer than ngram) grams are matched whole (paper 2.1: 3)."""
    min_overlap: Fraction = 0.7
    """A row is removed when it holds this share of one test question's or solution's distinct n-grams
    (0: one shared n-gram, the paper's literal rule; 0.7 measured on real math: docs/results/corpus.md)."""


class IngestCommonParams(Section):
    """Settings every ingested data set shares."""

    exec_timeout_s: TimeoutS = 10.0
    """CPU-time limit of one program run in the sandbox: the same outcome at any load (a wall-clock cap of 3x it:
    stages.core.sandbox.cpu_limit; a PoT row is kept only when its program returns the gold)."""
    exec_workers: Annotated[Workers, RUNTIME] = 2
    """Sandbox worker processes for the program checks."""
    samples: NonNegInt = 20
    """Skipped and removed rows quoted per reason in the report (data/ingest/reports/<name>.json; ours)."""
    decontam: IngestDecontamParams
    """Decontamination against the test sets."""


class IngestDataset(DatasetSpec):
    """One training data set and what it is for."""

    role: Literal["sft", "rl"]
    """sft: SFT examples (data/ingest/sft/<name>.jsonl; rows need a solution); rl: RL prompts for grpo and the reward
    model (data/ingest/rl/<name>.jsonl). A data set used for both is listed twice, once per role."""


class IngestParams(Section):
    """Section ``ingest``: the SFT and RL data sets (GSM8K / MATH train, instruction sets, program sets), one dvc
    stage ``ingest@<name>`` each: read, converted to pipeline rows, checked (programs in the sandbox, the response's
    answer against the gold), decontaminated against the test sets, written to data/ingest/<role>/<name>.jsonl
    with a report of what was kept and skipped. {} in the tiny default (its sets are generated)."""

    SECTION = "ingest"

    common: IngestCommonParams
    """Settings shared by every data set (dvc tracks them for every ingest@ stage)."""
    datasets: dict[str, IngestDataset]
    """Training data sets by name."""

    @field_validator("datasets")
    @classmethod
    def _check_names(cls, v: dict[str, IngestDataset]) -> dict[str, IngestDataset]:
        check_names(v)  # type: ignore[arg-type]
        return v

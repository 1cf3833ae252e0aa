"""Schema of params.yaml's ``testsets`` section: the evaluation sets, read once into pipeline rows."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import field_validator

from stages.schema.base import RUNTIME, NonNegInt, Section, TimeoutS, Workers
from stages.schema.datasets import DatasetSpec, check_names


class TestsetCommonParams(Section):
    """Settings every test set shares."""

    __test__: ClassVar[bool] = False  # not a pytest test class (the name starts with "Test")

    exec_timeout_s: TimeoutS = 10.0
    """CPU-time limit of one program run in the sandbox: the same outcome at any load (a wall-clock cap of 3x it:
    stages.core.sandbox.cpu_limit; PAL / PoT rows are kept only when their program returns the gold)."""
    exec_workers: Annotated[Workers, RUNTIME] = 2
    """Sandbox worker processes for the program checks."""
    samples: NonNegInt = 20
    """Skipped rows quoted per reason in the report (data/testsets/reports/<name>.json)."""


class TestsetsParams(Section):
    """Section ``testsets``: every evaluation set (GSM8K test, MATH test, MATH-500, GSM-Hard, the generated test
    problems), one dvc stage ``testsets@<name>`` each, written to data/testsets/<name>.jsonl in the pipeline's
    rows. They are what the evaluate stage scores, what the corpus and ingest stages decontaminate against, and
    never training data."""

    SECTION = "testsets"
    __test__: ClassVar[bool] = False

    common: TestsetCommonParams
    """Settings shared by every test set (dvc tracks them for every testsets@ stage)."""
    datasets: dict[str, DatasetSpec]
    """Test sets by name (the evaluate stage's benchmark names): where each is and how it is converted."""

    @field_validator("datasets")
    @classmethod
    def _check_names(cls, v: dict[str, DatasetSpec]) -> dict[str, DatasetSpec]:
        if not v:
            raise ValueError("give at least one test set (the tiny default's: generated)")
        check_names(v)  # type: ignore[arg-type]
        return v

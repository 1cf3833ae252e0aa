"""The whole params file: every section's schema (stages/schema/<section>.py) plus the ``runtime`` section.

Stages never import this module: each imports only its own section's schema, so editing one section's schema
re-runs no other stage. This module validates the *whole* file before anything runs (``python -m flows.<stage>``
and ``python -m flows.pipeline`` call :func:`load_params` first), so a bad value anywhere fails fast in one line.
It can only refuse to run, never change what a stage computes: dvc.yaml does not list it as a code dep
(tests/flows/test_dvc_yaml.py, ``VALIDATION_ONLY``).

The section classes are re-exported here for tests and scripts (``from stages.params import GrpoParams``).
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from stages.core.errors import PipelineError
from stages.schema.base import RUNTIME, Section, format_error, merge_runtime, read_params_file
from stages.schema.base_model import BaseModelParams
from stages.schema.corpus import (
    ClassifierParams,
    CorpusParams,
    DecontamParams,
    DedupParams,
    DomainParams,
    RecallParams,
)
from stages.schema.data import CrawlParams, DataParams, ProblemParams
from stages.schema.evaluate import EvalCommonParams, EvalMode, EvalModelParams, EvaluateParams
from stages.schema.grpo import (
    GrpoBaselineParams,
    GrpoHeldoutParams,
    GrpoIterativeParams,
    GrpoParams,
    GrpoRewardParams,
)
from stages.schema.pretrain import MixtureSource, PretrainParams
from stages.schema.report import ReportParams
from stages.schema.reward_model import RewardModelParams
from stages.schema.sft import SftFormatMix, SftParams
from stages.schema.train import DeepSpeedParams, TrainLoopParams

__all__ = [
    "RUNTIME", "BaseModelParams", "ClassifierParams", "CorpusParams", "CrawlParams", "DataParams", "DecontamParams",
    "DedupParams", "DeepSpeedParams", "DomainParams", "EvalCommonParams", "EvalMode", "EvalModelParams",
    "EvaluateParams", "GrpoBaselineParams", "GrpoHeldoutParams", "GrpoIterativeParams", "GrpoParams",
    "GrpoRewardParams", "MixtureSource", "Params", "PretrainParams", "ProblemParams", "RecallParams",
    "ReportParams", "RewardModelParams", "Section", "SftFormatMix", "SftParams", "TrainLoopParams", "load_params", "parse_params",
]


class Params(BaseModel):
    """The whole params.yaml: one section per dvc.yaml stage (the ``runtime`` section is merged into them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    data: DataParams
    """Generated crawl, seed corpus and word problems."""
    base_model: BaseModelParams
    """Tokenizer and initial model."""
    corpus: CorpusParams
    """Math corpus: fastText recall over rounds, domain discovery, dedup, decontamination."""
    evaluate: EvaluateParams
    """Evaluation of every model (greedy, pass@k, maj@k; CoT / PoT / TIR)."""
    grpo: GrpoParams
    """GRPO from the SFT model (paper section 4), with a continued-SFT baseline."""
    pretrain: PretrainParams
    """Continual pretraining on the corpus mixture (paper section 2.3)."""
    report: ReportParams
    """The one-page HTML report of the whole run (the last stage)."""
    reward_model: RewardModelParams
    """Neural outcome / process reward model for GRPO (paper sections 4.1.3-4.1.4)."""
    sft: SftParams
    """Supervised fine-tuning on CoT / PoT / TIR solutions (paper section 3)."""


def section_classes() -> dict[str, type[Section]]:
    """Every top-level section's schema class by params.yaml key."""
    return {name: f.annotation for name, f in Params.model_fields.items()}  # type: ignore[misc]


def parse_params(raw: Any, source: str = "params") -> Params:
    """Validate an already-loaded mapping (``runtime`` included); raise a one-line :class:`PipelineError`."""
    if not isinstance(raw, dict):
        raise PipelineError(f"{source}: expected a mapping of sections (data:, base_model:, ...), got {type(raw).__name__}")
    raw = dict(raw)
    runtime = raw.pop("runtime", None) or {}
    if not isinstance(runtime, dict):
        raise PipelineError(f"{source}: runtime: expected a mapping of sections, got {type(runtime).__name__}")
    classes = section_classes()
    for name in runtime:
        if name not in classes:
            raise PipelineError(f"{source}: runtime.{name}: unknown section; use one of {sorted(classes)}")
    merged = {name: merge_runtime(classes[name], raw[name], runtime.get(name), name, source) if name in classes
              and name in raw else value for name, value in raw.items()}
    try:
        params = Params.model_validate(merged)
    except ValidationError as e:
        raise PipelineError(format_error(source, e)) from None
    unknown = [m for m in params.report.models if m not in params.evaluate.models]
    if unknown:
        raise PipelineError(f"{source}: report.models: {unknown} not in evaluate.models ({sorted(params.evaluate.models)});"
                            " list only evaluated models")
    return params


def load_params(path: str | os.PathLike[str] = "params.yaml") -> Params:
    """Read and validate a whole params file (default ``params.yaml`` in the project root)."""
    return parse_params(read_params_file(path), str(path))

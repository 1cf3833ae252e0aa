"""Schema of params.yaml's ``report`` section: the one-page HTML report of the whole run."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from stages.schema.base import NonNegInt, Section


def _unique(models: list[str]) -> list[str]:
    dup = sorted({m for m in models if models.count(m) > 1})
    if dup:
        raise ValueError(f"models listed twice: {dup}; list each evaluated model once")
    return models


class ReportParams(Section):
    """Section ``report``: a static, self-contained page (data/report/index.html) of every stage's key metrics,
    curves and the paper's reference numbers beside ours (stages/report/)."""

    SECTION = "report"

    title: Annotated[str, Field(min_length=1)] = "DeepSeekMath pipeline"
    """Heading of the page (say which run it describes: the tiny default, a 7B run)."""
    models: Annotated[list[str], Field(min_length=1), AfterValidator(_unique)] = ["base", "pretrain", "sft", "sft_continued", "grpo"]
    """Evaluated models shown in the headline table, in this order: keys of evaluate.models (the report reads
    data/metrics/evaluate_<model>.json of each; dvc.yaml's report stage lists those files as deps)."""
    benchmark_results: bool = False
    """Show the committed comparison results (benchmarks/results/paradigm.json: Figure 5, iterative_rl.json:
    Figure 6; measured on the tiny default by benchmarks/paradigm.py, Figure 6 with its ``--iterative-out``); false for
    a run they do not describe (a 7B run)."""
    bootstrap_resamples: Annotated[int, Field(ge=100)] = 2000
    """Resamples of the paired bootstrap over problems behind every model comparison the page makes (pretrained ->
    SFT -> RL, RL variants): the 95% interval of the accuracy difference, and whether it excludes 0."""
    bootstrap_seed: NonNegInt = 0
    """Seed of the bootstrap's resampling (shown on the page with the evaluation's sampling seed)."""

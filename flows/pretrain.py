"""Prefect flow of the ``pretrain`` stage (dvc.yaml: pretrain). Run: ``python -m flows.pretrain``."""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("pretrain")

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from flows._launch import run_stage
from stages.schema.pretrain import PretrainParams


@flow(name="pretrain")
def pretrain_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Continue pretraining the base model on the corpus mixture."""
    from stages import pretrain

    p = PretrainParams.from_file(params_path)
    log_section("pretrain", p)
    metrics = run_stage("pretrain", p, pretrain.run, params_path)  # in this process, or as ranks (launcher)
    publish_metrics("pretrain", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(pretrain_flow, "pretrain"))

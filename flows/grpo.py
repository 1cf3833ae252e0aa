"""Prefect flow of the ``grpo`` stage (dvc.yaml: grpo). Run: ``python -m flows.grpo``."""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("grpo")

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from flows._launch import run_stage
from stages.schema.grpo import GrpoParams


@flow(name="grpo")
def grpo_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """GRPO from the SFT model, plus the continued-SFT baseline."""
    from stages import grpo

    p = GrpoParams.from_file(params_path)
    log_section("grpo", p)
    metrics = run_stage("grpo", p, grpo.run, params_path)  # in this process, or as ranks (launcher)
    publish_metrics("grpo", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(grpo_flow, "grpo"))

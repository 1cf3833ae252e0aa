"""Prefect flow of the ``base_model`` stage (dvc.yaml: base_model). Run: ``python -m flows.base_model``."""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("base_model")

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages.schema.base_model import BaseModelParams


@flow(name="base_model")
def base_model_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Train the tokenizer and initialise the tiny model, or record the real checkpoint."""
    from stages import base_model

    p = BaseModelParams.from_file(params_path)
    log_section("base_model", p)
    metrics = base_model.run(p)
    publish_metrics("base_model", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(base_model_flow, "base_model"))

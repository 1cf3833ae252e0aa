"""Prefect flow of the ``base_model`` stage (dvc.yaml: base_model). Run: ``python -m flows.base_model``."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages import base_model
from stages.schema.base_model import BaseModelParams


@flow(name="base_model")
def base_model_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Train the tokenizer and initialise the tiny model, or record the real checkpoint."""
    p = BaseModelParams.from_file(params_path)
    log_section("base_model", p)
    metrics = base_model.run(p)
    publish_metrics("base_model", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(base_model_flow, "base_model"))

"""Prefect flow of the ``data`` stage (dvc.yaml: data). Run: ``python -m flows.data``."""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("data")

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages.schema.data import DataParams


@flow(name="data")
def data_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Generate the crawl, the seed corpus and the word problems."""
    from stages import data

    p = DataParams.from_file(params_path)
    log_section("data", p)
    metrics = data.run(p)
    publish_metrics("data", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(data_flow, "data"))

"""Prefect flow of the ``sft`` stage (dvc.yaml: sft). Run: ``python -m flows.sft``."""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("sft")

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from flows._launch import run_stage
from stages.schema.sft import SftParams


@flow(name="sft")
def sft_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Fine-tune the pretrained model on CoT / PoT / tool-integrated solutions."""
    from stages import sft

    p = SftParams.from_file(params_path)
    log_section("sft", p)
    metrics = run_stage("sft", p, sft.run, params_path)  # in this process, or as ranks (launcher)
    publish_metrics("sft", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(sft_flow, "sft"))

"""Prefect flow of the ``sft`` stage (dvc.yaml: sft). Run: ``python -m flows.sft``."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages import sft
from stages.params import load_params


@flow(name="sft")
def sft_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Fine-tune the pretrained model on CoT / PoT / tool-integrated solutions."""
    params = load_params(params_path)
    log_section(params, "sft")
    metrics = sft.run(params.sft)
    publish_metrics("sft", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(sft_flow, "sft"))

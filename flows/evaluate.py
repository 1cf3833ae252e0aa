"""Prefect flow of the ``evaluate`` stage (dvc.yaml: evaluate@<model>).

Run: ``python -m flows.evaluate --model sft`` (``<model>`` is a key of ``evaluate.models`` in params.yaml).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("evaluate")

import argparse
from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages.schema.evaluate import EvaluateParams


@flow(name="evaluate")
def evaluate_flow(params_path: str = "params.yaml", model: str = "sft") -> dict[str, Any]:
    """Evaluate one model: greedy / pass@k / maj@k, CoT / PoT / TIR, per benchmark and difficulty."""
    from stages.evaluate.stage import run

    p = EvaluateParams.from_file(params_path)
    log_section("evaluate", p)
    metrics = run(p, model)
    publish_metrics(f"evaluate_{model}", metrics)
    return metrics


def _args(ap: argparse.ArgumentParser) -> None:

    ap.add_argument("--model", required=True, metavar="NAME",
                    help="a key of evaluate.models in the params file (dvc.yaml stage evaluate@NAME)")


def cli(argv: list[str] | None = None) -> int:
    """``python -m flows.evaluate --model NAME [--params FILE]``."""
    return main(evaluate_flow, "evaluate", argv, add_args=_args, address=lambda a: f"evaluate@{a.model}")


if __name__ == "__main__":
    raise SystemExit(cli())

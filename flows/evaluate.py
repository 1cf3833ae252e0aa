"""Prefect flow of the ``evaluate`` stage (dvc.yaml: evaluate@<model>).

Run: ``python -m flows.evaluate --model sft`` (``<model>`` is a key of ``evaluate.models`` in params.yaml).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages import evaluate
from stages.schema.evaluate import EvaluateParams


@flow(name="evaluate")
def evaluate_flow(params_path: str = "params.yaml", model: str = "sft") -> dict[str, Any]:
    """Evaluate one model: greedy / pass@k / maj@k, CoT / PoT / TIR, per benchmark and difficulty."""
    p = EvaluateParams.from_file(params_path)
    log_section("evaluate", p)
    metrics = evaluate.run(p, model)
    publish_metrics(f"evaluate_{model}", metrics)
    return metrics


def cli(argv: list[str] | None = None) -> int:
    """``--model NAME`` picks the model; every other argument goes to :func:`flows._common.main`."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--model", required=True, help="a key of evaluate.models in params.yaml")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    return main(functools.partial(evaluate_flow, model=args.model), "evaluate", rest)


if __name__ == "__main__":
    raise SystemExit(cli())

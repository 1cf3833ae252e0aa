"""What every stage flow shares: the command line, params loading, logging and the summary artifact.

A stage flow is ``@flow def <stage>_flow(params_path) -> dict``: it loads its own section
(``<Section>.from_file``, runtime values merged in), logs it, calls ``stages.<stage>.run(section)``, and
publishes the returned metrics as a Prefect table artifact. Before the flow starts, :func:`main` validates the
whole params file (stages/params.py), so a bad value anywhere fails before any work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from stages.core.errors import PipelineError
from stages.params import load_params  # validation only: the whole file, before any work
from stages.schema.base import Section


def log_section(section: str, p: Section) -> None:
    """Log one params section (its runtime values included) in the current run's logger."""
    get_run_logger().info("params.%s = %s", section, p.model_dump())


def publish_metrics(stage: str, metrics: dict[str, Any]) -> None:
    """Publish a stage's metrics as a markdown table artifact (key ``<stage>-metrics``)."""
    rows = ["| metric | value |", "|---|---|"]
    for k, v in _flatten(metrics).items():
        rows.append(f"| {k} | {v} |")
    create_markdown_artifact(
        key=f"{stage.replace('_', '-')}-metrics", markdown="\n".join(rows), description=f"{stage} metrics"
    )


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = round(v, 4) if isinstance(v, float) else v
    return out


def main(flow_fn: Callable[..., Any], stage: str, argv: list[str] | None = None) -> int:
    """Command-line entry of ``python -m flows.<stage>``.

    Params are validated *before* Prefect starts, so a bad value costs no start-up time and prints
    one line (``error: params.yaml: <key>: ...``) with exit status 2 instead of a traceback. The
    same one-line treatment applies to any :class:`PipelineError` raised by the stage.
    """
    ap = argparse.ArgumentParser(prog=f"python -m flows.{stage}", description=f"Run the {stage} stage as a Prefect flow.")
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = ap.parse_args(argv)
    try:
        load_params(args.params)
        flow_fn(params_path=args.params)
    except Exception as e:
        user_error = pipeline_error(e)
        if user_error is None:
            raise
        print(f"error: {user_error}", file=sys.stderr)
        return 2
    return 0


def pipeline_error(e: BaseException) -> PipelineError | None:
    """The user-facing :class:`PipelineError` behind ``e`` (itself, or one wrapped by Prefect's engine)."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, PipelineError):
        cause = cause.__cause__ or cause.__context__
    return cause

"""Prefect flow of the ``report`` stage (dvc.yaml: report, the last stage). Run: ``python -m flows.report``.

Builds data/report/index.html, publishes its summary as the markdown artifact ``report-summary`` and prints the
headline results (held-out accuracy per model) and the report's path: under ``dvc repro`` these are the run's
last lines. :func:`print_headline` prints the same lines at the end of ``python -m flows.pipeline``.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("report")

import argparse
import sys
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows._common import default_params, log_section, main, publish_metrics
from stages.core import paths
from stages.core.errors import PipelineError
from stages.schema.report import ReportParams


@flow(name="report")
def report_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Build the one-page report of the whole run and publish its summary (``python -m flows.report`` then prints
    the headline and the page's path)."""
    from stages import report

    p = ReportParams.from_file(params_path)
    log_section("report", p)
    metrics = report.run(p)
    publish_metrics("report", metrics)
    create_markdown_artifact(key="report-summary", markdown=paths.REPORT_SUMMARY.read_text(encoding="utf-8"),
                             description="The run's headline, the paper beside ours, the stages")
    return metrics


def print_headline(params_path: str = "params.yaml") -> None:
    """Print the headline results and the report's path (the end of ``python -m flows.pipeline``); a corrupt
    metrics file is one ``error:`` line on stderr instead."""
    from stages import report

    try:
        print("\n".join(report.console_lines(ReportParams.from_file(params_path))), flush=True)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)


def cli(argv: list[str] | None = None) -> int:
    """``python -m flows.report``: the flow (:func:`flows._common.main`), then the headline and the page's path,
    printed after the flow's own log lines so that they end ``dvc repro``'s output."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--params", default=default_params())
    known, _ = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    status = main(report_flow, "report", argv)
    if status == 0:
        print_headline(known.params)
    return status


if __name__ == "__main__":
    raise SystemExit(cli())

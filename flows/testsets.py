"""Prefect flow of the ``testsets`` stage (dvc.yaml: testsets@<name>).

Run: ``python -m flows.testsets --name NAME`` (``NAME`` is a key of ``testsets.datasets`` in params.yaml).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("testsets")

import argparse
from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages.schema.testsets import TestsetsParams


@flow(name="testsets")
def testsets_flow(params_path: str = "params.yaml", name: str = "") -> dict[str, Any]:
    """Convert one test set into pipeline rows (checked, with a report)."""
    from stages import testsets

    p = TestsetsParams.from_file(params_path)
    log_section("testsets", p)
    metrics = testsets.run(p, name)
    publish_metrics(f"testsets_{name}", metrics)
    return metrics


def _args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--name", required=True, metavar="NAME",
                    help="a key of testsets.datasets in the params file (dvc.yaml stage testsets@NAME)")


def cli(argv: list[str] | None = None) -> int:
    """``python -m flows.testsets --name NAME [--params FILE]``."""
    return main(testsets_flow, "testsets", argv, add_args=_args, address=lambda a: f"testsets@{a.name}")


if __name__ == "__main__":
    raise SystemExit(cli())

"""Prefect flow of the ``ingest`` stage (dvc.yaml: ingest@<name>).

Run: ``python -m flows.ingest --name NAME`` (``NAME`` is a key of ``ingest.datasets`` in params.yaml).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("ingest")

import argparse
from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages.schema.ingest import IngestParams


@flow(name="ingest")
def ingest_flow(params_path: str = "params.yaml", name: str = "") -> dict[str, Any]:
    """Ingest one SFT / RL data set: convert, check, decontaminate (with a report)."""
    from stages import ingest

    p = IngestParams.from_file(params_path)
    log_section("ingest", p)
    metrics = ingest.run(p, name)
    publish_metrics(f"ingest_{name}", metrics)
    return metrics


def _args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--name", required=True, metavar="NAME",
                    help="a key of ingest.datasets in the params file (dvc.yaml stage ingest@NAME)")


def cli(argv: list[str] | None = None) -> int:
    """``python -m flows.ingest --name NAME [--params FILE]``."""
    return main(ingest_flow, "ingest", argv, add_args=_args, address=lambda a: f"ingest@{a.name}")


if __name__ == "__main__":
    raise SystemExit(cli())

"""Prefect flow of the ``ingest`` stage (dvc.yaml: ingest@<name>).

Run: ``python -m flows.ingest --name NAME`` (``NAME`` is a key of ``ingest.datasets`` in params.yaml).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages import ingest
from stages.schema.ingest import IngestParams


@flow(name="ingest")
def ingest_flow(params_path: str = "params.yaml", name: str = "") -> dict[str, Any]:
    """Ingest one SFT / RL data set: convert, check, decontaminate (with a report)."""
    p = IngestParams.from_file(params_path)
    log_section("ingest", p)
    metrics = ingest.run(p, name)
    publish_metrics(f"ingest_{name}", metrics)
    return metrics


def cli(argv: list[str] | None = None) -> int:
    """``--name NAME`` picks the data set; every other argument goes to :func:`flows._common.main`."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--name", required=True, help="a key of ingest.datasets in params.yaml")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    return main(functools.partial(ingest_flow, name=args.name), "ingest", rest)


if __name__ == "__main__":
    raise SystemExit(cli())

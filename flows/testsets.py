"""Prefect flow of the ``testsets`` stage (dvc.yaml: testsets@<name>).

Run: ``python -m flows.testsets --name NAME`` (``NAME`` is a key of ``testsets.datasets`` in params.yaml).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages import testsets
from stages.schema.testsets import TestsetsParams


@flow(name="testsets")
def testsets_flow(params_path: str = "params.yaml", name: str = "") -> dict[str, Any]:
    """Convert one test set into pipeline rows (checked, with a report)."""
    p = TestsetsParams.from_file(params_path)
    log_section("testsets", p)
    metrics = testsets.run(p, name)
    publish_metrics(f"testsets_{name}", metrics)
    return metrics


def cli(argv: list[str] | None = None) -> int:
    """``--name NAME`` picks the data set; every other argument goes to :func:`flows._common.main`."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--name", required=True, help="a key of testsets.datasets in params.yaml")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    return main(functools.partial(testsets_flow, name=args.name), "testsets", rest)


if __name__ == "__main__":
    raise SystemExit(cli())

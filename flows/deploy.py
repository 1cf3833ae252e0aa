"""The pipeline as a Prefect deployment: ``python -m flows.deploy [--cron CRON] [STAGE ...]``.

It serves the deployment ``dvc-repro/dvc-repro`` (Prefect's ``flow.serve``) until stopped: a run of it, started
from the UI, by ``prefect deployment run``, on a schedule (``--cron``) or by a worker of a work pool (``prefect deploy
flows/deploy.py:dvc_repro``), runs ``python -m flows.pipeline [--only] [--params FILE] STAGE ...`` in the project. So
such a run goes through DVC as the command does (dvc.lock updated, the run-cache used, what is up to date skipped),
with the command's checks first (names, the whole params file, every stage's preflight) and its one-run-at-a-time
hold on the checkout; the pipeline's flow run reports to the same API, with its output in the deployment run's log.

Serving needs an API server that stays up (the commands' own servers stop when their runs end): the project's UI,
``PREFECT_HOME=$PWD/.prefect prefect server start``, with ``PREFECT_API_URL=http://127.0.0.1:4200/api`` exported.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: Prefect's settings before Prefect is imported (flows/_common.py)
    from flows._common import begin

    begin(None)

import argparse
import os
import subprocess
import sys

from prefect import flow, get_run_logger

from flows._common import PROJECT_ROOT

NAME = "dvc-repro"


@flow(name=NAME)
def dvc_repro(stages: list[str] | None = None, only: bool = False, params: str | None = None) -> None:
    """``python -m flows.pipeline [--only] [--params FILE] STAGE ...`` in the project (no stage: every stage)."""
    cmd = [sys.executable, "-m", "flows.pipeline", *(["--only"] if only else []),
           *(["--params", params] if params else []), *(stages or [])]
    logger = get_run_logger()
    logger.info("%s (in %s)", " ".join(cmd[1:]), PROJECT_ROOT)
    with subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            logger.info("%s", line.rstrip())
    if proc.returncode != 0:
        raise RuntimeError(f"python -m flows.pipeline exited with status {proc.returncode}; see the log above")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", metavar="STAGE", help="the stages a run runs by default (default: every stage)")
    ap.add_argument("--cron", help="a schedule, e.g. '0 3 * * *' (default: runs only when started)")
    args = ap.parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set: serving needs an API server that stays up; start one with "
              "`PREFECT_HOME=$PWD/.prefect prefect server start` and `export PREFECT_API_URL=http://127.0.0.1:4200/api`",
              file=sys.stderr)
        return 2
    dvc_repro.serve(name=NAME, cron=args.cron, parameters={"stages": args.stages}, tags=["dsm"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

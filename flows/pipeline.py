"""The whole pipeline as one Prefect flow: ``python -m flows.pipeline``.

Each dvc.yaml stage runs as its own Prefect task, in dvc.yaml order, through DVC's ``repro -s <stage>``
(called in this process: one DVC start-up for the whole run),
so DVC's bookkeeping (dvc.lock hashes of deps, params and outs, plus its run-cache) decides whether a
stage runs, is restored from the run-cache, or is skipped; Prefect never caches a path itself (a
Prefect cache could hand back a directory that DVC has deleted).

One Prefect API server is started for the whole run and handed to every stage's own flow process
through PREFECT_API_URL, so stages do not each pay the start-up of a temporary server. Likewise one stage
server (flows/_stage_server.py) imports the stage flows once and forks a process for every stage command
DVC runs, so stages do not each pay the imports of prefect, torch and transformers (``--no-stage-server``:
every stage imports them itself).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows._common import pipeline_error
from flows._stage_server import StageServer
from stages.core.errors import PipelineError
from stages.params import load_params


def stage_names() -> list[str]:
    """dvc.yaml's stages in file order (foreach stages expanded), as ``dvc stage list`` gives them."""
    from dvc.repo import Repo

    with Repo() as repo:
        return [stage.addressing for stage in repo.index.stages]


def classify(output: str) -> str:
    """What DVC did for a stage, from its log: ran, restored (run-cache) or skipped."""
    if "didn't change, skipping" in output:
        return "skipped"
    if "is cached - skipping run" in output:
        return "restored"
    return "ran"


class _Collect(logging.Handler):
    """Keeps DVC's log messages of one ``reproduce`` call (to classify what it did)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@task(name="stage", task_run_name="{name}")
def repro_stage(name: str, force: bool = False) -> dict[str, Any]:
    """Run one dvc.yaml stage through DVC (``dvc repro -s <name>``, in this process); return its status
    and wall time. DVC runs the stage's cmd as a subprocess whose output goes to this console."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    logger = get_run_logger()
    dvc_logger = logging.getLogger("dvc")
    handler, level, propagate = _Collect(), dvc_logger.level, dvc_logger.propagate
    dvc_logger.addHandler(handler)
    dvc_logger.setLevel(logging.INFO)
    # DVC prints its messages with its own console handler when it has one; Prefect's root handler would repeat them
    dvc_logger.propagate = not any(isinstance(h, logging.StreamHandler) for h in dvc_logger.handlers)
    t0 = time.perf_counter()
    try:
        with Repo() as repo:
            repo.scm_context.quiet = True  # no "git add dvc.lock" hint after every stage: main() prints one
            repo.reproduce(name, single_item=True, force=force)
    except DvcException as e:
        cause = e.__cause__ or e
        raise PipelineError(f"stage {name} failed (dvc repro -s {name}): {cause}; see its output above") from None
    finally:
        dvc_logger.removeHandler(handler)
        dvc_logger.setLevel(level)
        dvc_logger.propagate = propagate
    wall = time.perf_counter() - t0
    status = classify("\n".join(handler.lines))
    logger.info("%s: %s in %.1f s", name, status, wall)
    return {"stage": name, "status": status, "wall_s": round(wall, 2)}


@flow(name="pipeline")
def pipeline_flow(stages: list[str] | None = None, force: bool = False) -> list[dict[str, Any]]:
    """Every stage in order (or the given ones), each shown as ran, restored or skipped."""
    rows = []
    for name in stages or stage_names():
        rows.append(repro_stage(name, force=force))
    create_table_artifact(key="pipeline-stages", table=rows, description="What each stage did in this run")
    return rows


def _drain_prefect_workers(timeout_s: float = 15.0) -> None:
    """Send Prefect's queued logs and events while the API server is still up. Without this the
    interpreter's exit hooks retry them against the stopped server (measured: a 73 s hang at exit)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)


def main(argv: list[str] | None = None) -> int:
    """Validate params.yaml, start one Prefect API server, run the pipeline flow, print a summary."""
    ap = argparse.ArgumentParser(prog="python -m flows.pipeline", description="Run the DeepSeekMath pipeline (dvc.yaml) as a Prefect flow.")
    ap.add_argument("stages", nargs="*", help="only these stages (default: all, in dvc.yaml order)")
    ap.add_argument("--force", action="store_true", help="re-run the stages even when up to date")
    ap.add_argument("--no-stage-server", action="store_true",
                    help="let every stage process import its libraries itself (no fork server)")
    args = ap.parse_args(argv)
    try:
        load_params("params.yaml")  # a bad value fails here, before DVC deletes any output
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Stage commands (`python -m flows.<stage>`) must run in this interpreter's environment even when
    # it was called by path (.venv/bin/python -m flows.pipeline) without activating the venv.
    os.environ["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    t0 = time.perf_counter()
    server = stage_server = None
    try:
        names = args.stages or stage_names()
        modules = sorted({f"flows.{n.split('@')[0]}" for n in names})
        use_stage_server = not args.no_stage_server and hasattr(os, "fork")
        if "PREFECT_API_URL" not in os.environ:
            from prefect.server.api.server import SubprocessASGIServer

            server = SubprocessASGIServer()
            server.port = server.find_available_port()  # the URL is known before the start: the stage server needs it
            os.environ["PREFECT_API_URL"] = server.api_url  # inherited by every stage's process
        if use_stage_server:  # it imports the stages while the API server starts
            stage_server = StageServer(modules, os.environ["PREFECT_HOME"]).start()
        if server is not None:
            server.start()
            if server.api_url != os.environ["PREFECT_API_URL"]:  # the port was taken meanwhile: Prefect took another
                os.environ["PREFECT_API_URL"] = server.api_url
                if stage_server is not None:
                    stage_server.stop()
                    stage_server = StageServer(modules, os.environ["PREFECT_HOME"]).start()
        with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):
            rows = pipeline_flow(stages=names, force=args.force)
    except Exception as e:
        user_error = pipeline_error(e)
        if user_error is None:
            raise
        print(f"error: {user_error}", file=sys.stderr)
        return 1
    finally:
        if stage_server is not None:
            stage_server.stop()
            print(stage_server.summary())
        if server is not None:
            _drain_prefect_workers()
            server.stop()
    total = time.perf_counter() - t0
    print(f"{'stage':<24}{'status':<10}{'wall_s':>8}")
    for r in rows:
        print(f"{r['stage']:<24}{r['status']:<10}{r['wall_s']:>8.1f}")
    print(f"{'total':<34}{total:>8.1f}")
    if any(r["status"] != "skipped" for r in rows):
        print("to record this run in git: git add dvc.lock data/.gitignore && git commit (`dvc push` shares the outputs)")
    from flows.report import print_headline  # last: held-out accuracy per model and the report's path

    print_headline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What every stage flow shares: the command line, checks before work, the servers, logging and the summary artifact.

A stage flow is ``@flow def <stage>_flow(params_path) -> dict``: it loads its own section
(``<Section>.from_file``, runtime values merged in), logs it, calls ``stages.<stage>.run(section)`` (training
stages: through flows/_launch.py, which may start ranks), and publishes the returned metrics as a Prefect table
artifact. Before the flow starts, :func:`main` installs the interrupt handler (flows/_process.py), removes what
a killed earlier run left behind, validates the whole params file (stages/params.py) and runs every check that
needs no stage computation (stages/preflight.py), so bad input fails in one line before Prefect starts and before
any output is touched; then it finds or starts the project's Prefect API server (flows/_servers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from stages.core.errors import PipelineError
from stages.schema.base import Section


def log_section(section: str, p: Section) -> None:
    """Log one params section (its runtime values included) in the current run's logger; remember the run (an
    interrupt marks it cancelled)."""
    from flows._process import record_run

    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run

        record_run("flow_runs", flow_run.id)
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


class _OneLineUserErrors(logging.Filter):
    """Prefect logs a failing run's exception with its traceback; for bad input (a PipelineError) the one line says
    it all, so the record keeps that line and drops the traceback (other exceptions keep theirs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        user = pipeline_error(exc) if exc is not None else None
        if user is not None:
            record.msg, record.args = "%s", (f"bad input: {user}",)
            record.exc_info = record.exc_text = None
        return True


def quiet_user_errors() -> None:
    """Install :class:`_OneLineUserErrors` on Prefect's flow- and task-run loggers (once)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _OneLineUserErrors) for f in lg.filters):
            lg.addFilter(_OneLineUserErrors())


def under_dvc() -> str | None:
    """The dvc.yaml stage this command runs as under ``dvc repro`` / the pipeline (DVC sets DVC_STAGE), else None."""
    return os.environ.get("DVC_STAGE") or None


def restore_hint(stage: str) -> str:
    """What to do about the outputs after a stage command failed or was interrupted."""
    from flows import _dvc

    dvc_stage = under_dvc()
    if dvc_stage is None:
        return (f"{stage}: its outputs are unchanged (every output is written atomically); "
                f"`python -m flows.{stage.split('@')[0]}` runs it again")
    if _dvc.locked(dvc_stage):
        small = _dvc.git_outputs(dvc_stage)
        git = f" and `git checkout -- {' '.join(small)}` its metrics and plots" if small else ""
        return (f"DVC removed {dvc_stage}'s outputs before running it: `dvc checkout {dvc_stage}` restores the last "
                f"recorded ones{git}; `dvc repro {dvc_stage}` runs it again (training resumes from its last checkpoint)")
    return f"{dvc_stage} has no recorded outputs yet; `dvc repro {dvc_stage}` runs it again"


def parser(stage: str, flow_fn: Any, add_args: Callable[[argparse.ArgumentParser], None] | None = None
           ) -> argparse.ArgumentParser:
    """The command line of ``python -m flows.<stage>`` (its --help names the real command and dvc.yaml stage)."""
    doc = (getattr(flow_fn, "description", None) or getattr(flow_fn, "__doc__", None) or "").strip()
    ap = argparse.ArgumentParser(
        prog=f"python -m flows.{stage}", description=f"Run the {stage} stage as a Prefect flow. {doc}",
        epilog=f"This is the command of the dvc.yaml stage '{stage}' (foreach stages: '{stage}@<key>'): "
               f"`dvc repro {stage}` runs it with its upstream stages and DVC's bookkeeping, `python -m flows.pipeline "
               f"{stage}` does so as one Prefect flow. Bad input is reported in one line (exit status 2) before any "
               "work; Ctrl-C stops it within seconds (exit status 130).")
    ap.add_argument("--params", default="params.yaml", metavar="FILE", help="params file (default: params.yaml)")
    if add_args is not None:
        add_args(ap)
    return ap


def main(flow_fn: Callable[..., Any], stage: str, argv: list[str] | None = None, *,
         add_args: Callable[[argparse.ArgumentParser], None] | None = None,
         address: Callable[[argparse.Namespace], str] | None = None) -> int:
    """Command-line entry of ``python -m flows.<stage>``.

    ``add_args`` adds stage options (``--model`` of evaluate); their values are passed to ``flow_fn`` as keyword
    arguments. ``address(args)``: the dvc.yaml address of this run (``evaluate@sft``) for the checks. Params are
    validated and checked *before* Prefect starts, so bad input costs no start-up time and prints one line
    (``error: params.yaml: <key>: ...``) with exit status 2 instead of a traceback; under DVC the line also says
    how to restore the outputs DVC removed. The same one-line treatment applies to any :class:`PipelineError`
    raised by the stage.
    """
    from flows import _process, _servers
    from stages import preflight
    from stages.core import io
    from stages.params import load_params  # validation only: the whole file, before any work

    ap = parser(stage, flow_fn, add_args)
    args = ap.parse_args(argv)
    extra = {k: v for k, v in vars(args).items() if k != "params"}
    where = address(args) if address is not None else stage
    _process.install_interrupt_handler(f"stage {under_dvc() or where}", hint=lambda: restore_hint(where))
    forked = bool(os.environ.get("DSM_CLIENT_PID"))  # run by the stage server for its client process
    if under_dvc() and not forked:
        _process.watch_parent()
    if under_dvc() and not os.environ.get("PREFECT_API_URL"):  # plain dvc repro: an interrupt ends the run
        _process.after_stop(lambda: _servers.stop_servers_of(
            _servers.owner_of(int(os.environ.get("DSM_CLIENT_PID", os.getpid())))))
    try:
        left = io.remove_stale_temporaries()
        if left:
            print(f"removed {len(left)} temporary path(s) left by a killed earlier run: {', '.join(left[:3])}"
                  + (" ..." if len(left) > 3 else ""), file=sys.stderr)
        params = load_params(args.params)
        preflight.check(params, [where])
        quiet_user_errors()
        url = _servers.api_url()
        if under_dvc() and not forked and hasattr(os, "fork") and not (
                os.environ.get("DSM_STAGE_SERVER") or os.environ.get("DSM_NO_STAGE_SERVER")):
            _start_stage_server()
        from prefect.settings import PREFECT_API_URL, temporary_settings

        os.environ["PREFECT_API_URL"] = url  # for the processes this stage starts (ranks)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            flow_fn(params_path=args.params, **extra)
    except Exception as e:
        user_error = pipeline_error(e)
        if user_error is None:
            raise
        msg = f"error: {user_error}"
        if under_dvc():
            msg += f" [{restore_hint(where)}]"
        print(msg, file=sys.stderr)
        return 2
    return 0


def _start_stage_server() -> None:
    """Under a plain ``dvc repro``: start the project's stage server for the stage commands that follow."""
    import flows
    from flows import _dvc, _servers

    try:
        modules = sorted({s.module for s in _dvc.stages() if s.module and s.module.startswith("flows.")})
    except (OSError, ValueError):
        return
    _servers.ensure_stage_server(modules, flows.ORIGINAL_ENV)


def pipeline_error(e: BaseException) -> PipelineError | None:
    """The user-facing :class:`PipelineError` behind ``e`` (itself, or one wrapped by Prefect's engine)."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, PipelineError):
        cause = cause.__cause__ or cause.__context__
    return cause

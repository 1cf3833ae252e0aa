"""What every stage flow shares: the command line, checks before work, the servers, logging and the summary artifact.

A stage flow is ``@flow def <stage>_flow(params_path) -> dict``: it loads its own section
(``<Section>.from_file``, runtime values merged in), logs it, calls ``stages.<stage>.run(section)`` (training
stages: through flows/_launch.py, which may start ranks), and publishes the returned metrics as a Prefect table
artifact. A command (``python -m flows.<stage>``) calls :func:`begin` before anything else is imported: under
``python -m flows.pipeline`` the pipeline's stage server takes the command there (flows/_stage_server.py), else it
sets Prefect's settings (:func:`prefect_environment`). Then :func:`main` installs the interrupt handler
(flows/_process.py), removes what a killed earlier run left behind, validates the whole params file
(stages/params.py) and runs every check that needs no stage computation (stages/preflight.py), so bad input fails
in one line before Prefect starts and before any output is touched; then it finds or starts the project's Prefect
API server (flows/_servers.py).

Nothing here changes what a stage computes: dvc.yaml does not list this file as a code dep
(tests/flows/test_dvc_yaml.py, ``LAUNCHER_ONLY``). The one setting :func:`begin` makes that does (MKL's strict
reproducibility mode) takes its value from stages/core/threads.py, which is a code dep.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError
from stages.schema.base import Section

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PARAMS_ENV = "DSM_PARAMS"
"""The params file a stage command reads when not given ``--params``: set by ``python -m flows.pipeline --params FILE``
for its stage commands (else params.yaml)."""
UI_URL = "http://127.0.0.1:4200"
"""Where ``prefect server start`` serves its UI (README: seeing past runs)."""


def project_home(root: Path = PROJECT_ROOT) -> Path:
    """The checkout whose ``.prefect`` holds the runs: ``root``, or, for a DVC experiment run in a temporary copy
    (under ``<project>/.dvc/tmp/exps/``: ``dvc exp run --temp``, ``dvc queue start``), the project it copies, so
    that its runs are in the project's Prefect history and its logged links open there."""
    return next((up.parents[2] for up in root.parents if up.name == "exps" and up.parent.match(".dvc/tmp")), root)


def prefect_environment(environ: dict[str, str] | os._Environ[str] | None = None) -> dict[str, str]:
    """The Prefect settings of the project's commands, each unless already set: the state in ``.prefect/`` inside
    the project (never ``~/.prefect``), no telemetry, no UI build in the API servers the commands start, a patient
    start-up; and, when no ``PREFECT_API_URL`` is set, the run links Prefect logs pointing at the UI of
    ``prefect server start`` run with the same ``PREFECT_HOME`` (README), where they open once it runs.
    Returns the variables to set (:func:`begin` sets them)."""
    env = os.environ if environ is None else environ
    want = {"PREFECT_HOME": str(project_home() / ".prefect"), "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
    if not env.get("PREFECT_API_URL"):
        want["PREFECT_UI_URL"] = UI_URL
    return {k: v for k, v in want.items() if k not in env}


def _gpu_visible() -> bool:
    """Whether a CUDA / ROCm device may be visible to torch (device nodes present and not hidden), without
    importing torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def begin(stage: str | None) -> None:
    """What a command does first, before Prefect or the stages are imported (called under ``if __name__ ==
    "__main__"`` at the top of each flow module, and by the pipeline):

    1. ``stage`` given and the pipeline's stage server named in ``DSM_STAGE_SERVER``: the command runs there, in a
       fork of a process that has imported the stages (flows/_stage_server.py), and this process exits with its
       status; when there is none or it refuses, the command goes on here;
    2. Prefect's settings (:func:`prefect_environment`) for this process and the ones it starts;
    3. ``DS_ACCELERATOR=cpu`` when no GPU device is visible: transformers imports DeepSpeed (when installed) in every
       process that saves or loads a model, and DeepSpeed would warn in each that it falls back to the CPU.

    Before all of these, ``MKL_CBWR`` (unless set): MKL's strict reproducibility mode, read by MKL at its first call,
    so that float32 CPU products give the same bits at any thread count (stages.core.threads.MKL_CBWR; it changes
    what stages compute, which is why its value lives there, a code dependency of every stage)."""
    from stages.core.threads import MKL_CBWR

    os.environ.setdefault("MKL_CBWR", MKL_CBWR)
    if stage is not None:
        from flows._stage_server import forward

        forward(f"flows.{stage}", sys.argv[1:])
    os.environ.update(prefect_environment())
    if "DS_ACCELERATOR" not in os.environ and not _gpu_visible():
        os.environ["DS_ACCELERATOR"] = "cpu"


def log_section(section: str, p: Section) -> None:
    """Record the params section the stage runs with (its runtime values included) where it can be read: the file
    ``.prefect/params/<section>.yaml`` and the run's markdown artifact ``<section>-params``, with one log line
    naming them (not the whole section on one line); remember the run (an interrupt marks it cancelled)."""
    import yaml
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact

    from flows._process import record_run

    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run

        record_run("flow_runs", flow_run.id)
    text = yaml.safe_dump({section: p.model_dump(mode="json")}, sort_keys=False, width=110)
    where = Path(os.environ.get("PREFECT_HOME", PROJECT_ROOT / ".prefect")) / "params" / f"{section}.yaml"
    with contextlib.suppress(OSError):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(text, encoding="utf-8")
    with contextlib.suppress(Exception):
        create_markdown_artifact(key=f"{section.replace('_', '-')}-params", markdown=f"```yaml\n{text}```",
                                 description=f"params.{section} as the stage ran it (runtime values included)")
    n = sum(1 for line in text.splitlines() if line.strip() and not line.rstrip().endswith(":"))
    shown = os.path.relpath(where) if where.is_relative_to(Path.cwd()) else str(where)
    get_run_logger().info("params.%s: %d values, as run in %s (and the artifact %s-params)", section, n, shown,
                          section.replace("_", "-"))


def write_record(params: Any, address: str) -> None:
    """data/params/<stage>.yaml (an output of the stage): the values the stage at ``address`` ran with, resolved
    (``stages.params.record``), written when it succeeded."""
    import yaml

    from stages.core import io, paths
    from stages.params import record

    io.write_text(paths.PARAMS / f"{address.replace('@', '_')}.yaml",
                  yaml.safe_dump(record(params, address), sort_keys=False, width=110))


def publish_metrics(stage: str, metrics: dict[str, Any]) -> None:
    """Publish a stage's metrics as a markdown table artifact (key ``<stage>-metrics``)."""
    from prefect.artifacts import create_markdown_artifact

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
    """Prefect logs a failing run's exception with its traceback; for bad input (a PipelineError) and for a run that
    failed for a known reason (a RunFailed: a stage killed, a server gone) the one line says it all, so the record
    keeps that line and drops the traceback (other exceptions keep theirs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from flows._process import RunFailed

        exc = record.exc_info[1] if record.exc_info else None
        user = pipeline_error(exc) if exc is not None else None
        if user is not None or isinstance(exc, RunFailed):
            record.msg, record.args = "%s", (f"bad input: {user}" if user is not None else f"failed: {exc}",)
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


def run_tags(where: str) -> list[str]:
    """The Prefect tags of a stage's flow run, to find it in the UI (``prefect flow-run ls --tag``): its DVC stage
    address (``dvc:evaluate@sft``; the command's own when not run by DVC) and, in a DVC experiment, its name
    (``exp:<name>``, from DVC_EXP_NAME)."""
    exp = os.environ.get("DVC_EXP_NAME")
    return [f"dvc:{under_dvc() or where}", *([f"exp:{exp}"] if exp else [])]


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


def default_params() -> str:
    """The params file of a stage command without ``--params``: ``$DSM_PARAMS`` (:data:`PARAMS_ENV`), else
    params.yaml."""
    return os.environ.get(PARAMS_ENV) or "params.yaml"


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
    ap.add_argument("--params", default=default_params(), metavar="FILE",
                    help=f"params file (default: params.yaml, or ${PARAMS_ENV} when set)")
    if add_args is not None:
        add_args(ap)
    return ap


def _on_interrupt(where: str) -> None:
    """What an interrupt of stage command ``where`` does: it is reported with the restore hint; under DVC the stage
    also stops when its parent goes (not when forked by the stage server); under a plain ``dvc repro`` it ends the
    run's servers, and run by hand the API server it uses unless another process holds a lease on it."""
    from flows import _process, _servers

    _process.install_interrupt_handler(f"stage {under_dvc() or where}", hint=lambda: restore_hint(where))
    forked = bool(os.environ.get("DSM_CLIENT_PID"))  # run by the stage server for its client process
    if under_dvc() and not forked:
        _process.watch_parent()
    if under_dvc() and not os.environ.get("PREFECT_API_URL"):  # plain dvc repro: an interrupt ends the run
        _process.after_stop(lambda: _servers.stop_servers_of(
            _servers.owner_of(int(os.environ.get("DSM_CLIENT_PID", os.getpid())))))
    elif not os.environ.get("PREFECT_API_URL"):  # by hand: its lease goes, and the server unless another holds it
        _process.after_stop(lambda: (_servers.release_lease(), _servers.stop_servers_of(os.getpid())))


def main(flow_fn: Callable[..., Any], stage: str, argv: list[str] | None = None, *,
         add_args: Callable[[argparse.ArgumentParser], None] | None = None,
         address: Callable[[argparse.Namespace], str] | None = None) -> int:
    """Command-line entry of ``python -m flows.<stage>`` (after :func:`begin`).

    ``add_args`` adds stage options (``--model`` of evaluate); their values are passed to ``flow_fn`` as keyword
    arguments. ``address(args)``: the dvc.yaml address of this run (``evaluate@sft``) for the checks. Params are
    validated and checked *before* Prefect starts, so bad input costs no start-up time and prints one line
    (``error: params.yaml: <key>: ...``) with exit status 2 instead of a traceback; under DVC the line also says
    how to restore the outputs DVC removed. The same one-line treatment applies to any :class:`PipelineError`
    raised by the stage.
    """
    ap = parser(stage, flow_fn, add_args)
    args = ap.parse_args(argv)
    from flows import _process, _servers
    from stages import preflight
    from stages.core import io
    from stages.params import load_params  # validation only: the whole file, before any work

    extra = {k: v for k, v in vars(args).items() if k != "params"}
    where = address(args) if address is not None else stage
    _on_interrupt(where)
    unwatch: Callable[[], None] = lambda: None  # noqa: E731
    held = None
    try:
        # one run of the project at a time: by hand it waits for the run holding it; under a plain dvc repro it is
        # refused (it holds DVC's locks meanwhile); under the pipeline it runs inside the pipeline's hold
        held = _process.hold_run_lock(f"stage {where}", wait=not under_dvc())
        left = io.remove_stale_temporaries()
        if left:
            print(f"removed {len(left)} temporary path(s) left by a killed earlier run: {', '.join(left[:3])}"
                  + (" ..." if len(left) > 3 else ""), file=sys.stderr)
        params = load_params(args.params)
        preflight.check(params, [where])
        quiet_user_errors()
        url = _servers.api_url()
        unwatch = _process.watch(_servers.api_gone, lambda why: _process.fail(f"{why}; the stage reported to it"))
        from prefect.settings import temporary_settings

        os.environ["PREFECT_API_URL"] = url  # for the processes this stage starts (ranks)
        from prefect import tags

        with temporary_settings(updates=_servers.settings_updates(url)), tags(*run_tags(where)):
            flow_fn(params_path=args.params, **extra)
        write_record(params, where)
    except Exception as e:
        user_error = pipeline_error(e)
        if user_error is None:
            raise
        msg = f"error: {user_error}"
        if under_dvc():
            msg += f" [{restore_hint(where)}]"
        print(msg, file=sys.stderr)
        return 2
    finally:
        unwatch()
        if held is not None:
            held.close()
    return 0


def pipeline_error(e: BaseException) -> PipelineError | None:
    """The user-facing :class:`PipelineError` behind ``e`` (itself, or one wrapped by Prefect's engine)."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, PipelineError):
        cause = cause.__cause__ or cause.__context__
    return cause

"""The whole pipeline as one Prefect flow: ``python -m flows.pipeline [STAGE ...]``.

Each dvc.yaml stage runs as its own Prefect task, in dependency order, through DVC's ``repro -s <stage>``
(called in this process: one DVC start-up for the whole run), so DVC's bookkeeping (dvc.lock hashes of deps,
params and outs, plus its run-cache) decides whether a stage runs, is restored from the run-cache, or is skipped;
Prefect never caches a path itself (a Prefect cache could hand back a directory that DVC has deleted).
Named stages run with the stages they depend on, as ``dvc repro <stage>`` would (``--only``: just those).

Before anything starts, the stage names are checked against dvc.yaml, the params file is validated and every
stage's checks that need no computation run (stages/preflight.py), each stage's inputs that an earlier stage of
the run writes excepted (of the stages not up to date: ``dvc status`` and what is downstream), so bad input fails in one
line before any output is removed. Stages that DVC would skip or
restore from its run-cache are done first, in order, without Prefect (:func:`without_servers`); from the first stage
whose command runs, one Prefect API server (flows/_servers.py) serves every stage's flow process, and one stage server (flows/_stage_server.py)
imports the stage flows once and forks a process for every stage command DVC runs (``--no-stage-server``: every
stage imports them itself). A Ctrl-C (or SIGTERM) stops the run within seconds, the running stage and both
servers included (flows/_process.py), and says how to resume.

One run at a time per checkout: the run holds the project (``.dvc/tmp/dsm-run.lock``, flows/_process.py) from its
first check to its end, so a second pipeline run, or a stage command run by hand, waits for it with one line saying
which process it waits for, and a stage command of a plain ``dvc repro`` is refused in one line. ``--params FILE`` never touches params.yaml: DVC, in this process, reads FILE where it reads
params.yaml, and the stage commands get FILE (``DSM_PARAMS``). A server the run needs that dies (kill -9, the
out-of-memory killer) fails the run within seconds, named as what it was; a stage that fails is reported as how it
ended (bad input, a crash, a signal, the out-of-memory killer), and what it left running is stopped.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: Prefect's settings before Prefect is imported (flows/_common.py)
    from flows._common import begin

    begin(None)

import argparse
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from flows import _dvc, _process, _servers
from flows._common import PARAMS_ENV, pipeline_error, quiet_user_errors
from flows._process import RunFailed
from flows._stage_server import StageServer
from stages.core.errors import PipelineError

_run: dict[str, Any] = {"current": None, "done": [], "gone": None}
"""The run's state: the stage running, the rows of those done, and a function that names a server of the run that
is gone (None while they serve)."""


def stage_names() -> list[str]:
    """dvc.yaml's stages in file order (foreach stages expanded), as ``dvc stage list`` gives them."""
    from dvc.repo import Repo

    with Repo() as repo:
        return [stage.addressing for stage in repo.index.stages]


def plan(names: list[str], only: bool = False) -> list[str]:
    """The stages to run for ``names`` (every stage when empty): with their upstream stages unless ``only``, in
    dependency order (dvc.yaml order among independent stages)."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo() as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        order = [s.addressing for s in repo.index.stages]
        by_name = {s.addressing: s for s in repo.index.stages}
        chosen = set(names or order)
        if not only:
            for n in list(chosen):
                chosen |= {s.addressing for s in nx.descendants(graph, by_name[n])}
        sub = graph.subgraph([by_name[n] for n in chosen]).reverse()
        return [s.addressing for s in nx.lexicographical_topological_sort(sub, key=lambda s: order.index(s.addressing))]


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


def _reproduce(name: str, force: bool) -> None:
    from dvc.repo import Repo

    with Repo() as repo:
        repo.scm_context.quiet = True  # no "git add dvc.lock" hint after every stage: main() prints one
        repo.reproduce(name, single_item=True, force=force)


def _stage_failure(name: str, e: BaseException, oom_before: int | None) -> Exception:
    """What a stage's failure was, for the one line the user reads: a server of the run gone, the stage command's bad
    input (exit status 2: its own error line says what), or a crash or signal (never called bad input)."""
    cause = e.__cause__ or e
    gone = _run["gone"]() if _run["gone"] is not None else None
    if gone is not None:
        return RunFailed(f"{gone} while stage {name} ran; the stage was stopped")
    m = re.search(r"failed to run: .*, exited with (-?\d+)$", str(cause))
    status = int(m[1]) if m else None
    if status is None or status == 2:  # DVC's own checks (a missing dependency ...) and the stage's bad input
        return PipelineError(f"stage {name} failed (dvc repro -s {name}): {cause}; see its output above")
    return RunFailed(f"stage {name} {_process.how_it_ended(status, oom_before)} (dvc repro -s {name}: {cause}); see "
                     "its output above")


@task(name="stage", task_run_name="{name}")
def repro_stage(name: str, force: bool = False) -> dict[str, Any]:
    """:func:`repro` as a task of the pipeline flow."""
    from prefect.runtime import task_run

    _process.record_run("task_runs", task_run.id)
    return repro(name, force, get_run_logger())


def repro(name: str, force: bool, logger: logging.Logger | logging.LoggerAdapter) -> dict[str, Any]:
    """Run one dvc.yaml stage through DVC (``dvc repro -s <name>``, in this process); return its status
    and wall time. DVC runs the stage's cmd as a subprocess whose output goes to this console. DVC works in a
    thread of its own, so this (main) thread stays free to handle Ctrl-C / SIGTERM at once."""
    from dvc.exceptions import DvcException

    _run["current"] = name
    dvc_logger = logging.getLogger("dvc")
    handler, level, propagate = _Collect(), dvc_logger.level, dvc_logger.propagate
    dvc_logger.addHandler(handler)
    dvc_logger.setLevel(logging.INFO)
    # DVC prints its messages with its own console handler when it has one; Prefect's root handler would repeat them
    dvc_logger.propagate = not any(isinstance(h, logging.StreamHandler) for h in dvc_logger.handlers)
    t0 = time.perf_counter()
    oom_before = _process.oom_kills()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            _reproduce(name, force)
        except BaseException as e:  # noqa: BLE001 - handed to the task below
            failure.append(e)

    try:
        worker = threading.Thread(target=work, name=f"dvc-repro-{name}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
    finally:
        dvc_logger.removeHandler(handler)
        dvc_logger.setLevel(level)
        dvc_logger.propagate = propagate
        left = _process.stop_leftovers()  # orphans the stage left (it was killed, or forgot them)
        if left:
            logger.warning("stage %s left %d process(es) running after it ended; stopped them: %s", name, len(left),
                           "; ".join(left[:4]))
        if failure:  # a stage killed with SIGKILL could not remove its temporary paths
            from stages.core import io

            io.remove_stale_temporaries()
    if failure:
        e = failure[0]
        if isinstance(e, DvcException):
            raise _stage_failure(name, e, oom_before) from None
        raise e
    wall = time.perf_counter() - t0
    status = classify("\n".join(handler.lines))
    logger.info("%s: %s in %.1f s", name, status, wall)
    row = {"stage": name, "status": status, "wall_s": round(wall, 2)}
    _run["done"].append(row)
    _run["current"] = None
    return row


@flow(name="pipeline")
def pipeline_flow(stages: list[str] | None = None, force: bool = False) -> list[dict[str, Any]]:
    """Every stage in order (or the given ones), each shown as ran, restored or skipped."""
    from prefect.runtime import flow_run

    _process.record_run("flow_runs", flow_run.id)
    rows = []
    for name in stages or stage_names():
        rows.append(repro_stage(name, force=force))
    create_table_artifact(key="pipeline-stages", table=rows, description="What each stage did in this run")
    return rows


def _drain_prefect_workers(timeout_s: float = 15.0) -> None:
    """Send Prefect's queued logs and events while the API server is still up. Without this the
    interpreter's exit hooks retry them against the stopped server, and the process hangs at exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)


def _stage_table(known: list[_dvc.StageInfo]) -> str:
    width = max((len(s.name) for s in known), default=10) + 2
    lines = [f"  {s.name:<{width}}{s.desc}" for s in known]
    return "stages (dvc.yaml, in order):\n" + "\n".join(lines)


def build_parser(known: list[_dvc.StageInfo]) -> argparse.ArgumentParser:
    """The command line (its --help lists the stages of dvc.yaml)."""
    ap = argparse.ArgumentParser(
        prog="python -m flows.pipeline", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the DeepSeekMath pipeline (dvc.yaml) as one Prefect flow: each stage through DVC, which "
                    "skips what is up to date.",
        epilog=_stage_table(known) + "\n\nexamples:\n"
               "  python -m flows.pipeline                     # every stage (what is up to date is skipped)\n"
               "  python -m flows.pipeline sft                 # sft and the stages it depends on\n"
               "  python -m flows.pipeline --only grpo evaluate@grpo   # just these two\n"
               "  python -m flows.pipeline --params params/deepseekmath-7b.yaml\n"
               "Ctrl-C stops the run within seconds; the summary says how to resume.")
    ap.add_argument("stages", nargs="*", metavar="STAGE",
                    help="run these stages and the stages they depend on (default: every stage); a foreach group "
                         "(evaluate) means each of its stages")
    ap.add_argument("--only", action="store_true", help="run only the named stages, not their upstream stages")
    ap.add_argument("--params", metavar="FILE",
                    help="run with FILE's values (validated first): DVC reads params.yaml, so FILE takes its place "
                         "for the run and params.yaml is put back when the run ends; dvc.lock records FILE's values")
    ap.add_argument("--force", action="store_true", help="re-run the stages even when up to date")
    ap.add_argument("--no-stage-server", action="store_true",
                    help="let every stage process import its libraries itself (no fork server)")
    return ap


def git_hint(known: list[_dvc.StageInfo]) -> str | None:
    """``git add ... && git commit`` for what a run changed among the paths git must record (:func:`_dvc.git_recorded`:
    dvc.lock, the metrics and plots DVC does not cache) and .gitignore files DVC edited, or None when git has nothing
    new."""
    recorded = _dvc.git_recorded(known)
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *recorded,
                              ":(glob)**/.gitignore"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    changed = {line[3:].strip().strip('"') for line in out.stdout.splitlines() if line.strip()}
    def under(c: str, p: str) -> bool:
        return c == p or c.startswith(p + "/")
    shown = [p for p in recorded if any(under(c, p) for c in changed)]
    shown += sorted(c for c in changed if c.endswith(".gitignore") and not any(under(c, p) for p in recorded))
    if not shown:
        return None
    return (f"to record this run in git: git add {' '.join(shown)} && git commit -m 'pipeline run' (`dvc push` shares "
            "the outputs, with --run-cache the run-cache: docs/pipeline.md#sharing-results-through-a-dvc-remote)")


def _resume_hint() -> str:
    current, done = _run["current"], _run["done"]
    ran = f"{len(done)} stage(s) finished and are recorded in dvc.lock; " if done else ""
    if current is None:
        return f"{ran}`python -m flows.pipeline` resumes (what is up to date is skipped)"
    restore = (f"`dvc checkout {current}` restores its last recorded outputs, " if _dvc.locked(current) else "")
    return (f"{ran}stage {current} was interrupted and DVC had removed its outputs: {restore}`python -m flows.pipeline` "
            "resumes (finished stages are skipped; training resumes from its last checkpoint)")


def stale(selected: list[str]) -> set[str]:
    """The stages of ``selected`` that DVC would not skip as things stand: each whose deps, params or outputs changed
    (``dvc status``) and every stage downstream of one."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo() as repo, repo.lock:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        changed = [s for s in repo.index.stages if s.addressing in selected and s.changed()]
        return set(selected) & {s.addressing for c in changed for s in (c, *nx.ancestors(graph, c))}


def dvc_would(name: str) -> str:
    """What ``dvc repro -s <name>`` would do now: ``skipped`` (deps, params and outputs unchanged), ``restored`` (an
    entry of its run-cache holds outputs for these deps and params) or ``ran`` (its command runs). The decision is
    DVC's ``StageCache.restore`` (dvc/stage/cache.py) without its checkout: the stage's own dvc.lock record when only
    its outputs changed, else the run-cache's entry for the current hashes of its deps and params."""
    from dvc.repo import Repo
    from dvc.stage.cache import RunCacheNotFoundError, _can_hash

    with Repo() as repo, repo.lock:
        stage = next(s for s in repo.index.stages if s.addressing == name)
        if not stage.changed():
            return "skipped"
        cache = repo.stage_cache
        if not stage.changed_stage() and stage.deps_cached() and all(o.hash_info for o in stage.outs):
            try:
                cache.restore(stage, dry=True)
            except RunCacheNotFoundError:
                return "ran"
            return "restored"
        if not _can_hash(stage):
            return "ran"
        stage.save_deps()  # in memory: the run-cache key is the hashes of the deps and params now
        entry = cache._load(stage)
        return "restored" if entry and cache._create_stage(entry, wdir=stage.wdir).outs_cached() else "ran"


def without_servers(selected: list[str], todo: set[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Do, in order, what needs no stage command (skips, and run-cache restores of the stages in ``todo``, those not
    up to date) up to the first stage whose command runs; return their rows and the stages left (from that one on),
    for the flow and its servers."""
    rows: list[dict[str, Any]] = []
    for i, name in enumerate(selected):
        what = dvc_would(name) if name in todo else "skipped"
        if what == "ran":
            return rows, selected[i:]
        rows.append(repro(name, False, logging.getLogger(__name__)) if what == "restored"
                    else {"stage": name, "status": "skipped", "wall_s": 0.0})
        if what == "restored":
            _say(f"{name}: restored from the run-cache in {rows[-1]['wall_s']:.1f} s")
    return rows, []


@contextlib.contextmanager
def project(params_file: str | None) -> Iterator[None]:
    """The run's hold on the project, from its first check to its end (:func:`_process.hold_run_lock`: while another
    run holds it, one line says which and this one waits), with DVC reading ``params_file`` wherever it reads
    params.yaml (None: params.yaml itself)."""
    held = _process.hold_run_lock("pipeline")
    os.environ[_process.RUN_ENV] = str(os.getpid())  # its stage commands run inside this hold
    try:
        with _dvc_reads(Path(params_file), Path("params.yaml")) if params_file else contextlib.nullcontext():
            yield
    finally:
        os.environ.pop(_process.RUN_ENV, None)
        if held is not None:
            held.close()


@contextlib.contextmanager
def _dvc_reads(params_file: Path, params_yaml: Path) -> Iterator[None]:
    """DVC, in this process, reads ``params_file`` wherever it reads ``params_yaml`` (the stages' ``params:`` values,
    ``foreach`` lists), through the loader it picks by suffix (``dvc.utils.serialize.LOADERS``, whose ``.yaml`` entry
    is its default); dvc.lock records the values under params.yaml, as for any run."""
    from dvc.utils import serialize

    target = os.path.abspath(params_yaml)
    original = serialize.LOADERS[".yaml"]

    def load(path: str, fs: Any = None, **kwargs: Any) -> Any:
        if os.path.abspath(path) == target:
            path = str(params_file)
        return original(path, fs=fs, **kwargs)

    serialize.LOADERS[".yaml"] = load
    try:
        yield
    finally:
        serialize.LOADERS[".yaml"] = original


def _say(msg: str) -> None:
    print(f"pipeline: {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Check names, params and inputs; start the servers; run the pipeline flow; print a summary."""
    try:
        known = _dvc.stages()
    except OSError as e:
        print(f"error: dvc.yaml: {e.strerror}; run from the project root", file=sys.stderr)
        return 2
    except ValueError as e:  # yaml.YAMLError
        print(f"error: dvc.yaml is not valid YAML ({str(e).splitlines()[0]}); fix it (dvc stage list shows where)",
              file=sys.stderr)
        return 2
    args = build_parser(known).parse_args(argv)
    params_file = None  # None: params.yaml
    if args.params:
        if not Path(args.params).is_file():
            print(f"error: --params {args.params}: file not found; give an existing params file (e.g. "
                  "params/deepseekmath-7b.yaml)", file=sys.stderr)
            return 2
        if Path(args.params).resolve() != Path("params.yaml").resolve():
            params_file = str(Path(args.params).resolve())
    try:
        names = _dvc.resolve(args.stages, _dvc.stages(params_file=params_file or "params.yaml"))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _say(f"{'every stage' if not names else ', '.join(names)}{'' if args.only or not names else ' and its upstream stages'}"
         f" of dvc.yaml: checking {args.params or 'params.yaml'} and the inputs")
    from stages import preflight
    from stages.core import io
    from stages.params import load_params

    _process.install_interrupt_handler("the pipeline", hint=_resume_hint)
    _process.adopt_orphans()
    # Stage commands (`python -m flows.<stage>`) must run in this interpreter's environment even when
    # it was called by path (.venv/bin/python -m flows.pipeline) without activating the venv.
    os.environ["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    if params_file is not None:
        os.environ[PARAMS_ENV] = params_file  # the stage commands' --params (flows/_common.py)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
        with project(params_file):
            known = _dvc.stages(params_file=params_file or "params.yaml")
            names = _dvc.resolve(args.stages, known)
            left = io.remove_stale_temporaries()
            if left:
                print(f"removed {len(left)} temporary path(s) left by a killed earlier run", file=sys.stderr)
            params = load_params(params_file or "params.yaml")  # a bad value fails here, before DVC deletes any output
            selected = plan(names, only=args.only)
            todo = set(selected) if args.force else stale(selected)
            produced: set[str] = set()
            for name in selected:  # every check that needs no computation, before any stage runs
                if name in todo:
                    preflight.check(params, [name], produced)
                produced |= _dvc.produced_paths([name], known)
            _say(f"{len(todo)} of {len(selected)} stage(s) not up to date (dvc status): "
                 f"{', '.join(n for n in selected if n in todo) or 'none'}")
            rows, rest = ([], selected) if args.force else without_servers(selected, todo)
            if rest:
                rows += _run_flow(args, rest)
            else:
                _say("every stage is up to date or restored from the run-cache (dvc status); nothing to run")
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        print(_resume_hint(), file=sys.stderr)
        return 1
    except Exception as e:
        user_error = pipeline_error(e)
        if user_error is None:
            raise
        print(f"error: {user_error}", file=sys.stderr)
        if _run["current"] is not None:
            print(_resume_hint(), file=sys.stderr)
        return 1 if _run["done"] or _run["current"] else 2
    total = time.perf_counter() - t0
    print(f"{'stage':<24}{'status':<10}{'wall_s':>8}")
    for r in rows:
        print(f"{r['stage']:<24}{r['status']:<10}{r['wall_s']:>8.1f}")
    print(f"{'total':<34}{total:>8.1f}")
    if any(r["status"] != "skipped" for r in rows):
        hint = git_hint(known)
        if hint and params_file is not None and Path(params_file).read_bytes() != Path("params.yaml").read_bytes():
            hint = (f"this run used {args.params}'s values (dvc.lock records them; params.yaml was not touched): to "
                    f"record the run, cp {args.params} params.yaml first; " + hint)
        if hint:
            print(hint)
    line = hardware_line()
    if line:
        print(line)
    from flows.report import print_headline  # last: held-out accuracy per model and the report's path

    print_headline(params_file or "params.yaml")
    return 0


def hardware_line(metrics_dir: str | Path = "data/metrics") -> str | None:
    """One line: the precision each training stage's outputs were made in and what chose it (the ``hardware`` record
    of data/metrics/<stage>.json, stages/core/hardware.py), e.g. ``precision: pretrain fp32, sft fp32 (auto: CPU
    without AMX (AVX2)); grpo fp32 (params)``; None when no stage recorded one."""
    import json

    by_source: dict[str, list[str]] = {}
    for stage in ("pretrain", "sft", "reward_model", "grpo"):
        try:
            hw = json.loads((Path(metrics_dir) / f"{stage}.json").read_text()).get("hardware")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(hw, dict) and hw.get("precision"):
            by_source.setdefault(str(hw.get("precision_from")), []).append(f"{stage} {hw['precision']}")
    if not by_source:
        return None
    return "precision: " + "; ".join(f"{', '.join(v)} ({k})" for k, v in by_source.items())


def _run_flow(args: argparse.Namespace, selected: list[str]) -> list[dict[str, Any]]:
    """Start (or join) the project's API server and (unless ``--no-stage-server``) start the stage server, run the
    pipeline flow with both watched (one that dies fails the run within seconds, :func:`_process.fail`), then release
    them: the stage server stops, the API server too unless another process holds a lease on it."""
    stage_server: StageServer | None = None
    unwatch: Callable[[], None] = lambda: None  # noqa: E731
    try:
        quiet_user_errors()
        _process.after_stop(_release_api)  # an interrupt: after the stage, as at the end
        url, wait_api = _servers.start_api()
        os.environ["PREFECT_API_URL"] = url  # inherited by every stage's process
        modules = sorted({f"flows.{n.split('@')[0]}" for n in selected})
        if not args.no_stage_server and hasattr(os, "fork"):  # it imports the stages while the API server starts
            stage_server = StageServer(modules, os.environ["PREFECT_HOME"]).start()
            if stage_server.proc is not None:
                _process.server_started(stage_server.proc.pid)
        _say("starting the Prefect API server" + (" and the stage server (the stages' imports, once)"
                                                  if stage_server else "") + f"; Prefect's state: {_prefect_home()}")
        wait_api()

        def gone() -> str | None:
            proc = stage_server.proc if stage_server is not None else None
            if proc is not None and proc.poll() is not None:
                return f"the stage server (pid {proc.pid}) {_process.how_it_ended(proc.returncode)}"
            return _servers.api_gone()

        _run["gone"] = gone
        unwatch = _process.watch(gone, lambda why: _process.fail(
            why + (f" while stage {_run['current']} ran" if _run["current"] else "")))
        from prefect.settings import temporary_settings

        with temporary_settings(updates=_servers.settings_updates(url)):
            return pipeline_flow(stages=selected, force=args.force)
    finally:
        unwatch()
        _run["gone"] = None
        if stage_server is not None:
            stage_server.stop()
            print(stage_server.summary())
        if os.environ.get("PREFECT_API_URL"):
            _drain_prefect_workers()
        _release_api()


def _release_api() -> None:
    """Give up this run's lease on the API server and stop it, unless another process holds a lease on it."""
    _servers.release_lease()
    _servers.stop_servers_of(os.getpid())


def _prefect_home() -> str:
    home = Path(os.environ.get("PREFECT_HOME", ".prefect"))
    with contextlib.suppress(ValueError):
        return str(home.resolve().relative_to(Path.cwd().resolve()))
    return str(home)


if __name__ == "__main__":
    raise SystemExit(main())

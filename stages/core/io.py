"""Atomic file and directory writes, JSON / JSONL helpers, and the temporary paths they use.

A stage never leaves a half-written output: files are written to a temporary sibling and
renamed into place (``os.replace`` is atomic on POSIX), directories are built in a temporary
sibling directory and swapped in at the end.

Temporary paths carry the writing process's id (``.<name>.<pid>.<random>.tmp``, and ``.<name>.old-<pid>`` while a
directory is swapped) and are registered while they exist (:func:`live_temporaries`), so that an interrupted
process removes its own (flows/_process.py) and a later run removes those of a process that was killed with
``kill -9`` (:func:`remove_stale_temporaries`). The swap of a directory (two renames) runs as a critical section
(:func:`uninterrupted`): an interrupt that arrives meanwhile is handled right after it, so an output is always
either its old complete version or its new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError

# ---------------------------------------------------------------------------------------------
# temporary paths: registered while they exist, named after their process, removed when it dies

_LIVE: set[Path] = set()
_LOCK = threading.RLock()  # re-entrant: a signal handler may run while this thread holds it
_critical = 0
_deferred: list[Callable[[], None]] = []
_TEMP_NAME = re.compile(r"^\.(?P<label>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")
_OLD_NAME = re.compile(r"^\.(?P<label>.+)\.old-(?P<pid>\d+)$")


def live_temporaries() -> list[Path]:
    """The temporary paths this process is writing right now (an interrupt handler removes them)."""
    with _LOCK:
        return sorted(_LIVE)


def remove_live_temporaries() -> int:
    """Remove this process's temporary paths (called when it is interrupted); return how many there were."""
    paths = live_temporaries()
    for p in paths:
        _remove(p)
    return len(paths)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A critical section: :func:`defer_if_critical` postpones an interrupt until the section ends."""
    global _critical
    with _LOCK:
        _critical += 1
    try:
        yield
    finally:
        with _LOCK:
            _critical -= 1
            todo = list(_deferred) if _critical == 0 else []
            if todo:
                _deferred.clear()
        for fn in todo:
            fn()


def defer_if_critical(fn: Callable[[], None]) -> bool:
    """If a critical section is running (in any thread), run ``fn`` when it ends and return True; else False."""
    with _LOCK:
        if _critical == 0:
            return False
        _deferred.append(fn)
        return True


@contextlib.contextmanager
def temporary_dir(parent: str | os.PathLike[str], label: str) -> Iterator[Path]:
    """A registered scratch directory ``parent/.<label>.<pid>.<random>.tmp``, removed on exit (and by
    :func:`remove_stale_temporaries` if this process is killed before it could remove it)."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f".{label}.{os.getpid()}.", suffix=".tmp", dir=parent))
    with _LOCK:
        _LIVE.add(d)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        with _LOCK:
            _LIVE.discard(d)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def remove_stale_temporaries(roots: Iterable[str | os.PathLike[str]] = ("data", "checkpoints")) -> list[str]:
    """Remove the temporary paths (see the module docstring) under ``roots`` whose process is gone (a ``kill -9``
    left them); return them. Paths of live processes (a stage running meanwhile) are kept."""
    removed: list[str] = []
    for root in roots:
        if not Path(root).is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                m = _TEMP_NAME.match(name) or _OLD_NAME.match(name)
                if m is None or _pid_alive(int(m["pid"])):
                    continue
                p = Path(dirpath) / name
                _remove(p)
                removed.append(str(p))
            dirnames[:] = [d for d in dirnames if (Path(dirpath) / d).exists()]
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it to ``path``.

    Works for files and directories: the caller writes whatever it wants at the yielded
    path. On an exception the temporary is removed and ``path`` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent))
    tmp.rmdir()  # the caller decides whether it is a file or a directory
    with _LOCK:
        _LIVE.add(tmp)
    try:
        yield tmp
        with uninterrupted():
            if target.is_dir() and not target.is_symlink():
                old = target.with_name(f".{target.name}.old-{os.getpid()}")
                os.replace(target, old)
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        with _LOCK:
            _LIVE.discard(tmp)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as pretty JSON to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON Lines to ``path`` atomically; return the number of rows."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def headline(metrics: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The entries of ``metrics`` whose dotted key (``generated.cot.greedy.acc``) matches one of ``keys``
    (fnmatch patterns: ``*.greedy.acc``), nested as in ``metrics`` and in its order."""
    import fnmatch

    pats = list(keys)
    out: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str, dst: dict[str, Any]) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if any(fnmatch.fnmatchcase(key, p) for p in pats):
                dst[k] = v
            elif isinstance(v, dict):
                sub: dict[str, Any] = {}
                walk(v, key + ".", sub)
                if sub:
                    dst[k] = sub

    walk(metrics, "", out)
    return out


MEASURED_KEYS = frozenset({"memory", "resumed", "resumed_from_step", "resumed_from_iteration", "resumed_problems",
                           "steps_run", "tokens_this_run", "tool_wait_share_of_step", "tool_wait_frac", "threads"})
"""Keys that :func:`is_timing_key` counts as measurements of the run besides the time-named ones: peak memory,
whether (and where) a run resumed and what it did since, a share of time, the torch thread counts the load chose
(stages/core/threads.py). A resumed run's results are a clean run's bytes (tests/flows/test_resumed_outputs.py)."""


SETTING_KEYS = frozenset({"timeout_s", "exec_timeout_s"})
"""Keys named like durations that are settings, not measurements (a deadline the run was given): results, kept in
the DVC-cached details (the report shows the answer checker's deadline from there)."""


def is_timing_key(key: Any) -> bool:
    """Whether a metric named ``key`` is a measurement of the run rather than a result: a duration or throughput
    (``wall_s``, ``tokens_per_s``, ``step_s_mean``, ``tool_wait_s_total``: ends in ``_s`` or holds ``_s_``), a time
    total (``t_*``, ``cpu_*``), a peak (``peak_*``) or one of :data:`MEASURED_KEYS`, unless :data:`SETTING_KEYS` names
    it (a deadline). The same inputs give the same results on any run; these differ with the machine and its load."""
    k = str(key)
    if k in SETTING_KEYS:
        return False
    return k.endswith("_s") or "_s_" in k or k.startswith(("t_", "cpu_", "peak_")) or k in MEASURED_KEYS


def split_timings(x: Any) -> tuple[Any, Any]:
    """(results, timings) of a metrics value (nested dicts / lists): the timings are the entries whose key
    :func:`is_timing_key` names, at the same place in the nesting (a list keeps its length on both sides, with ``{}``
    where an element has none), the results everything else. ``timings`` is None when there are none."""
    if isinstance(x, dict):
        res: dict[str, Any] = {}
        tim: dict[str, Any] = {}
        for k, v in x.items():
            if is_timing_key(k):
                tim[k] = v
                continue
            r, t = split_timings(v)
            res[k] = r
            if t is not None:
                tim[k] = t
        return res, (tim or None)
    if isinstance(x, list):
        pairs = [split_timings(v) for v in x]
        tims = [t for _, t in pairs]
        return [r for r, _ in pairs], ([{} if t is None else t for t in tims] if any(t is not None for t in tims)
                                        else None)
    return x, None


def untimed(x: Any) -> Any:
    """``x`` without its timings (:func:`split_timings`): what a DVC-cached output may hold."""
    return split_timings(x)[0]


def output_hashes(project: str | os.PathLike[str]) -> dict[str, str]:
    """{path: md5} of what a pipeline run leaves that must be the same bytes on every run of the same inputs: every
    file under ``data/`` but ``data/timings/`` (the run's own measurements, :func:`write_timings`) and ``dvc.lock``.
    Paths are relative to ``project``, with ``/``. Used by the determinism test and benchmarks/load.py."""
    import hashlib

    root = Path(project)
    out = {"dvc.lock": hashlib.md5((root / "dvc.lock").read_bytes()).hexdigest()}
    for f in sorted((root / "data").rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.is_file() and not rel.startswith("data/timings/"):
            out[rel] = hashlib.md5(f.read_bytes()).hexdigest()
    return out


def write_timings(name: str, timings: dict[str, Any] | None) -> None:
    """Write ``data/timings/<name>.json`` (no DVC output, git-ignored): ``timings`` and the load average when it
    was written (timings without the load beside them say little on a shared machine)."""
    from stages.core import paths

    write_json(paths.timings_file(name), {**(timings or {}), "loadavg": [round(v, 2) for v in os.getloadavg()]})


def write_metrics(stage: str, metrics: dict[str, Any], keys: Iterable[str]) -> None:
    """Write a stage's metrics, split by :func:`split_timings`: every result to ``data/details/<stage>.json`` (a
    DVC-cached output), the headline results (``keys``, see :func:`headline`) to ``data/metrics/<stage>.json`` (the
    small file DVC shows as metrics) and the timings to ``data/timings/<stage>.json`` (:func:`write_timings`). The
    first two are the same bytes for the same inputs, so a rerun changes nothing that DVC tracks and the run-cache
    can restore them. When the process checked answers (stages.core.answers), the timings also hold how the checks
    were decided (``answer_checks.timeout``: symbolic checks that ran out of their CPU-time budget and counted as not
    equivalent, the one verdict a faster or slower CPU could change), and the model FLOPs of its passes
    (stages.core.flops)."""
    from stages.core import paths

    results, timings = split_timings(metrics)
    checks = getattr(sys.modules.get("stages.core.answers"), "stats", None)  # only when the process checked answers
    if checks:  # fast / symbolic / cached / timeout: how this process's checks were decided (thread timing decides
        timings = {**(timings or {}), "answer_checks": dict(sorted(checks.items()))}  # cached vs symbolic)
    counted = getattr(sys.modules.get("stages.core.flops"), "record", lambda: None)()  # when it ran a model
    if counted:
        timings = {**(timings or {}), "model_flops": counted}
    write_json(paths.details_file(stage), results)
    write_json(paths.metrics_file(stage), headline(results, keys))
    write_timings(stage, timings)


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or malformed file is a one-line :class:`PipelineError`."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: file not found; run the stage that produces it (dvc repro) or fix the path")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(f"{p}: not valid UTF-8 JSON ({e}); regenerate or fix the file") from None


def iter_jsonl(path: str | os.PathLike[str], *, skip_bad: bool = False, counter: dict[str, int] | None = None
               ) -> Iterator[dict[str, Any]]:
    """Stream the objects of a JSONL file without loading it whole.

    Blank lines are ignored. A malformed line (bad JSON, bad UTF-8, not an object) raises a
    one-line :class:`PipelineError` naming file and line, unless ``skip_bad`` is set, in which
    case it is skipped and counted in ``counter["bad_lines"]``.
    """
    for _, obj in iter_jsonl_lines(path, skip_bad=skip_bad, counter=counter):
        yield obj


def iter_jsonl_lines(path: str | os.PathLike[str], *, skip_bad: bool = False, counter: dict[str, int] | None = None
                     ) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`iter_jsonl` with each object's line number (from 1), for errors that name the line to edit."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: file not found; run the stage that produces it (dvc repro) or fix the path")
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
            except (UnicodeDecodeError, ValueError) as e:
                if skip_bad:
                    if counter is not None:
                        counter["bad_lines"] = counter.get("bad_lines", 0) + 1
                    continue
                raise PipelineError(f"{p}:{lineno}: malformed JSONL line ({type(e).__name__}); fix or remove it") from None
            yield lineno, obj


def read_jsonl(path: str | os.PathLike[str], **kwargs: Any) -> list[dict[str, Any]]:
    """Read a whole JSONL file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path, **kwargs))

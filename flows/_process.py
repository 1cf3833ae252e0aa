"""What a stage or pipeline process does about its own life: interrupts, the processes it started, leftovers.

- :func:`install_interrupt_handler`: the first SIGINT (Ctrl-C), SIGTERM or SIGHUP stops the process within a few
  seconds, whatever it is doing (a Prefect task, a thread pool, a training step, DVC waiting for a stage command):
  it terminates every process it started (training ranks, sandboxes, answer workers, Dask workers, the stage
  command under the pipeline, the project servers it started), removes the temporary paths it was writing
  (stages/core/io.py; an atomic directory swap in progress finishes first), marks its Prefect run cancelled when
  the API answers within a second, prints how to resume and exits with 128 + the signal number. Outputs are
  written atomically, so each is either its old complete version or absent (DVC removes a stage's outputs
  before running it; the hint names ``dvc checkout <stage>``, which restores the last recorded ones).
  A second signal while it stops is ignored: stopping takes at most :data:`STOP_TIMEOUT_S` seconds.
- :func:`watch_parent`: a stage command whose DVC parent dies (``kill`` of ``dvc repro``) interrupts itself.
- :func:`descendants` / :func:`terminate`: the process tree below a pid, read from /proc (``ps`` elsewhere).

Nothing here changes what a stage computes (dvc.yaml does not list it as a code dep).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from stages.core import io

STOP_TIMEOUT_S = 4.0
"""Upper bound of the whole stop (the issue's budget is 5 s from the signal to the exit)."""
_TERM_GRACE_S = 2.0
"""How long terminated children get to exit (and clean up after themselves) before they are killed."""

_state: dict[str, Any] = {"stopping": False, "what": "", "hint": None, "runs": [], "cleanups": [], "servers": set(),
                          "after": []}


# ---------------------------------------------------------------------------------------------
# process trees


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out.extend(int(x) for x in f.read().split())
        return out
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return out  # the process is gone
    except OSError:
        pass
    try:  # no /proc (macOS) or no children files: ask ps
        text = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == str(pid):
            out.append(int(parts[0]))
    return out


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), parents before their children."""
    root = os.getpid() if pid is None else pid
    out: list[int] = []
    todo = [root]
    while todo:
        kids = _children(todo.pop())
        out.extend(k for k in kids if k not in out)
        todo.extend(kids)
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    return io._pid_alive(pid)  # noqa: SLF001  (one definition, next to the temporaries it decides about)


def terminate(pids: Iterable[int], grace_s: float = _TERM_GRACE_S) -> list[int]:
    """SIGTERM ``pids``, wait up to ``grace_s`` for them to exit, SIGKILL the rest; return the ones killed."""
    pids = [p for p in pids if p != os.getpid()]
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        _reap()
        time.sleep(0.05)
    killed = [p for p in pids if alive(p)]
    for p in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    _reap()
    return killed


def _reap() -> None:
    """Collect exited children (so they do not linger as zombies and count as alive)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None when unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        out = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True, timeout=5).stdout
        return int(out.strip()) if out.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def command_line(pid: int) -> list[str]:
    """The argv of ``pid`` ([] when unknown)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        pass
    try:
        out = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, timeout=5).stdout
        return out.split()
    except (OSError, subprocess.SubprocessError):
        return []


# ---------------------------------------------------------------------------------------------
# interrupts


def install_interrupt_handler(what: str, hint: Callable[[], str] | None = None) -> None:
    """Stop this process on the first SIGINT / SIGTERM / SIGHUP (module docstring). ``what`` names it in the message
    (``stage corpus``, ``the pipeline``); ``hint()`` returns the line that says how to resume."""
    _state.update(what=what, hint=hint)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)


def server_started(pid: int) -> None:
    """``pid`` is a server this process started (API server, stage server): on interrupt it is stopped after the
    other processes, so that they can still report to it while they stop."""
    _state["servers"].add(pid)


def on_stop(fn: Callable[[], None]) -> None:
    """Run ``fn`` (quick, best effort) when the process is interrupted, before the children are terminated."""
    _state["cleanups"].append(fn)


def after_stop(fn: Callable[[], None]) -> None:
    """Run ``fn`` (quick, best effort) when the process is interrupted, after its children are gone."""
    _state["after"].append(fn)


def record_run(kind: str, run_id: Any) -> None:
    """Remember a Prefect flow or task run (``kind``: ``flow_runs`` / ``task_runs``) to mark cancelled on interrupt."""
    if run_id is not None:
        _state["runs"].append((kind, str(run_id)))


def stopping() -> bool:
    """True once an interrupt is being handled."""
    return bool(_state["stopping"])


def _on_signal(signum: int, _frame: Any) -> None:
    if _state["stopping"]:
        return  # already stopping: it takes a few seconds at most
    _state["stopping"] = True
    # a second signal (Ctrl-C pressed again) must not kill the cleanup
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):
            signal.signal(s, signal.SIG_IGN)
    if not io.defer_if_critical(lambda: _stop(signum)):
        _stop(signum)


def _trace(t0: float, what: str) -> None:
    if os.environ.get("DSM_TRACE_STOP"):
        _say(f"[stop {os.getpid()} +{time.monotonic() - t0:.2f}s] {what}")


def _stop(signum: int) -> None:
    t0 = time.monotonic()
    name = signal.Signals(signum).name
    _say(f"\ninterrupted ({name}): stopping {_state['what']} ...")
    import logging

    logging.disable(logging.CRITICAL)  # what dying threads and tasks would log now is noise (their files are gone)
    for fn in _state["cleanups"]:
        with contextlib.suppress(Exception):
            fn()
    _trace(t0, "cleanups done")
    # the workers first (stage commands, ranks, sandboxes: they clean up after themselves and report to the API
    # within the grace period), then the servers this process started and whatever is left
    servers = {p for p in _state["servers"] if alive(p)}
    tree = [p for p in descendants() if p not in servers]
    _trace(t0, f"terminating {tree}, then the servers {sorted(servers)}")
    killed = terminate(tree, grace_s=max(0.2, min(_TERM_GRACE_S, STOP_TIMEOUT_S - 2.0 - (time.monotonic() - t0))))
    _trace(t0, f"killed {killed}")
    terminate([*servers, *descendants()], grace_s=0.8)
    io.remove_live_temporaries()
    with contextlib.suppress(Exception):
        io.remove_stale_temporaries()
    _trace(t0, "temporaries removed")
    _cancel_runs(f"interrupted by {name}", budget_s=max(0.1, STOP_TIMEOUT_S - 0.8 - (time.monotonic() - t0)))
    _trace(t0, "runs cancelled")
    for fn in _state["after"]:
        with contextlib.suppress(Exception):
            fn()
    _trace(t0, "after-stop hooks done")
    hint = _state["hint"]
    if hint is not None:
        with contextlib.suppress(Exception):
            _say(hint())
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    # again, last: a task thread of this process still running (the corpus stage's thread-pool tasks create their
    # work directories with parents) may have re-created a removed directory since
    io.remove_live_temporaries()
    os._exit(128 + signum)


def _say(msg: str) -> None:
    with contextlib.suppress(Exception):
        print(msg, file=sys.stderr, flush=True)


def _auth_header() -> dict[str, str]:
    from flows._servers import auth_header  # (flows._servers imports this module)

    return auth_header()


def _cancel_runs(message: str, budget_s: float) -> None:
    """Mark the recorded Prefect runs (and the current flow run) cancelled, if the API answers in time."""
    url = os.environ.get("PREFECT_API_URL")
    runs = list(_state["runs"])
    with contextlib.suppress(Exception):
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is not None and ctx.flow_run is not None:
            runs.append(("flow_runs", str(ctx.flow_run.id)))
    if not url or not runs:
        return
    deadline = time.monotonic() + budget_s
    body = json.dumps({"state": {"type": "CANCELLED", "name": "Cancelled", "message": message}, "force": True}).encode()
    for kind, run_id in dict.fromkeys(reversed(runs)):
        left = deadline - time.monotonic()
        if left <= 0.05:
            return
        req = urllib.request.Request(f"{url.rstrip('/')}/{kind}/{run_id}/set_state", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **_auth_header()})
        with contextlib.suppress(Exception):
            urllib.request.urlopen(req, timeout=min(1.0, left)).close()


def watch_parent(interval_s: float = 0.5) -> None:
    """Interrupt this process (SIGTERM to itself) when its parent exits, e.g. ``dvc repro`` killed while this stage
    command runs: without it the stage would run on, orphaned, and overwrite outputs DVC no longer records."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


# ---------------------------------------------------------------------------------------------
# a params.yaml swapped out by `flows.pipeline --params FILE` (flows/pipeline.py ParamsSwap)


SWAP_PREFIX = ".params.yaml.swapped-"
"""``<prefix><pid>-<sha>``: the user's params.yaml, kept while a ``--params FILE`` run has FILE in its place
(``sha``: the first 12 hex digits of FILE's sha256)."""


def params_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def restore_swapped_params(root: str | Path = ".") -> str | None:
    """Put back a params.yaml that a ``--params`` run killed with ``kill -9`` had swapped out (when params.yaml
    still holds what that run put there); return a line saying what was done, or None."""
    for kept in Path(root).glob(f"{SWAP_PREFIX}*"):
        pid, _, sha = kept.name.removeprefix(SWAP_PREFIX).partition("-")
        if not pid.isdigit() or alive(int(pid)):
            continue
        dst = Path(root) / "params.yaml"
        if dst.exists() and params_sha(dst.read_bytes()) != sha:
            return (f"warning: {kept} holds the params.yaml a killed `flows.pipeline --params` run replaced, and "
                    "params.yaml was edited since; compare them and keep the one you want")
        os.replace(kept, dst)
        return "restored params.yaml, which a killed `python -m flows.pipeline --params` run had replaced"
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick), for a server or a rendezvous. (stages.core.dist has the
    same for stage code; flows do not import torch.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

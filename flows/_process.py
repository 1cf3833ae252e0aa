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
- :func:`fail`: the same stop for a reason found by a watchdog (a server gone): ``error: <reason>``, exit status 1.
- :func:`adopt_orphans` / :func:`stop_leftovers`: the pipeline adopts what a stage leaves behind (a stage killed by
  the out-of-memory killer leaves its workers and ranks running) and stops it when the stage ends.
- :func:`start_time` / :func:`same_process`: a pid and its start time name one process (a pid is reused, the pair is
  not), so a record naming a process is trusted only while both match, and the process is this user's.
- :func:`how_it_ended`: an exit status in words: a signal by name, the out-of-memory killer when the kernel counted
  an OOM kill meanwhile, never "bad input".

Nothing here changes what a stage computes (dvc.yaml does not list it as a code dep).
"""

from __future__ import annotations

import contextlib
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
from typing import Any

from stages.core import io

STOP_TIMEOUT_S = 4.0
"""Upper bound of the whole stop (the stop fits a 5 s budget from the signal to the exit)."""
_TERM_GRACE_S = 2.0
"""How long terminated children get to exit (and clean up after themselves) before they are killed."""

_STOP_LOCK = threading.RLock()  # re-entrant: a signal may arrive in the thread that holds it
_state: dict[str, Any] = {"stopping": False, "what": "", "hint": None, "runs": [], "cleanups": [], "servers": set(),
                          "shared": set(), "after": [], "reason": None}


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
        _reap(pids)
        time.sleep(0.05)
    killed = [p for p in pids if alive(p)]
    for p in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    _reap(pids)
    return killed


def _reap(pids: Iterable[int]) -> None:
    """Collect those of ``pids`` that are exited children of this process (not ``waitpid(-1)``: that would take the
    exit status of a child another thread waits for, DVC's stage command, which then reads as success)."""
    for p in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p, os.WNOHANG)


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22); None when gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def same_process(pid: int, start: int | None) -> bool:
    """``pid`` is alive, is this user's and is the process that started at ``start`` (:func:`start_time`): a record
    of a process that died, whose pid another process (of any user) got since, is not taken for it. Without /proc
    only whether it is alive can be told."""
    if not alive(pid):
        return False
    if not os.path.isdir("/proc/self"):
        return True
    try:
        mine = os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False
    return mine and start is not None and start_time(pid) == start


# ---------------------------------------------------------------------------------------------
# how a process ended


def oom_kills() -> int | None:
    """The kernel's count of processes the out-of-memory killer killed since boot (/proc/vmstat ``oom_kill``: the
    whole machine's, cgroup limits included); None where it is not counted."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def signal_of(status: int) -> int | None:
    """The signal an exit status says ended the process: ``-N`` (Python's returncode) or ``128 + N`` (a shell's, and
    this project's commands' own after an interrupt); None for an ordinary exit."""
    if status < 0:
        return -status
    if 128 < status < 128 + signal.NSIG:
        return status - 128
    return None


def how_it_ended(status: int, oom_before: int | None = None) -> str:
    """An exit status in words: ``exited with status 1``, ``was stopped by SIGTERM``, ``was killed by SIGKILL (the
    out-of-memory killer: the kernel counted an OOM kill while it ran)``. ``oom_before``: :func:`oom_kills` when the
    process started (a SIGKILL with the count unchanged was sent by someone)."""
    sig = signal_of(status)
    if sig is None:
        return f"exited with status {status}"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if sig != signal.SIGKILL:
        return f"was stopped by {name}"
    now = oom_kills()
    if oom_before is not None and now is not None and now > oom_before:
        return ("was killed by SIGKILL: the out-of-memory killer (the kernel counted an OOM kill while it ran; `dmesg` "
                "names the process): give it more memory or smaller batches")
    return "was killed by SIGKILL (kill -9; the kernel counted no out-of-memory kill meanwhile)"


class RunFailed(RuntimeError):
    """A run that failed other than by bad input: a stage crashed or was killed, a server it needed is gone. Reported
    in one line (``error: ...``) with exit status 1, never as bad input (a :class:`PipelineError`, status 2)."""


# ---------------------------------------------------------------------------------------------
# what a stage leaves behind


_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process adopt the orphans among its descendants (Linux's child subreaper): a process whose parent
    died (a stage killed with SIGKILL, and its Dask workers, ranks or sandboxes) becomes this process's child, so
    :func:`stop_leftovers` finds it. False where the system has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_leftovers(keep: Iterable[int] | None = None) -> list[str]:
    """Stop every child of this process but ``keep`` (default: the servers it started), with its descendants: after
    a stage, what is left are orphans it left behind (:func:`adopt_orphans`). Returns them as ``pid: command``."""
    keep = set(keep) if keep is not None else {*_state["servers"], *_state["shared"]}
    kids = [p for p in _children(os.getpid()) if p not in keep and alive(p)]
    if not kids:
        return []
    tree = [*kids, *(d for k in kids for d in descendants(k))]
    shown = [f"{p}: {' '.join(command_line(p))[:120]}" for p in tree]
    terminate(tree, grace_s=_TERM_GRACE_S)
    return shown


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
    _own_sigterm()


def _own_sigterm() -> None:
    """Make the SIGTERM handler Prefect's flow engine installs for each flow run ours: Prefect's raises in the main
    thread to unwind the flow first (minutes against a dead API server, and the stage's temporary directories removed
    under threads still working in them, which then fail and log misleading errors) and only then calls the handler
    it replaced. Prefect 3 keeps it in ``prefect.utilities.engine._prefect_sigterm_handler``."""
    with contextlib.suppress(ImportError):
        import prefect.utilities.engine as engine

        if hasattr(engine, "_prefect_sigterm_handler"):
            engine._prefect_sigterm_handler = _on_signal  # noqa: SLF001


def server_started(pid: int) -> None:
    """``pid`` is a server this process started (API server, stage server): on interrupt it is stopped after the
    other processes, so that they can still report to it while they stop."""
    _state["servers"].add(pid)


def shared_server(pid: int) -> None:
    """``pid`` is a server this process started that other processes may hold leases on (the Prefect API server,
    flows/_servers.py): an interrupt does not terminate it; an :func:`after_stop` hook stops it unless it is leased."""
    _state["shared"].add(pid)


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


def watch(check: Callable[[], str | None], on_end: Callable[[str], None], interval_s: float = 0.25
          ) -> Callable[[], None]:
    """A daemon thread that calls ``check()`` every ``interval_s``; the first time it returns a reason (a server
    gone), ``on_end(reason)`` is called and the thread ends. Returns the function that ends the watch."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(interval_s):
            why = check()
            if why is not None and not done.is_set():
                on_end(why)
                return

    threading.Thread(target=run, name="watchdog", daemon=True).start()
    return done.set


def lock_holder(lock: str | os.PathLike[str]) -> str:
    """Who holds a zc.lockfile lock: ``pid N (its command line)``, from the pid the holder wrote in it."""
    try:
        with open(lock, encoding="ascii", errors="replace") as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return "another process"
    cmd = " ".join(command_line(pid))[:100]
    return f"pid {pid}" + (f" ({cmd})" if cmd else "")


RUN_LOCK = os.path.join(".dvc", "tmp", "dsm-run.lock")
"""The lock a run of the project holds (zc.lockfile, as DVC's own: an flock, and the holder's pid inside), relative to
the project root. (Not DVC's ``.dvc/tmp/lock``: DVC lets that go while a stage's command runs.)"""
RUN_ENV = "DSM_RUN"
"""Set by the pipeline for its stage commands: its pid (the hold they run inside)."""


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        if pid == ancestor:
            return True
        parent = parent_of(pid)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


def hold_run_lock(what: str, *, wait: bool = True, lock: str = RUN_LOCK) -> Any:
    """Hold the project for one run: the pipeline for its whole run, a stage command for its own (by hand,
    or under a plain ``dvc repro``); a stage command of the pipeline runs inside the pipeline's hold (``DSM_RUN``
    names an ancestor). While another process holds it: ``wait`` says once who (one line) and waits, else a one-line
    :class:`PipelineError` refuses. Returns the lock (``close()`` releases it, as the process's end does), or None
    (inside the pipeline's hold, or no ``.dvc/`` here: not a project)."""
    import zc.lockfile

    holder = os.environ.get(RUN_ENV, "")
    if holder.isdigit() and _descends_from(int(os.environ.get("DSM_CLIENT_PID") or os.getpid()), int(holder)):
        return None
    if not os.path.isdir(os.path.dirname(os.path.dirname(lock))):
        return None
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    told = False
    while True:
        try:
            return zc.lockfile.LockFile(lock)
        except zc.lockfile.LockError:
            busy = f"this project is being run by {lock_holder(lock)} ({lock})"
            if not wait:
                from stages.core.errors import PipelineError

                raise PipelineError(f"{busy}; run this when it has finished") from None
            if not told:
                _say(f"{what}: {busy}: waiting for it to finish (Ctrl-C stops waiting)")
                told = True
            time.sleep(0.5)


def fail(reason: str) -> None:
    """Stop this process as an interrupt does (its children, its temporaries, its Prefect runs), but say ``error:
    <reason>`` and exit with status 1: what a watchdog thread calls when a server the run needs is gone. It stops
    from the calling thread (a signal would reach Prefect's own handler first, whose unwinding waits minutes on a dead
    API); an atomic directory swap in progress finishes first. Needs :func:`install_interrupt_handler`."""
    _begin_stop(signal.SIGTERM, reason)


def _on_signal(signum: int, _frame: Any) -> None:
    _begin_stop(signum, None)


def _begin_stop(signum: int, reason: str | None) -> None:
    with _STOP_LOCK:  # a watchdog thread and a signal may both get here
        if _state["stopping"]:
            return  # already stopping: it takes a few seconds at most
        _state["stopping"] = True
        _state["reason"] = reason
    # a second signal (Ctrl-C pressed again) must not kill the cleanup
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # (only the main thread may set handlers)
            signal.signal(s, signal.SIG_IGN)
    if not io.defer_if_critical(lambda: _stop(signum)):
        _stop(signum)


def _trace(t0: float, what: str) -> None:
    if os.environ.get("DSM_TRACE_STOP"):
        _say(f"[stop {os.getpid()} +{time.monotonic() - t0:.2f}s] {what}")


def _stop(signum: int) -> None:
    t0 = time.monotonic()
    name = signal.Signals(signum).name
    reason = _state["reason"]
    _say(f"\nerror: {reason}: stopping {_state['what']} ..." if reason else
         f"\ninterrupted ({name}): stopping {_state['what']} ...")
    import logging

    logging.disable(logging.CRITICAL)  # what dying threads and tasks would log now is noise (their files are gone)
    for fn in _state["cleanups"]:
        with contextlib.suppress(Exception):
            fn()
    _trace(t0, "cleanups done")
    # the workers first (stage commands, ranks, sandboxes: they clean up after themselves and report to the API
    # within the grace period), then the servers this process started and whatever is left
    servers = {p for p in _state["servers"] if alive(p)}
    shared = _state["shared"]
    tree = [p for p in descendants() if p not in servers and p not in shared]
    _trace(t0, f"terminating {tree}, then the servers {sorted(servers)}")
    killed = terminate(tree, grace_s=max(0.2, min(_TERM_GRACE_S, STOP_TIMEOUT_S - 2.0 - (time.monotonic() - t0))))
    _trace(t0, f"killed {killed}")
    terminate([p for p in [*servers, *descendants()] if p not in shared], grace_s=0.8)
    io.remove_live_temporaries()
    with contextlib.suppress(Exception):
        io.remove_stale_temporaries()
    _trace(t0, "temporaries removed")
    _cancel_runs(reason or f"interrupted by {name}", budget_s=max(0.1, STOP_TIMEOUT_S - 0.8 - (time.monotonic() - t0)))
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
    os._exit(1 if reason else 128 + signum)


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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick), for a server or a rendezvous. (stages.core.dist has the
    same for stage code; flows do not import torch.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

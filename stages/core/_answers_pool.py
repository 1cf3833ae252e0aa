"""The checking worker processes (``python -m stages.core._answers_worker``) and their pool.

Every check that the bounded in-process pass cannot decide runs in one of these workers under a deadline: the
parent writes one request line and waits for the answer with ``poll``; past the deadline the worker is killed (its
work stops at once, whatever C code it was in) and a replacement starts right away, so the next check does not wait
for the imports (sympy, math-verify: about a second). The pool prefers workers that are already ready.

The deadline is ``timeout_s`` seconds of the worker's own CPU time (Linux /proc: a verdict must not depend on what
else loads the machine), and at most ``WALL_CAP`` x ``timeout_s`` of wall time (a worker that gets no CPU);
without /proc, ``timeout_s`` of wall time. On an idle machine the two are the same.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]


def startup_timeout_s() -> float:
    """Seconds a checking worker may take to start (``ANSWERS_WORKER_STARTUP_S``, default 180; read when used)."""
    return float(os.environ.get("ANSWERS_WORKER_STARTUP_S", "180"))


def max_workers() -> int:
    """Checking workers at most (``ANSWERS_MAX_WORKERS``, default the CPU count within [2, 8]; read when used)."""
    return int(os.environ.get("ANSWERS_MAX_WORKERS", str(max(2, min(8, os.cpu_count() or 2)))))


WALL_CAP = 20.0
"""A check's time limit is CPU time of its worker; a worker that gets no CPU for ``WALL_CAP`` x the limit (a
stopped or starved process) is given up on all the same."""
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Worker:
    """One ``stages.core._answers_worker`` process and its line-buffered stdout."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stages.core._answers_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(_ROOT),
        )
        self._buf = b""
        self._ready = False
        self._next_id = 0

    def _readline(self, deadline: float) -> bytes | None:
        """One line from the worker, or None on timeout or end of output."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            poller = select.poll()  # not select.select: no FD_SETSIZE limit in processes with many files
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(max(0, int(left * 1000) + (1 if left > 0 else 0))):
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def ready_now(self) -> bool:
        """True when the worker has finished starting (never waits)."""
        if not self._ready and self.alive():
            line = self._readline(time.monotonic())
            if line is not None:
                self._ready = bool(json.loads(line).get("ready"))
        return self._ready

    def ensure_ready(self) -> None:
        if self._ready:
            return
        line = self._readline(time.monotonic() + startup_timeout_s())
        if line is None or not json.loads(line).get("ready"):
            self.kill()
            raise RuntimeError(
                f"answer-checking worker did not start within {startup_timeout_s():.0f}s "
                f"(python -m stages.core._answers_worker; exit code {self.proc.returncode})"
            )
        self._ready = True

    def cpu_s(self) -> float | None:
        """CPU seconds the worker process has used (Linux /proc; None elsewhere)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
        except (OSError, IndexError, ValueError):
            return None

    def _reply(self, timeout_s: float) -> bytes | None:
        """The worker's next line, or None once it has spent ``timeout_s`` seconds of CPU time on the request (its own
        CPU time, so the verdict does not depend on what else loads the machine), or ``WALL_CAP`` x ``timeout_s`` of
        wall time (a worker that makes no progress), or when it died. Without /proc, ``timeout_s`` of wall time."""
        cpu0 = self.cpu_s()
        now = time.monotonic()
        if cpu0 is None:
            return self._readline(now + timeout_s)
        cap = now + WALL_CAP * timeout_s
        while True:
            used = (self.cpu_s() or cpu0) - cpu0
            left = timeout_s - used
            if left <= 0 or now >= cap:
                return None
            # the worker is one thread: it cannot use more than `left` CPU seconds in `left` wall seconds
            line = self._readline(min(now + max(left, 0.05), cap))
            if line is not None or not self.alive():
                return line
            now = time.monotonic()

    def request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply to one request (``{"id", "ok"}``), or None when it ran past ``timeout_s`` of CPU time
        (:meth:`_reply`) or died (then it is dead)."""
        self.ensure_ready()
        self._next_id += 1
        try:
            self.proc.stdin.write((json.dumps({**req, "id": self._next_id}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        line = self._reply(timeout_s)
        if line is None:
            self.kill()
            return None
        reply = json.loads(line)
        if reply.get("id") != self._next_id:
            self.kill()
            return None
        return reply

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class Pool:
    """Idle workers handed out one per check (ready ones first); grows to ``max_workers()`` (callers wait beyond)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._live = 0

    def acquire(self) -> Worker:
        with self._cond:
            while True:
                self._idle = [w for w in self._idle if w.alive() or self._drop(w)]
                if self._idle:
                    ready = [w for w in self._idle if w.ready_now()]
                    if ready or self._live >= max_workers():
                        w = (ready or self._idle)[-1]
                        self._idle.remove(w)
                        return w
                if self._live < max_workers():
                    self._live += 1
                    break
                self._cond.wait()
        try:
            return Worker()
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _drop(self, w: Worker) -> bool:
        self._live -= 1
        w.kill()
        return False

    def release(self, w: Worker) -> None:
        """Return a worker; a dead one (timed out and killed) is replaced at once, so its start overlaps the next
        checks instead of delaying them."""
        replacement = None
        if not w.alive():
            try:
                replacement = Worker()
            except OSError:
                replacement = None
        with self._cond:
            if w.alive():
                self._idle.append(w)
            elif replacement is not None:
                self._idle.append(replacement)
            else:
                self._live -= 1
            self._cond.notify()

    def warm(self, n: int) -> None:
        ws = [self.acquire() for _ in range(max(1, min(n, max_workers())))]
        try:
            for w in ws:
                w.ensure_ready()
        finally:
            for w in ws:
                self.release(w)

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for w in idle:
            w.kill()


_POOL: Pool | None = None
_POOL_PID = -1


def _close_at_exit() -> None:
    if _POOL is not None and os.getpid() == _POOL_PID:
        _POOL.close()


def pool() -> Pool:
    """This process's pool, created on first use (importing this module starts and registers nothing); a forked
    child gets a fresh one (it must not share its parent's pipes)."""
    global _POOL, _POOL_PID
    if _POOL is None or os.getpid() != _POOL_PID:
        first = _POOL is None
        _POOL, _POOL_PID = Pool(), os.getpid()
        if first:
            atexit.register(_close_at_exit)
    return _POOL


def run(req: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    """One request on an idle worker: its reply, or None past ``timeout_s`` (the worker is then replaced)."""
    p = pool()
    w = p.acquire()
    try:
        return w.request(req, timeout_s)
    finally:
        p.release(w)

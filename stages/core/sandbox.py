"""The one executor for model-written Python: SFT data checks, PoT/TIR evaluation and tool-integrated rollouts.

Programs are untrusted, and the pipeline runs as root (CI, containers) or as an ordinary user (a laptop, a shared
login node), so isolation is enforced by the kernel, never by inspecting the code. Every program runs in a fresh process forked from a pre-started *zygote* (a clean
Python with math modules such as ``sympy`` and ``numpy`` already imported, see :data:`DEFAULT_PRELOAD`), and
every sandbox is used once and destroyed.

Guaranteed on a Linux host where the pipeline runs as root (check :func:`isolation_report`; every mechanism
that could not be set up is logged as a warning when the zygote starts, never skipped silently), and all but three
(``uid``, ``cgroup_pids``, ``cgroup_memory``) for an ordinary user where the kernel allows unprivileged user
namespaces: the zygote then isolates as bubblewrap does, inside a user namespace that maps only the caller's uid
(report ``privileges``: "root", "user namespace" or "none: <why>"; each program gets a user namespace of its own, so
``RLIMIT_NPROC`` counts its processes alone, and no capability):

- ``uid``: the program runs as a fresh unprivileged uid (``uid_base`` + a pid; no supplementary groups, no
  capabilities), so it cannot signal, ptrace or read ``/proc/<pid>/environ`` of anything else, and rlimits
  such as ``RLIMIT_NPROC`` apply (they do not for root);
- ``no_new_privs`` and a ``seccomp`` allow-list (x86_64): the ~110 system calls that CPython, numpy, scipy
  and sympy programs make (measured by ``benchmarks/sandbox_syscalls.py``); any other call fails with EPERM
  (Python raises ``PermissionError``), calls newer than the list included: no ``execve`` (no shell, no
  other binary), no ``socket``/``connect``/``bind``, ``ptrace``, ``mount``, ``unshare``/namespace clones,
  ``bpf``, ``io_uring``, ``mincore``, keyrings, ...; ``clone`` without namespace flags, ``kill`` / ``tgkill``
  but not to PID 1 (the sandbox's monitor), ``fcntl``, ``ioctl``, ``prctl`` and ``madvise`` for listed requests only; foreign-ABI syscalls kill the process.
  Three parts of the filter are reported (and can be disabled) on their own: ``unix_stream_only``
  (``socketpair`` only for AF_UNIX stream / seqpacket, ``sendto`` without an address, no ``sendmsg``: no
  datagram reaches a host AF_UNIX socket), ``no_file_locks`` (no ``flock``, record / OFD locks or leases,
  which on a world-readable host file would block host processes; a program using an sqlite *file* needs
  this one disabled) and ``no_fs_notify`` (no inotify, fanotify or ``F_NOTIFY``);
- namespaces: ``pidns`` (the program sees only its own processes; when it exits, or on timeout, the kernel
  kills every process it started, double-forked ones included, before :func:`run_python` returns),
  ``netns`` (no network interface but a down loopback), ``mountns``, ``ipcns``, ``utsns``, ``cgroupns``;
- file system, by allow-list (``allowlist_fs``): the sandbox's root is a read-only tmpfs that holds ``/usr`` and the
  ``/lib*`` trees (or their merged-/usr symlinks), the interpreter's standard library, lib-dynload and
  site-packages, six /etc entries and a written passwd / group / hosts, each bound read-only, ``nosuid`` and
  ``nodev`` at its host path, and nothing else: not the checkout, data directories, ``../shared``, HOME, ``/run``,
  ``/sys``, nor a directory a ``.pth`` file names; every absolute path a params file names is hidden even inside the
  allow-list (:func:`protect`); ``expose`` / ``hide`` add to it. ``/dev`` holds only null, zero, full, random and
  urandom (``minimal_dev``); ``/proc`` shows the program's own processes only, not the sandbox's PID 1, and no
  ``/proc/sys`` (``proc_hidepid``: ``hidepid=invisible,subset=pid``); the working directory ``/tmp`` (fresh and
  empty) and ``/dev/shm`` share one tmpfs limited in size (``disk_mb``) and in files (``inode_cap``) that vanishes
  with the sandbox;
- limits: wall clock (``timeout_s``), CPU seconds (``RLIMIT_CPU``), CPUs at once (``cpu_limit``: a cgroup CPU
  quota of ``cpus`` for the whole tree, or pinning), memory (``RLIMIT_AS`` = the interpreter's
  own address space + ``memory_mb``, and a memory cgroup for the whole tree that caps RAM + swap where the
  kernel accounts swap, RAM alone otherwise: ``isolation_report()['memory_cap']``), processes and threads
  (``RLIMIT_NPROC`` and a pids cgroup), file size, 256 open files, no core dumps; the program is the
  out-of-memory killer's first choice (``oom_score_adj`` 1000). Threads share one malloc arena and get
  stacks of at most 8 MiB, so a thread costs 8 MiB of address space, not 72: at ``memory_mb=512`` a pool of
  32 threads starts (``max_procs`` counts threads);
- an empty environment (the zygote itself starts with a minimal one, so ``/proc/self/environ`` holds no
  secret of the caller either), stdin is ``/dev/null``;
- output: stdout and stderr are captured separately, decoded as UTF-8 with replacement characters, and cut
  to their first and last ``max_output_bytes / 2`` bytes when longer (the middle is replaced by a marker),
  so a huge or binary output never breaks the caller.

Not guaranteed: the program learns the paths of the Python installation it runs (``sys.path``; a ``.venv`` inside
the checkout names the checkout's directory, whose other content is not mounted); it can use up to its limits of
CPU, memory and disk; kernel bugs are out of scope (seccomp narrows the surface, it does not remove it; the kernel
lets ``uretprobe``/``uprobe``, 335/336, bypass every filter, and they kill a caller outside a probe trampoline);
timing side channels (CPU caches, the page cache by timing) are not closed; without a user namespace (or on another
architecture, or with cgroup v2) the corresponding mechanisms are missing and reported as such: without root and
without user namespaces a program gets rlimits, no_new_privs, seccomp, an empty environment, a fresh host working
directory, CPU pinning and a process-group kill, and sees the host's files as the caller does, so the stages refuse
to run model-written programs there unless the params opt in (:func:`require_isolation`). docs/sandbox.md has the
threat model, docs/results/sandbox.md the red-team table.

Fast path: the zygote pre-forks sandboxes (namespaces and mounts ready, program not yet known), so a
program costs a few forks, not an interpreter start-up. State cannot leak between programs: each runs in
its own process forked from the zygote, which never sees programs or their outputs (they travel between the
caller and the sandbox over pipes). :func:`run_python` is thread-safe; :func:`run_many` runs a batch over a
bounded thread pool.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ZYGOTE_SCRIPT = Path(__file__).with_name("_sandbox_zygote.py")
DEFAULT_PRELOAD: tuple[str, ...] = (
    "math", "cmath", "fractions", "decimal", "itertools", "functools", "collections", "statistics", "random",
    "re", "string", "datetime", "heapq", "bisect", "operator", "json", "numpy", "sympy",
)
DEFAULT_UID_BASE = 2_000_000_000
STATUSES = ("ok", "error", "timeout", "killed")
_DONE = re.compile(rb"(?m)^D$")
_KILL_GRACE_S = 10.0  # after a timeout, how long teardown may take before we give up waiting


@dataclass
class ExecResult:
    """What one program did.

    ``status``: "ok" (exit 0), "error" (non-zero exit, e.g. an exception; or ``sandbox_error`` set: the
    sandbox could not be set up and the program did NOT run), "timeout" (wall clock or CPU limit), "killed"
    (ended by a signal: segfault, out-of-memory kill, ...). ``returncode`` is the exit code, ``-signal``
    when killed by a signal, ``None`` when the program did not finish. ``stdout``/``stderr`` are decoded text,
    possibly truncated (``*_truncated``; ``*_bytes`` is the full size that was produced).
    """

    status: str
    stdout: str
    stderr: str
    returncode: int | None
    wall_s: float
    signal: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    sandbox_error: str | None = None
    sandbox_uid: int | None = None

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0."""
        return self.status == "ok"


# Sane ranges of run()'s limits (the params schema bounds its sandbox fields to these too).
LIMITS: dict[str, tuple[float, float]] = {
    "timeout_s": (0.001, 86_400.0), "cpu_s": (0.001, 86_400.0), "memory_mb": (1, 1 << 20), "disk_mb": (1, 1 << 20),
    "max_procs": (1, 1 << 15), "max_output_bytes": (2, 1 << 30), "cpus": (0.01, 1024.0),
}


def check_limits(**values: float | None) -> None:
    """Raise ValueError naming the first limit that is not a finite number in its :data:`LIMITS` range (None:
    the default, allowed)."""
    for k, v in values.items():
        if v is None and k == "cpu_s":
            continue
        lo, hi = LIMITS[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            raise ValueError(f"sandbox: {k} must be a finite number in [{lo:g}, {hi:g}], not {v!r}")


class _Capture:
    """Keeps the first ``limit`` bytes and the last ``limit // 2`` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = max(2, int(limit))
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            keep = self.limit // 2
            if len(self.tail) > 4 * keep:
                del self.tail[: len(self.tail) - keep]

    def text(self) -> tuple[str, bool]:
        if self.total <= self.limit:
            return bytes(self.head).decode("utf-8", "replace"), False
        half = self.limit // 2
        last = (bytes(self.head) + bytes(self.tail))[-half:]
        omitted = self.total - half - len(last)
        marker = f"\n...[{omitted} bytes truncated]...\n"
        return (bytes(self.head[:half]).decode("utf-8", "replace") + marker + last.decode("utf-8", "replace"),
                True)


def _recv_fds(sock: socket.socket, maxfds: int) -> tuple[bytes, list[int]]:
    """socket.recv_fds, but the fds are close-on-exec (MSG_CMSG_CLOEXEC)."""
    import array

    fds = array.array("i")
    msg, ancdata, _flags, _addr = sock.recvmsg(65536, socket.CMSG_LEN(maxfds * fds.itemsize),
                                               getattr(socket, "MSG_CMSG_CLOEXEC", 0))
    for level, ctype, data in ancdata:
        if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds)


def _remove_cgroup_tree(path: str) -> None:
    if not os.path.isdir(path):
        return
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)
    with contextlib.suppress(OSError):
        os.rmdir(path)


class SandboxExecutor:
    """A handle on one zygote process; thread-safe. Most code uses the module functions instead.

    ``prefork``: sandboxes kept ready; ``preload``: modules imported once in the zygote; ``expose``: host paths
    the programs may read besides the allow-list (shown read-only at the same path; say a data set they should
    see); ``hide``: host paths never shown, even inside the allow-list (covered by an empty read-only mount);
    ``disable``: mechanisms to switch off (for tests of degraded hosts; each one is logged as a warning);
    ``disk_mb``: tmpfs size prepared in advance (other sizes cost a remount); ``max_concurrent``: programs
    running at once through this executor (more callers wait); ``python``: the interpreter of the zygote and
    of every program (default: this one), whose installation the sandboxes see; ``user``: a uid to start the zygote as
    (its primary group, no other; the caller must be root): what that user's pipeline gets, for benchmarks and tests.
    """

    def __init__(
        self,
        *,
        prefork: int = 2,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        expose: Sequence[str] = (),
        hide: Sequence[str] = (),
        disable: Sequence[str] = (),
        uid_base: int = DEFAULT_UID_BASE,
        disk_mb: int = 64,
        max_concurrent: int | None = None,
        startup_timeout_s: float = 120.0,
        python: str | None = None,
        user: int | None = None,
    ) -> None:
        self._cfg: dict[str, Any] = {
            "prefork": int(prefork), "preload": list(preload), "disable": list(disable),
            "expose": [os.path.abspath(p) for p in expose], "hide": [os.path.abspath(p) for p in hide],
            "uid_base": int(uid_base), "disk_mb": int(disk_mb), "memory_mb": 512, "max_procs": 32,
        }
        self._startup_timeout_s = startup_timeout_s
        self._python = python or sys.executable
        self._user = user
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._owner: int | None = None
        self._report: dict[str, Any] | None = None
        self._closed = False
        self._max_concurrent = max_concurrent or max(4, 4 * (os.cpu_count() or 1))
        self._sem = threading.BoundedSemaphore(self._max_concurrent)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (lambda ex: ex and ex._after_fork_in_child())(ref()))

    def _after_fork_in_child(self) -> None:
        """A forked caller gets fresh locks and, on first use, its own zygote (the parent's stays the parent's)."""
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(self._max_concurrent)
        if self._sock is not None:
            self._sock.close()
        self._proc = self._sock = self._owner = None

    # ---- zygote lifecycle ------------------------------------------------------------------------------
    def _start_locked(self) -> None:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = dict(self._cfg, ctl_fd=b.fileno())
        env = {"PATH": os.defpath, "LC_ALL": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}
        as_user: dict[str, Any] = {}
        if self._user is not None:
            import pwd

            as_user = {"user": self._user, "group": pwd.getpwuid(self._user).pw_gid, "extra_groups": []}
        try:
            proc = subprocess.Popen(
                [self._python, "-I", "-B", str(ZYGOTE_SCRIPT), json.dumps(cfg)],
                pass_fds=[b.fileno()], env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True, **as_user,
            )
        finally:
            b.close()
        a.settimeout(self._startup_timeout_s)
        try:
            hello = json.loads(a.recv(1 << 20).decode())["hello"]
        except (OSError, ValueError, KeyError) as e:
            proc.kill()
            proc.wait()
            a.close()
            raise RuntimeError(f"sandbox zygote failed to start: {e}") from e
        a.settimeout(None)
        self._proc, self._sock, self._owner, self._report = proc, a, os.getpid(), hello
        for mech, on in hello["mechanisms"].items():
            if not on:
                logger.warning("sandbox: isolation mechanism %r is NOT active: %s", mech,
                               hello["reasons"].get(mech, "unavailable"))
        for w in hello["warnings"]:
            logger.warning("sandbox: %s", w)
        if hello.get("fatal"):
            logger.error("sandbox: cannot run programs: %s", hello["fatal"])

    def _ensure_locked(self) -> None:
        if self._closed:
            raise RuntimeError("sandbox executor is closed")
        if self._owner is not None and self._owner != os.getpid():
            # forked caller: the parent's zygote connection is not ours to use
            if self._sock is not None:
                self._sock.close()
            self._proc = self._sock = self._owner = None
        if self._proc is not None and self._proc.poll() is not None:
            logger.warning("sandbox: zygote exited (status %s); restarting it", self._proc.returncode)
            self._stop_locked()
        if self._proc is None:
            self._start_locked()

    def _stop_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.send(b"Q")
            except OSError:
                pass
            self._sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            # a zygote that died without cleaning up leaves its (empty) cgroups behind
            for d in (self._report or {}).get("cgroups", []):
                _remove_cgroup_tree(d)
        self._proc = self._sock = self._owner = None

    def close(self) -> None:
        """Stop the zygote (sandboxes in flight are killed when their callers' handles close)."""
        with self._lock:
            if self._owner == os.getpid():
                self._stop_locked()
            self._closed = True

    def report(self) -> dict[str, Any]:
        """The isolation report of the zygote (starting it if needed)."""
        with self._lock:
            self._ensure_locked()
            assert self._report is not None
            rep = dict(self._report)
        rep["active"] = [m for m, on in rep["mechanisms"].items() if on]
        rep["inactive"] = [m for m, on in rep["mechanisms"].items() if not on]
        return rep

    def _acquire(self) -> tuple[dict[str, Any], list[int]]:
        with self._lock:
            for attempt in range(2):
                self._ensure_locked()
                assert self._sock is not None and self._report is not None
                if self._report.get("fatal"):
                    raise RuntimeError(f"sandbox unavailable: {self._report['fatal']}")
                try:
                    self._sock.send(b"F")
                    msg, fds = _recv_fds(self._sock, 6)
                    if len(fds) == 6:
                        return json.loads(msg.decode()), fds
                    for fd in fds:
                        os.close(fd)
                    if msg.startswith(b"{"):
                        return json.loads(msg.decode()), []  # {"error": ...}: no sandbox this time
                    raise OSError("zygote sent no sandbox")
                except OSError as e:
                    if attempt:
                        raise RuntimeError(f"sandbox zygote unusable: {e}") from e
                    logger.warning("sandbox: zygote connection failed (%s); restarting it", e)
                    self._stop_locked()
            raise AssertionError("unreachable")

    # ---- running ---------------------------------------------------------------------------------------
    def run(
        self,
        code: str,
        *,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        disk_mb: int = 64,
        max_procs: int = 32,
        max_output_bytes: int = 65536,
        cpu_s: float | None = None,
        cpus: float = 1.0,
        call: str | None = None,
    ) -> tuple[ExecResult, str | None]:
        """Run ``code``; with ``call`` also call that top-level function and return ``str()`` of its result."""
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        check_limits(timeout_s=timeout_s, memory_mb=memory_mb, disk_mb=disk_mb, max_procs=max_procs,
                     max_output_bytes=max_output_bytes, cpu_s=cpu_s, cpus=cpus)
        req = json.dumps({"code": code, "timeout_s": float(timeout_s), "cpu_s": cpu_s, "memory_mb": int(memory_mb),
                          "disk_mb": int(disk_mb), "max_procs": int(max_procs), "cpus": float(cpus),
                          "call": call}).encode()
        with self._sem:
            t0 = time.monotonic()
            head, fds = self._acquire()
            if not fds:
                msg = head.get("error", "no sandbox")
                logger.error("sandbox: %s", msg)
                return ExecResult(status="error", stdout="", stderr="", returncode=None,
                                  wall_s=time.monotonic() - t0, sandbox_error=msg), None
            req_w, out_r, err_r, stat_r, life_w, res_r = fds
            try:
                return self._drive(head, req, t0, float(timeout_s), int(max_output_bytes), req_w, out_r, err_r,
                                   stat_r, life_w, res_r)
            finally:
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    def _drive(self, head: dict, req: bytes, t0: float, timeout_s: float, max_out: int, req_w: int, out_r: int,
               err_r: int, stat_r: int, life_w: int, res_r: int) -> tuple[ExecResult, str | None]:
        try:
            data = memoryview(struct.pack("!Q", len(req)) + req)
            while data:
                n = os.write(req_w, data)
                data = data[n:]
        except OSError:
            pass  # the sandbox failed during setup; its status pipe says why
        deadline = time.monotonic() + timeout_s
        out, err, res = _Capture(max_out), _Capture(max_out), _Capture(1 << 20)
        stat = bytearray()
        sinks = {out_r: out.add, err_r: err.add, stat_r: stat.extend, res_r: res.add}
        poller = select.poll()
        for fd in sinks:
            poller.register(fd, select.POLLIN)
        open_fds = set(sinks)
        timed_out = False
        gave_up = False
        kill_deadline = 0.0
        while open_fds:
            now = time.monotonic()
            if not timed_out and now >= deadline:
                timed_out = True
                kill_deadline = now + _KILL_GRACE_S
                try:
                    os.write(life_w, b"K")  # the monitor kills the sandbox's PID 1: the kernel does the rest
                except OSError:
                    pass
            if timed_out and now >= kill_deadline:
                gave_up = True
                break
            wait = (kill_deadline if timed_out else deadline) - now
            for fd, _ev in poller.poll(max(1, int(wait * 1000) + 1)):
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    sinks[fd](chunk)
                if not chunk or (fd == stat_r and _DONE.search(stat) is not None):
                    # "D": every process of the program is gone (the monitors exit on their own)
                    poller.unregister(fd)
                    open_fds.discard(fd)
        wall = time.monotonic() - t0
        xstatus, errors, workdir = None, [], None
        for line in bytes(stat).decode("utf-8", "replace").splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "X":
                try:
                    xstatus = int(rest)
                except ValueError:
                    pass
            elif kind == "E":
                errors.append(rest)
            elif kind == "W":
                workdir = rest
        if workdir and workdir.startswith("/tmp/dsm-sandbox-"):
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        stdout, out_trunc = out.text()
        stderr, err_trunc = err.text()
        sig_name, rc, sandbox_error = None, None, None
        if errors:
            status, sandbox_error = "error", "; ".join(errors)
            logger.error("sandbox setup failed, program not run: %s", sandbox_error)
        elif timed_out:
            status = "timeout"
        elif xstatus is None:
            status = "killed"
        elif os.WIFSIGNALED(xstatus):
            sig = os.WTERMSIG(xstatus)
            rc = -sig
            sig_name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            status = "timeout" if sig == signal.SIGXCPU else "killed"
        else:
            rc = os.WEXITSTATUS(xstatus)
            status = "ok" if rc == 0 else "error"
        if gave_up:
            sandbox_error = f"sandbox teardown did not finish within {_KILL_GRACE_S}s"
            logger.error("sandbox: %s", sandbox_error)
        result = ExecResult(status=status, stdout=stdout, stderr=stderr, returncode=rc, wall_s=wall,
                            signal=sig_name, stdout_truncated=out_trunc, stderr_truncated=err_trunc,
                            stdout_bytes=out.total, stderr_bytes=err.total, sandbox_error=sandbox_error,
                            sandbox_uid=head.get("uid"))
        value = None
        if status == "ok" and res.total:
            value = res.text()[0]
        return result, value


# ----------------------------------------------------------------------------------------------------------
# Module-level default executor.
_default: SandboxExecutor | None = None
_default_lock = threading.Lock()


_protected: set[str] = set()


def protect(paths: Sequence[str]) -> None:
    """Never show these host paths to programs of the process-wide executor, even inside the allow-list (they are
    covered by empty read-only mounts: ``hide``). Every absolute path a params file names is protected the same way
    (``stages.schema.base.named_paths``), so that a data set or model kept under ``/usr`` or in a site-packages
    directory stays out of view. A running executor that does not hide them yet is replaced on its next use."""
    _protected.update(p for p in paths if p)


def _within_allow_list(path: str) -> bool:
    """Whether ``path`` may lie in a tree the sandbox shows (system trees, /etc, the Python installation): only
    those need hiding (a superset: the zygote's plan keeps the ones inside a bind)."""
    roots = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", sys.prefix, sys.base_prefix, sys.exec_prefix,
             sys.base_exec_prefix)
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in {os.path.realpath(r) for r in roots})


def protected() -> list[str]:
    """The existing paths the process-wide executor hides: :func:`protect`-ed and named by params files, those that
    may lie inside the allow-list (the rest are never shown anyway)."""
    from stages.schema.base import named_paths  # (the params files this process read)

    found = {os.path.realpath(os.path.expanduser(p)) for p in _protected | named_paths()}
    return sorted(p for p in found if _within_allow_list(p) and os.path.exists(p))


def get_executor() -> SandboxExecutor:
    """The process-wide executor (started on first use; it hides the :func:`protected` paths)."""
    global _default
    hide = protected()
    with _default_lock:
        old = None
        if _default is not None and _default._cfg["hide"] != hide and not _default._closed:
            old, _default = _default, None
        if _default is None:
            _default = SandboxExecutor(hide=hide)
    if old is not None:
        old.close()
    return _default


def configure(**kwargs: Any) -> SandboxExecutor:
    """Replace the process-wide executor with one built from ``kwargs`` (see :class:`SandboxExecutor`)."""
    global _default
    with _default_lock:
        old, _default = _default, SandboxExecutor(**kwargs)
    if old is not None:
        old.close()
    return _default


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()


def default_workers() -> int:
    """Default size of the batch pool: the number of CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def isolation_report() -> dict[str, Any]:
    """Which isolation mechanisms are active here: ``{"mechanisms": {name: bool}, "active": [...],
    "inactive": [...], "reasons": {name: why}, "warnings": [...], "seccomp": {"policy", "arch",
    "allowed_syscalls", "argument_checked"} or None, "threads": {"malloc_arena_max", "thread_stack_bytes"},
    ...}``."""
    return get_executor().report()


REQUIRED = ("allowlist_fs", "pidns", "netns")
"""What model-written programs need (:func:`require_isolation`): none of the caller's files, processes or network."""


def require_isolation(what: str) -> dict[str, Any] | None:
    """Before a run executes model-written programs (``what``, e.g. ``evaluate@sft (pot/tir)``): None where the sandbox
    has every :data:`REQUIRED` mechanism; else a one-line PipelineError naming what is missing and the fix, unless the
    params opt in (``runtime.allow_reduced_isolation: true``, stages.schema.base), and then the record the run writes
    into its metrics (``{"isolation": "reduced", "missing": [...], "why": ...}``)."""
    from stages.core.errors import PipelineError
    from stages.schema.base import ALLOW_REDUCED_ISOLATION, reduced_isolation_allowed

    if not sys.platform.startswith("linux"):
        missing, why = list(REQUIRED), f"{sys.platform} has no Linux namespaces; run on Linux"
    else:
        rep = isolation_report()
        missing = [m for m in REQUIRED if not rep["mechanisms"].get(m)]
        why = "; ".join(dict.fromkeys(rep["reasons"].get(m, "inactive") for m in missing))
    if not missing:
        return None
    if not reduced_isolation_allowed():
        raise PipelineError(f"{what} runs model-written programs, but the code sandbox lacks {', '.join(missing)} "
                            f"({why}); fix that, or set runtime.{ALLOW_REDUCED_ISOLATION}: true in the params file to "
                            "run them with reduced isolation")
    logger.warning("sandbox: %s runs model-written programs without %s (runtime.%s: true): %s", what,
                   ", ".join(missing), ALLOW_REDUCED_ISOLATION, why)
    return {"isolation": "reduced", "missing": missing, "why": why}


WALL_PER_CPU = 3.0
"""Under :func:`cpu_limit`, the wall-clock cap of a program as a multiple of its CPU-time limit."""


def cpu_limit(timeout_s: float) -> dict[str, float]:
    """Limits under which a program's outcome does not depend on the machine's load, as keyword arguments
    of :func:`run_python` / :func:`run_pot`: ``timeout_s`` seconds of CPU time per process (``RLIMIT_CPU``, which ends
    it as a "timeout" at the same point of its computation however busy the machine is) and a wall-clock cap of
    :data:`WALL_PER_CPU` x ``timeout_s`` for a program that waits without computing (sleep, a blocking call). The
    pipeline's stages run model-written and dataset programs with these; only a program starved below
    1 / ``WALL_PER_CPU`` of a core for its whole run can end differently on a loaded machine."""
    return {"cpu_s": timeout_s, "timeout_s": WALL_PER_CPU * timeout_s}


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    disk_mb: int = 64,
    max_procs: int = 32,
    max_output_bytes: int = 65536,
    cpu_s: float | None = None,
    cpus: float = 1.0,
) -> ExecResult:
    """Run ``code`` as a fresh ``__main__`` in its own sandbox; thread-safe.

    ``timeout_s``: wall clock; ``cpu_s``: CPU seconds per process (default ``timeout_s``); ``memory_mb``:
    address space the program may add to the interpreter's (and the cgroup cap of the whole tree);
    ``disk_mb``: total size of the working directory and /dev/shm; ``max_procs``: processes + threads;
    ``max_output_bytes``: kept per stream (first and last halves); ``cpus``: CPUs the whole process tree may
    use at once (a cgroup CPU quota; without one, the program is pinned to ``ceil(cpus)`` CPUs). Each limit must
    be a finite number in its :data:`LIMITS` range (ValueError otherwise).
    """
    return get_executor().run(code, timeout_s=timeout_s, memory_mb=memory_mb, disk_mb=disk_mb,
                              max_procs=max_procs, max_output_bytes=max_output_bytes, cpu_s=cpu_s, cpus=cpus)[0]


def run_many(codes: Sequence[str], *, workers: int | None = None, **kw: Any) -> list[ExecResult]:
    """Run many programs over a pool of ``workers`` threads (default: CPUs); results in input order."""
    if not codes:
        return []
    n = min(len(codes), workers or default_workers())
    if n <= 1:
        return [run_python(c, **kw) for c in codes]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda c: run_python(c, **kw), codes))


def run_pot(code: str, **kw: Any) -> tuple[ExecResult, str | None]:
    """Run a program-of-thought program (defines ``solution()``); return (result, ``str(solution())``).

    The value is ``None`` unless the program ran to completion (``status == "ok"``). Keyword arguments as
    for :func:`run_python`.
    """
    return get_executor().run(code, call="solution", **kw)


def run_many_pot(codes: Sequence[str], *, workers: int | None = None, **kw: Any) -> list[tuple[ExecResult, str | None]]:
    """:func:`run_pot` over a pool of ``workers`` threads; results in input order."""
    if not codes:
        return []
    n = min(len(codes), workers or default_workers())
    if n <= 1:
        return [run_pot(c, **kw) for c in codes]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda c: run_pot(c, **kw), codes))


# ----------------------------------------------------------------------------------------------------------
# Tool-integrated reasoning (DeepSeekMath evaluation/infer/run_tool_integrated_eval.py conventions).
def truncate_output(text: str) -> str:
    """The reference evaluator's cut: over 100 characters -> first 50 + "..." + last 50."""
    if len(text) > 100:
        return text[:50] + "..." + text[-50:]
    return text


def _error_text(res: ExecResult, error_format: str) -> str:
    if res.status == "timeout":
        msg = "Timeout Error"
    elif res.sandbox_error:
        msg = f"SandboxError: {res.sandbox_error}"
    elif res.status == "killed":
        msg = f"Killed by {res.signal}" if res.signal else "Killed"
    elif res.status == "error":
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        if error_format == "full":
            msg = res.stderr.strip()
        else:
            msg = lines[-1] if lines else f"Exit code {res.returncode}"
    else:
        return ""
    if error_format == "full":
        return "Runtime errors: " + truncate_output(msg.strip())
    return truncate_output(msg.strip())


def run_tir_code(code_so_far: str, *, error_format: str = "concise", **kw: Any) -> str:
    """Execute the accumulated code of a TIR solution; return the text for its ```output block.

    As the reference evaluator: on success the printed output, stripped and cut by :func:`truncate_output`
    (stdout is discarded when the program fails); when that is empty, the error: the last traceback line
    (``error_format="concise"``, the reference's ``--use_concise_exec_info``) or ``"Runtime errors: "`` plus
    the traceback (``"full"``; the reference cuts that one by 50+50 tokens, here by characters), "Timeout
    Error" on timeout. Keyword arguments as for :func:`run_python`.
    """
    if error_format not in ("concise", "full"):
        raise ValueError(f"error_format must be 'concise' or 'full', not {error_format!r}")
    return tir_output(run_python(code_so_far, **kw), error_format)


def tir_output(res: ExecResult, error_format: str = "concise") -> str:
    """The ```output text of a finished TIR program run (:func:`run_tir_code`'s rules), from its result."""
    out = truncate_output(res.stdout.strip()) if res.status == "ok" else ""
    if not out:
        out = _error_text(res, error_format)
    return out.strip()


def extract_tir_code(text: str) -> str:
    """The code to run after a TIR response so far (reference ``extract_code``): "" unless ``text`` ends with
    a closed code block; all ```python blocks joined, earlier blocks without their ``print(`` lines."""
    if not text.strip().endswith("```"):
        return ""
    if text.startswith("```python"):
        text = "hey\n" + text
    blocks = [block.split("```", 1)[0].strip() for block in text.split("```python") if "```" in block]
    blocks = [block for block in blocks if block]
    if not blocks:
        return ""
    code = []
    for block in blocks[:-1]:
        for line in block.split("\n"):
            if line.startswith("    ") or line.startswith("import") or line.startswith("def "):
                code.append(line)
            elif "print(" not in line:
                code.append(line)
    return ("\n".join(code) + "\n" + blocks[-1]).strip()


def tir_output_block(output: str) -> str:
    """The text appended after a TIR code block (reference format)."""
    return f"\n```output\n{output.strip()}\n```\n"


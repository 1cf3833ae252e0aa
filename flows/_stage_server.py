"""A fork server for the stage processes of one pipeline run: the stages' imports are paid once per run.

Why: every dvc.yaml stage runs ``python -m flows.<stage>`` in a new process, and each one would import prefect,
torch and transformers (seconds on 2 cores; transformers' model code pulls torch.distributed, torch._dynamo and
scipy), twelve times over the default pipeline's twelve stage processes (benchmarks/results/orchestration.json).

How: ``python -m flows.pipeline`` starts this server (:class:`StageServer`; ``--no-stage-server`` does not): a
process that imports the stage flows and their stage modules once and then waits on a unix socket, with no
thread running. DVC still runs each stage's cmd ``python -m flows.<stage>`` as usual; the command's first line
(:func:`flows._common.begin`) sees ``DSM_STAGE_SERVER``, set by the pipeline, and calls :func:`forward` before
anything heavy is imported: the small client sends its command line, working directory, environment and its
stdin / stdout / stderr file descriptors to the server and waits. The server forks; the child takes over those
descriptors and runs the module as ``__main__`` (``runpy``), exactly what ``python -m`` does, and its exit status
becomes the client's. DVC sees an ordinary process: same output, same exit status; Ctrl-C / SIGTERM sent to the
client is passed on to the child.

The server refuses a request, and the client then imports and runs the stage itself as before, when the request
differs from what the server has loaded: another interpreter, another working directory (the project root),
another environment (variables other than DVC's ``DVC_*`` and the shell's ``PWD`` / ``SHLVL`` / ``_``), a module
other than a stage flow, or a project source file changed since the server imported it. So it never runs stale code or
settings. Without the pipeline (a plain ``dvc repro``, a stage command run by hand, an import) nothing here runs.
The server exits when the pipeline stops it or when its parent process is gone; its socket is in Linux's abstract
namespace (no file; elsewhere a file in a private temporary directory), so nothing is left behind.

Only its owner. An abstract socket has no file permissions and its name is listed in /proc/net/unix, so
each side checks the other's credentials (``SO_PEERCRED``) before it trusts anything: the server serves a connection
only from a process of its own uid that descends from the pipeline (its parent), and closes any other at once, with a
log line, without reading from it or telling it anything (a refusal names no reason on the wire, only in the log); a
request must arrive within :data:`REQUEST_TIMEOUT_S`. The client sends its environment and descriptors only to a
server of its own uid with the pid the pipeline recorded in ``DSM_STAGE_SERVER`` (``<pid>:<socket>``); the socket's
name is random (128 bits), so nobody can bind it before the server.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV_VAR = "DSM_STAGE_SERVER"
_IGNORED_ENV = ("PWD", "OLDPWD", "SHLVL", "_", ENV_VAR)
_ROOT = Path(__file__).resolve().parent.parent
REQUEST_TIMEOUT_S = 30.0
"""A verified client that has not sent its request within this long is dropped (the server serves one at a time)."""


def peer(conn: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end of a unix socket (``SO_PEERCRED``; None where there is none)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _descends_from(pid: int, ancestor: int) -> bool:
    """``pid`` is ``ancestor`` or one of its descendants (walking /proc/<pid>/stat's parent pids)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                pid = int(f.read().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


# ---------------------------------------------------------------------------------------------
# wire format: 4-byte length + JSON; the client's first message also carries 3 file descriptors


def _send(conn: socket.socket, obj: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(obj).encode()
    msg = struct.pack("!I", len(data)) + data
    if fds:
        conn.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        conn.sendall(msg)


def _recv_exact(conn: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    buf = b""
    while len(buf) < n:
        if fds is not None and not buf:
            chunk, anc, _, _ = conn.recvmsg(n, socket.CMSG_SPACE(16 * array.array("i").itemsize))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                    fds.extend(a)
        else:
            chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("stage server: connection closed")
        buf += chunk
    return buf


def _recv(conn: socket.socket, fds: list[int] | None = None) -> dict[str, Any]:
    head = _recv_exact(conn, 4, fds)
    (n,) = struct.unpack("!I", head)
    return json.loads(_recv_exact(conn, n))


# ---------------------------------------------------------------------------------------------
# client (runs inside ``python -m flows.<stage>`` before anything heavy is imported)


_IN_SERVER = False
"""True in the stage server and in the stages it forks (whose ``begin`` must not forward to it again)."""


def _is_stage_module(module: str) -> bool:
    """``flows.<stage>``: a stage flow (not the pipeline, not a private module)."""
    pkg, _, name = module.partition(".")
    return pkg == "flows" and bool(name) and "." not in name and not name.startswith("_") and name != "pipeline"


def _address(path: str) -> str | bytes:
    """The socket address of ``path``: ``@name`` is Linux's abstract namespace (no file anywhere)."""
    return b"\0" + path[1:].encode() if path.startswith("@") else path


def forward(module: str, args: list[str]) -> None:
    """Run the command ``python -m <module> <args>`` in the pipeline's stage server (named by ``DSM_STAGE_SERVER``)
    and exit with its status; return (and let the command run here as usual) when there is none or it refuses the
    request. Called by :func:`flows._common.begin` only."""
    pid_text, _, path = os.environ.get(ENV_VAR, "").partition(":")
    if not path or not pid_text.isdigit() or _IN_SERVER or not _is_stage_module(module):
        return
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(_address(path))
        who = peer(conn)
        if who is not None and who != (int(pid_text), os.getuid()):  # not the pipeline's server: send it nothing
            conn.close()
            print(f"stage server: {path} is served by pid {who[0]}, uid {who[1]}, not the pipeline's (pid {pid_text}, "
                  f"uid {os.getuid()}); running here", file=sys.stderr)
            return
        _send(conn, {"module": module, "args": args, "cwd": os.getcwd(), "env": dict(os.environ),
                     "executable": sys.executable, "pid": os.getpid()}, fds=(0, 1, 2))
        reply = _recv(conn)
    except (OSError, ConnectionError, ValueError):
        return
    if not reply.get("accepted"):
        conn.close()
        return
    pid = int(reply["pid"])

    def _pass_on(signum: int, _frame: Any) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _pass_on)
    parent = os.getppid()

    def _watch_parent() -> None:  # dvc killed while the stage runs: stop the stage instead of leaving it orphaned
        import time as _time

        while os.getppid() == parent:
            _time.sleep(0.5)
        _pass_on(signal.SIGTERM, None)

    import threading

    threading.Thread(target=_watch_parent, daemon=True).start()
    try:
        done = _recv(conn)
    except (OSError, ConnectionError, ValueError):  # the server died (kill -9): its stage must not run on unobserved
        _stop_orphan(pid, pid_text)
    code = int(done.get("exit", 1))
    if code < 0:  # killed by a signal: die of the same signal, as the child did (SIGKILL cannot be handled: as is)
        if code != -signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _stop_orphan(pid: int, server: str) -> None:
    """The stage server is gone while its fork ``pid`` ran this command: stop the fork (SIGTERM, then SIGKILL after 3
    s: it cleans up within seconds), say so, and exit with status 1."""
    from flows._process import terminate

    terminate([pid], grace_s=3.0)
    print(f"stage server: the pipeline's stage server (pid {server}) is gone; stopped this stage's process (pid {pid})",
          file=sys.stderr, flush=True)
    os._exit(1)


# ---------------------------------------------------------------------------------------------
# server


def _source_files() -> dict[str, float]:
    """mtime of every loaded module file of this project (flows/, stages/): a change makes the server refuse."""
    out = {}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and f.endswith(".py"):
            p = Path(f).resolve()
            if p.is_relative_to(_ROOT) and ".venv" not in p.parts:
                try:
                    out[str(p)] = p.stat().st_mtime
                except OSError:
                    pass
    return out


def _changed(files: dict[str, float]) -> str | None:
    for f, t in files.items():
        try:
            if os.stat(f).st_mtime != t:
                return f
        except OSError:
            return f
    return None


def _env_difference(a: dict[str, str], b: dict[str, str]) -> str | None:
    keys = {k for k in set(a) | set(b) if not k.startswith("DVC_") and k not in _IGNORED_ENV}
    diff = sorted(k for k in keys if a.get(k) != b.get(k))
    return ", ".join(diff[:5]) if diff else None


def _child(req: dict[str, Any], added: dict[str, str], fds: list[int], log: Any, server: int) -> None:
    """In the forked child: take over the client's stdio and environment (plus the variables the server's imports
    set, as the same imports would in a new process), run the module as __main__, exit with its status."""
    import atexit
    import runpy
    import traceback

    code: int = 1
    try:
        _stop_with_parent(server)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        log.close()
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for k, v in added.items():
            os.environ.setdefault(k, v)
        os.environ["DSM_CLIENT_PID"] = str(req.get("pid", ""))  # the command's own process (leases, interrupts)
        sys.argv = [req["module"], *req["args"]]
        sys.modules.pop(req["module"], None)  # imported by the server; runpy executes it afresh as __main__
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _stop_with_parent(server: int) -> None:
    """In a fork: SIGTERM when the server dies (Linux's parent-death signal), so a stage never outlives a killed
    server (its interrupt handler stops it within seconds); the server may already be gone, hence the check after."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != server:
        os.kill(os.getpid(), signal.SIGTERM)


def _preload(modules: Sequence[str]) -> None:
    """Import the stage flows and, for each ``flows.<stage>``, its ``stages.<stage>`` (the flows import their stage
    only when they run, so that ``--help`` needs no torch)."""
    import importlib
    import importlib.util

    for m in modules:
        importlib.import_module(m)
        stage = "stages." + m.partition(".")[2]
        if _is_stage_module(m) and importlib.util.find_spec(stage) is not None:
            importlib.import_module(stage)


def serve(sock_path: str, modules: Sequence[str], log_path: str | None = None) -> None:
    """The server's main loop (``python -m flows._stage_server SOCKET LOG MODULE...``): import ``modules`` (and
    their stages), then serve one request at a time until stopped (SIGTERM) or its parent process is gone."""
    global _IN_SERVER
    _IN_SERVER = True
    log = open(log_path or os.devnull, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    parent = os.getppid()
    env = dict(os.environ)  # what a stage process starts with; importing the stages may add variables
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if not sock_path.startswith("@") and os.path.exists(sock_path):
        os.unlink(sock_path)
    listener.bind(_address(sock_path))
    listener.listen(16)
    t0 = time.perf_counter()
    _preload(modules)
    added = {k: v for k, v in os.environ.items() if env.get(k) != v}
    files = _source_files()
    print(f"ready: {len(modules)} modules, {len(files)} project files in {time.perf_counter() - t0:.1f} s; "
          f"native threads {_native_threads()}", file=log)
    listener.settimeout(1.0)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        while os.getppid() == parent:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                who = peer(conn)
                if who is not None and (who[1] != os.getuid() or not _descends_from(who[0], parent)):
                    print(f"refused a connection from pid {who[0]}, uid {who[1]}: not this pipeline's", file=log)
                    continue
                conn.settimeout(REQUEST_TIMEOUT_S)
                _handle(conn, env, added, files, listener, log)
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
        if not sock_path.startswith("@"):
            with contextlib.suppress(OSError):
                os.unlink(sock_path)
        log.close()
    # nothing to flush or tear down (the server ran no stage itself): skip the interpreter's exit hooks of the
    # imported libraries, which take seconds on a loaded machine
    os._exit(0)


def _native_threads() -> int:
    """Threads of this process, native ones included (logged; torch's import starts one, which a fork does not need:
    the child's torch runs its own intra-op threads)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _handle(conn: socket.socket, env: dict[str, str], added: dict[str, str], files: dict[str, float],
            listener: socket.socket, log: Any) -> None:
    import threading

    fds: list[int] = []
    try:
        req = _recv(conn, fds)
    except (OSError, ConnectionError, ValueError) as e:
        print(f"bad request: {e}", file=log)
        for fd in fds:
            os.close(fd)
        return
    why = None
    if len(fds) != 3:
        why = f"expected 3 file descriptors, got {len(fds)}"
    elif req.get("executable") != sys.executable:
        why = f"another interpreter ({req.get('executable')})"
    elif os.path.realpath(req.get("cwd", "")) != os.path.realpath(os.getcwd()):
        why = f"another working directory ({req.get('cwd')})"
    elif not _is_stage_module(str(req.get("module", ""))):
        why = f"not a stage flow ({req.get('module')})"
    elif (d := _env_difference(req.get("env", {}), env)) is not None:
        why = f"another environment ({d})"
    elif (f := _changed(files)) is not None:
        why = f"{f} changed since the server started"
    elif threading.active_count() != 1:  # native threads of the imports (torch starts one) are fork-safe
        why = "a Python thread is running in the server (fork would be unsafe)"
    if why is not None:
        print(f"refused {req.get('module')}: {why}", file=log)
        _send(conn, {"accepted": False})
        for fd in fds:
            os.close(fd)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        _child(req, added, fds, log, server)
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    _send(conn, {"accepted": True, "pid": pid})
    status = _wait_child(pid, conn)
    code = os.waitstatus_to_exitcode(status)
    print(f"ran {req['module']} {' '.join(req['args'])}: exit {code} in {time.perf_counter() - t0:.1f} s", file=log)
    try:
        _send(conn, {"exit": code})
    except OSError:
        pass


def _wait_child(pid: int, conn: socket.socket) -> int:
    """Wait for the forked stage; if its client process goes away meanwhile (killed, or its dvc parent was), the
    stage is told to stop (SIGTERM: it cleans up and exits within seconds) instead of running on unobserved."""
    import select

    told = False
    while True:
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            return status
        if told:
            time.sleep(0.1)
            continue
        readable, _, _ = select.select([conn], [], [], 0.25)
        if readable:
            try:
                gone = conn.recv(1) == b""
            except OSError:
                gone = True
            if gone:
                told = True
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


class StageServer:
    """Start / stop the stage server for one pipeline run (sets ``DSM_STAGE_SERVER`` for the stage processes).

    ``modules``: what to import up front (the stage flows that will run). Start it after every environment variable
    the stages need is set (the server refuses a request whose environment differs)."""

    def __init__(self, modules: Sequence[str], run_dir: str | os.PathLike[str]) -> None:
        self.modules = list(modules)
        self.dir = Path(run_dir)
        # Linux: an abstract socket (no file, gone with the server) with a random name; elsewhere a socket file in a
        # private temporary directory (a unix socket path is limited to ~100 characters)
        name = f"dsm-stage-server-{secrets.token_hex(16)}"
        self.sock = f"@{name}" if sys.platform.startswith("linux") else \
            os.path.join(tempfile.mkdtemp(prefix="dsm-"), "stage-server.sock")
        self.log = str(self.dir / "stage-server.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StageServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        # a session of its own: a Ctrl-C in the terminal reaches the pipeline (which stops it) and the stage
        # commands, not the server in the middle of waiting for one
        self.proc = subprocess.Popen([sys.executable, "-m", "flows._stage_server", self.sock, self.log, *self.modules],
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"), start_new_session=True)  # noqa: SIM115  (a fresh log per run)
        os.environ[ENV_VAR] = f"{self.proc.pid}:{self.sock}"
        return self

    def summary(self) -> str:
        """One line: how many stage commands the server ran, and the ones it refused (with why)."""
        try:
            lines = Path(self.log).read_text(encoding="utf-8").splitlines()
        except OSError:
            return "stage server: no log"
        ran = [x for x in lines if x.startswith("ran ")]
        refused = [x.removeprefix("refused ") for x in lines if x.startswith("refused ")]
        out = f"stage server: ran {len(ran)} stage command(s)"
        return out + (f"; {len(refused)} ran on their own: " + "; ".join(refused) if refused else "")

    def stop(self) -> None:
        os.environ.pop(ENV_VAR, None)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
        if not self.sock.startswith("@"):
            with contextlib.suppress(OSError):
                os.unlink(self.sock)
                os.rmdir(os.path.dirname(self.sock))

    def __enter__(self) -> StageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    # through the importable module: its _IN_SERVER is the one flows._common.begin's forward() reads in the forks
    from flows._stage_server import serve as _serve

    _serve(sys.argv[1], sys.argv[3:], log_path=sys.argv[2])

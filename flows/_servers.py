"""The project's Prefect API server, shared by every stage of a run and started on demand, for
``python -m flows.pipeline`` and for a plain ``dvc repro`` alike.

Why: a Prefect flow needs an API. Without ``PREFECT_API_URL``, Prefect starts a temporary server inside every flow
process (seconds each, more on a fresh ``.prefect/`` while the database is created), so a plain ``dvc repro`` of
the default pipeline's twelve stage commands would pay it twelve times.

How: the first stage process that needs the API (:func:`api_url`) starts ``python -m flows._servers api PORT`` in a
session of its own and records it in ``.prefect/servers/api.json``; later stage processes find it there and use it.
Each process using it holds a *lease* (``.prefect/servers/leases/<pid>.json``) naming itself and its *owner*: the
``dvc`` (or ``python -m flows.pipeline``) process that runs it, found among its ancestors. The server stops by itself
:data:`GRACE_S` seconds after the last lease's client and owner are gone (``dvc repro`` finished or was killed), or
after ``DSM_SERVER_IDLE_S`` seconds (default :data:`IDLE_S`) without any client process, and removes its record.
A server that does not answer its health check is replaced (and terminated when it is still alive).
``PREFECT_API_URL`` set by the user (a ``prefect server start`` of their own, a Prefect Cloud workspace) is used as
is and nothing is started. (The stage server, flows/_stage_server.py, is the pipeline's own: it starts and stops it.)

Only its owner: a loopback port is open to every user of the machine. The server requires a random
``user:password`` on every request but the health check (Prefect's ``PREFECT_SERVER_API_AUTH_STRING``; its clients send
``PREFECT_API_AUTH_STRING``), which lives in the record, in a directory only its owner can read (PREFECT_HOME and its
``servers/`` are made 0700, the record 0600); a record is trusted only when this uid wrote it, and a server only when
the process it names holds the socket listening on its port (/proc/net/tcp), checked before anything is sent to it, so
a listener another user put on the port first is never taken for it.

Records name processes by pid *and* start time: the server's record and every lease hold the start time of
the processes they name (flows/_process.py :func:`~flows._process.same_process`), so a record whose process died is
stale even when another process, of this user or another, got its pid since; nothing is sent to, waited for or
killed on the word of such a record. A server stops only when no lease holds it: the pipeline releases its own at its
end and stops the server only when no other process holds one (:func:`stop_servers_of`), so a stage run by hand, or
another run sharing ``PREFECT_HOME``, keeps it. A client that started the server watches it (:func:`api_gone`): one
that dies fails the run within seconds, named by how it ended.

Nothing here changes what a stage computes (dvc.yaml does not list it as a code dep).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from flows._process import (
    alive,
    command_line,
    free_port,
    how_it_ended,
    parent_of,
    same_process,
    shared_server,
    start_time,
)

GRACE_S = 1.0
"""A server outlives its last client and owner by this long (the gap between two stage commands of a run is
covered by the owner, the dvc process, which lives across them)."""
IDLE_S = 300.0
"""A server with live owners but no client for this long stops anyway (``DSM_SERVER_IDLE_S`` overrides)."""
STARTUP_TIMEOUT_S = 120.0
_SHELLS = {"sh", "bash", "dash", "zsh", "fish", "ksh"}
_ROOT = Path(__file__).resolve().parent.parent
AUTH_VAR = "PREFECT_API_AUTH_STRING"
"""What a Prefect client sends (HTTP basic auth) to the project's API server, which requires it."""


def state_dir() -> Path:
    """``.prefect/servers`` under PREFECT_HOME (the project's ``.prefect`` unless the user set another)."""
    return Path(os.environ.get("PREFECT_HOME", str(_ROOT / ".prefect"))) / "servers"


def _private(d: Path) -> None:
    """Make a directory of this uid readable by it alone (PREFECT_HOME holds the database and the servers' records)."""
    with contextlib.suppress(OSError):
        st = d.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            d.chmod(stat.S_IMODE(st.st_mode) & 0o700)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    _private(d.parent)
    _private(d)
    with open(d / "lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(name: str) -> dict[str, Any] | None:
    """A record of this uid (one another user wrote is ignored)."""
    try:
        with open(state_dir() / name, encoding="utf-8") as f:
            return json.loads(f.read()) if os.fstat(f.fileno()).st_uid == os.getuid() else None
    except (OSError, ValueError):
        return None


def _write(name: str, info: dict[str, Any]) -> None:
    f = state_dir() / name
    tmp = f.with_name(f".{name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as out:
        out.write(json.dumps(info) + "\n")
    os.replace(tmp, f)


def listener_uid(port: int) -> int | None:
    """The uid of the socket listening on 127.0.0.1:``port`` (None: none, or no /proc/net/tcp to tell)."""
    return next((uid for uid, _ in _listeners(port)), None)


def _listeners(port: int) -> list[tuple[int, str]]:
    """(uid, inode) of every socket listening on 127.0.0.1:``port`` or 0.0.0.0:``port`` (/proc/net/tcp)."""
    out = []
    with contextlib.suppress(OSError):
        with open("/proc/net/tcp", encoding="ascii") as f:
            for line in f.readlines()[1:]:
                x = line.split()
                addr, _, hexport = x[1].partition(":")
                if x[3] == "0A" and int(hexport, 16) == port and addr in ("0100007F", "00000000"):
                    out.append((int(x[7]), x[9]))
    return out


def serves(pid: int, port: int) -> bool:
    """Process ``pid`` of this uid holds the (only) socket listening on 127.0.0.1:``port``. Where there is no
    /proc/net/tcp (not Linux) it cannot be told, and True is returned (the auth string still guards the state)."""
    if not os.path.exists("/proc/net/tcp"):
        return True
    found = _listeners(port)
    if len(found) != 1 or found[0][0] != os.getuid():
        return False
    want = f"socket:[{found[0][1]}]"
    with contextlib.suppress(OSError):
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == want for fd in os.listdir(f"/proc/{pid}/fd"))
    return False


def auth_header() -> dict[str, str]:
    """The HTTP header this process's Prefect client sends (for the few requests made without Prefect's client)."""
    auth = os.environ.get(AUTH_VAR)
    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}


def settings_updates(url: str) -> dict[Any, Any]:
    """``temporary_settings`` updates for the API at ``url`` (its auth string, as :func:`start_api` set it)."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

    return {PREFECT_API_URL: url, PREFECT_API_AUTH_STRING: os.environ.get(AUTH_VAR)}


def _trusted(info: dict[str, Any] | None, module: str = "flows._servers") -> bool:
    """The record names a live process of this user that started when the record says (not one that got the pid of
    a dead server since) and runs ``python -m <module>``."""
    if info is None:
        return False
    pid = int(info.get("pid", 0))
    return pid > 0 and same_process(pid, info.get("start")) and module in command_line(pid)


# ---------------------------------------------------------------------------------------------
# leases


def owner_of(pid: int) -> int | None:
    """The ``dvc`` / ``python -m flows.pipeline`` process running ``pid`` (its nearest such ancestor, shells
    skipped), or None when it was started otherwise (a terminal, a test)."""
    p = parent_of(pid)
    for _ in range(6):
        if p is None or p <= 1:
            return None
        cmd = command_line(p)
        exe = os.path.basename(cmd[0]) if cmd else ""
        if exe in _SHELLS:
            p = parent_of(p)
            continue
        words = [os.path.basename(a) for a in cmd[:4]]
        if "dvc" in words or "flows.pipeline" in cmd or ("-m" in cmd and "dvc" in cmd):
            return p
        return None
    return None


def take_lease(client: int | None = None, owner: int | None = None) -> None:
    """Record that ``client`` (default: this process) uses the project servers, on behalf of ``owner`` (default: its
    dvc / pipeline ancestor). Released by :func:`release_lease` or when both processes are gone."""
    client = os.getpid() if client is None else client
    if owner is None:
        start = int(os.environ.get("DSM_CLIENT_PID", client))  # a stage forked by the stage server: its client's
        owner = owner_of(start)
    d = state_dir() / "leases"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{client}.json").write_text(json.dumps({"client": client, "client_start": start_time(client), "owner": owner,
                                                  "owner_start": None if owner is None else start_time(owner)}) + "\n")


def release_lease(client: int | None = None) -> None:
    with contextlib.suppress(OSError):
        (state_dir() / "leases" / f"{os.getpid() if client is None else client}.json").unlink()


def _lease_records() -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every readable lease file of the project and its record (unreadable ones are skipped)."""
    d = state_dir() / "leases"
    for f in d.glob("*.json") if d.is_dir() else []:
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        yield f, info


def _live(info: dict[str, Any], who: str) -> bool:
    """The lease's ``client`` or ``owner`` is the live process it names (pid and start time)."""
    pid = info.get(who)
    return pid is not None and same_process(int(pid), info.get(f"{who}_start"))


def leases() -> tuple[bool, bool]:
    """(some lease's client or owner is alive, some lease's client is alive); stale lease files are removed."""
    any_alive = any_client = False
    for f, info in _lease_records():
        c, o = _live(info, "client"), _live(info, "owner")
        any_client |= c
        any_alive |= c or o
        if not (c or o):
            with contextlib.suppress(OSError):
                f.unlink()
    return any_alive, any_client


def watch_leases(stop: Callable[[], None], started: float | None = None, interval_s: float = 0.25) -> threading.Thread:
    """A daemon thread that calls ``stop()`` once the server is not needed any more (module docstring)."""
    idle_s = float(os.environ.get("DSM_SERVER_IDLE_S", IDLE_S))

    def run() -> None:
        last_any = last_client = started or time.monotonic()
        while True:
            time.sleep(interval_s)
            now = time.monotonic()
            any_alive, any_client = leases()
            if any_alive:
                last_any = now
            if any_client:
                last_client = now
            if now - last_any > GRACE_S or now - last_client > idle_s:
                stop()
                return

    t = threading.Thread(target=run, name="watch-leases", daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------------------------
# the Prefect API server


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False



def _spawn(args: Sequence[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # not DVC's variables: a server outlives the stage command that starts it (and flows/__init__.py must not take
    # the server for a stage command)
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("DVC_")}
    log = open(state_dir() / log_name, "ab")  # noqa: SIM115 (handed to the child)
    try:
        return subprocess.Popen([sys.executable, *args], cwd=str(_ROOT), env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    finally:
        log.close()


def api_url(*, take: bool = True) -> str:
    """The Prefect API for this process: ``PREFECT_API_URL`` when set, else the project's shared server (started
    here when none answers; its auth string is then set in this process's environment, :data:`AUTH_VAR`). Takes a
    lease on it unless ``take`` is false."""
    url, wait = start_api(take=take)
    wait()
    return url


def start_api(*, take: bool = True) -> tuple[str, Callable[[], None]]:
    """:func:`api_url` in two steps: the URL now (a server is started when none answers), and a function that
    waits until it answers (so the caller can do other work, e.g. start the stage server, meanwhile)."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"], lambda: None
    with _locked():
        if take:
            take_lease()
        info = _read("api.json")
        if _trusted(info):  # else stale (its server is gone, whoever has its pid now): replaced, nobody killed
            assert info is not None
            pid, url = int(info["pid"]), str(info["url"])
            os.environ[AUTH_VAR] = str(info.get("auth", ""))
            _using.update(pid=pid, start=info.get("start"), proc=None)
            if serves(pid, _port(url)) and _healthy(url, timeout=2.0):
                return url, lambda: None
            if time.time() - float(info.get("started", 0)) < STARTUP_TIMEOUT_S:
                return url, lambda: _wait_healthy(url, pid)  # another stage process is starting it right now
            from flows._process import terminate

            terminate([pid], grace_s=2.0)  # a wedged server (e.g. one whose clients were killed with kill -9)
        port = free_port()
        url = f"http://127.0.0.1:{port}/api"
        auth = f"dsm:{secrets.token_urlsafe(24)}"
        proc = _spawn(["-m", "flows._servers", "api", str(port)], "api.log",
                      env={**os.environ, "PREFECT_SERVER_API_AUTH_STRING": auth})
        shared_server(proc.pid)
        _using.update(pid=proc.pid, start=start_time(proc.pid), proc=proc)
        _write("api.json", {"pid": proc.pid, "start": _using["start"], "url": url, "started": time.time(),
                            "auth": auth})
        os.environ[AUTH_VAR] = auth
    return url, lambda: _wait_healthy(url, proc.pid, proc)


_using: dict[str, Any] = {"pid": None, "start": None, "proc": None}
"""The API server this process uses (found or started by :func:`start_api`), for :func:`api_gone`."""


def api_gone() -> str | None:
    """Why the API server this process uses is gone (``the Prefect API server (pid N) was killed by SIGKILL ...``),
    or None while it runs (or when the user's own ``PREFECT_API_URL`` is used: nothing to watch)."""
    pid, proc = _using["pid"], _using["proc"]
    if pid is None:
        return None
    if proc is not None:  # started here: its exit status says how it ended
        code = proc.poll()
        return None if code is None else f"the Prefect API server (pid {pid}) {how_it_ended(code)}"
    return None if same_process(pid, _using["start"]) else f"the Prefect API server (pid {pid}) is gone"


def _port(url: str) -> int:
    return int(url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[1])


def _wait_healthy(url: str, pid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    t0 = time.monotonic()
    port = _port(url)
    while time.monotonic() - t0 < STARTUP_TIMEOUT_S:
        if (proc.poll() is not None) if proc is not None else not alive(pid):
            other = listener_uid(port)
            raise RuntimeError((f"127.0.0.1:{port} was taken by another process (uid {other}) before the Prefect API "
                                "server could listen on it; not using it (run again)") if other is not None else
                               f"the Prefect API server exited (status {proc.returncode if proc else '?'}); see "
                               f"{state_dir() / 'api.log'}")
        if serves(pid, port) and _healthy(url, timeout=1.0):  # nothing is sent to a listener that is not the server
            return
        time.sleep(0.1)
    raise RuntimeError(f"the Prefect API server did not answer within {STARTUP_TIMEOUT_S:.0f} s; see "
                       f"{state_dir() / 'api.log'}")


def stop_servers(started_after: float | None = None, grace_s: float = 5.0, keep: int | None = None) -> None:
    """Stop the project's API server now (the pipeline does at its end; ``started_after``: only if it started it).
    ``keep``: a server left running."""
    from flows._process import terminate

    pids = []
    for name, module in (("api.json", "flows._servers"),):
        info = _read(name)
        if info is None:
            continue
        pid = int(info["pid"])
        if started_after is not None and float(info.get("started", 0)) < started_after:
            continue
        if pid == keep:
            continue
        if _trusted(info, module):
            pids.append(pid)
        with contextlib.suppress(OSError):
            (state_dir() / name).unlink()
    terminate(pids, grace_s=grace_s)


def stop_servers_of(owner: int | None) -> None:
    """Stop the project's servers now when every process using them works for ``owner`` (the dvc run a stage
    command belongs to): a stage interrupted under ``dvc repro`` ends that run, so its servers go with it instead
    of idling out. Servers that other runs (other owners, live clients) use are left alone."""
    if owner is None:
        return
    for _, info in _lease_records():
        c, o = int(info["client"]), info.get("owner")
        if (_live(info, "client") and c != os.getpid() and o != owner) or (o is not None and o != owner
                                                                           and _live(info, "owner")):
            return
    _using.update(pid=None, proc=None)  # stopped on purpose: not "gone"
    stop_servers(grace_s=0.8, keep=os.getppid())


def serve_api(port: int) -> None:
    """``python -m flows._servers api PORT``: the Prefect API (as Prefect's own temporary server runs it: no UI, no
    background services) until the leases say it is not needed."""
    os.environ.update({"PREFECT_UI_ENABLED": "0", "PREFECT_SERVER_UI_ENABLED": "false", "PREFECT__SERVER_EPHEMERAL": "1",
                       "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    started = time.monotonic()
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                            log_level="error", lifespan="on")
    server = uvicorn.Server(config)

    def stop() -> None:
        server.should_exit = True

    watch_leases(stop, started=started)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} serving the Prefect API at http://127.0.0.1:{port}/api "
          f"(pid {os.getpid()})", file=sys.stderr, flush=True)
    try:
        server.run()
    finally:
        info = _read("api.json")
        if info is not None and int(info["pid"]) == os.getpid():
            with contextlib.suppress(OSError):
                (state_dir() / "api.json").unlink()
    sys.stderr.flush()
    os._exit(0)  # uvicorn has shut the app down (database closed); the libraries' exit hooks only cost time


def main(argv: list[str]) -> int:
    if argv[:1] == ["api"] and len(argv) == 2:
        serve_api(int(argv[1]))
        return 0
    print("usage: python -m flows._servers api PORT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

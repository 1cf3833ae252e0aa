"""The project's Prefect API server (flows/_servers.py) under a plain ``dvc repro``: one for every stage of the run,
started on demand, gone shortly after the run; no stage server (the fork server is the pipeline's alone); a stale
record (its server killed with kill -9) is replaced; another local user can neither use the server nor pass his
listener off as it (issue 46); the server stops only when no lease holds it, and a record naming a pid that
another process got since is not trusted (issue 50)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows._project import env, make_project, processes_in, run, wait_gone

pytestmark = pytest.mark.slow  # Prefect API server starts and a plain dvc repro: ~32 s on 2 cores; .ci/slow robustness (the suite stays under 10 min)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("servers") / "proj")


def test_plain_dvc_repro_shares_one_api_server_and_no_stage_server(project: Path) -> None:
    # the two cheapest stages (no torch): what is tested is the servers, not the stages' work
    out = run(["dvc", "repro", "data", "testsets@generated"], project, env(), timeout=900)
    text = out.stdout + out.stderr
    assert "Running stage 'data'" in text and "Running stage 'testsets@generated'" in text
    servers = project / ".prefect" / "servers"
    started = [x for x in (servers / "api.log").read_text().splitlines() if "serving the Prefect API" in x]
    assert len(started) == 1, started  # both stages' flow runs in one API server
    assert not list(servers.glob("stage*")), list(servers.iterdir())  # no stage server, no record of one
    assert wait_gone(project, 10.0) == [], processes_in(project)  # the API server stopped once the run was over
    assert not list((servers / "leases").glob("*.json"))
    assert not (servers / "api.json").exists()
    # the runs stay in the project's Prefect database, which `prefect server start` with the project's PREFECT_HOME
    # serves (README: seeing the runs in Prefect's UI); the run links point at that UI
    with sqlite3.connect(project / ".prefect" / "prefect.db") as db:
        flows = {r[0] for r in db.execute("SELECT flow.name FROM flow_run JOIN flow ON flow.id = flow_run.flow_id")}
    assert {"data", "testsets"} <= flows, flows
    assert "View at http://127.0.0.1:4200/runs/flow-run/" in text


def test_a_stale_server_record_is_replaced(project: Path) -> None:
    servers = project / ".prefect" / "servers"
    servers.mkdir(parents=True, exist_ok=True)
    (servers / "api.json").write_text(json.dumps({"pid": 2**22 - 7, "url": "http://127.0.0.1:9/api", "started": 0}))
    out = run(["dvc", "repro", "-f", "data"], project, env(), timeout=900)
    assert "Running stage 'data'" in out.stdout and "127.0.0.1:9/" not in out.stdout
    assert wait_gone(project, 10.0) == [], processes_in(project)


LISTENER = ("import select, socket, sys\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen(8)\n"
            "print(s.getsockname()[1], flush=True)\ngot = b''\nconns = []\nwhile True:\n"
            "    r, _, _ = select.select([s, sys.stdin, *conns], [], [], 120)\n    if sys.stdin in r or not r:\n"
            "        break\n    for c in r:\n        if c is s:\n            conns.append(s.accept()[0])\n"
            "        else:\n            data = c.recv(65536)\n            got += data\n"
            "            if not data:\n                conns.remove(c)\nprint(len(got), flush=True)\n")
"""Another user's listener on a free port (printed first): it counts the bytes any connection sends it and prints
the count when its stdin closes (a squatter hoping to be taken for the project's API server)."""


PROBE_API = r'''
import json, sys, urllib.request, urllib.error
url, home = sys.argv[1], sys.argv[2]
def call(path, body=None):
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
out = {"read flow runs": call("/flow_runs/filter", {}), "read artifacts": call("/artifacts/filter", {}),
       "write a flow": call("/flows/", {"name": "planted"}), "health": call("/health")}
for f in ("prefect.db", "servers/api.json"):
    try:
        open(f"{home}/{f}").read(1)
        out[f] = "read"
    except OSError as e:
        out[f] = type(e).__name__
print(json.dumps(out))
'''


def test_another_user_can_neither_read_nor_write_the_prefect_state(other_user, tmp_path: Path, monkeypatch) -> None:
    """Issue 46: the project's API server listens on a loopback port, open to every user; every request but the
    health check needs its auth string, which only its owner can read."""
    from flows import _servers

    home = tmp_path / ".prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(_servers.AUTH_VAR, raising=False)
    tmp_path.chmod(0o755)
    try:
        url = _servers.api_url()
        res = other_user.python_code(PROBE_API, url, str(home))
    finally:
        _servers.stop_servers()
        _servers.release_lease()
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"read flow runs": 401, "read artifacts": 401, "write a flow": 401, "health": 200,
                                      "prefect.db": "PermissionError", "servers/api.json": "PermissionError"}


def test_a_port_taken_by_another_user_is_not_used_as_the_api(other_user, tmp_path: Path, monkeypatch) -> None:
    """Issue 46: another user listening first on the port picked for the API server gets nothing (no request, no
    auth string), and the run stops with one line saying so."""
    from flows import _servers

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(_servers.AUTH_VAR, raising=False)
    racer = other_user.popen([other_user.python, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        port = int(racer.stdout.readline())
        monkeypatch.setattr(_servers, "free_port", lambda: port)
        url, wait = _servers.start_api()
        with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{port} was taken by another process \(uid "
                                               rf"{other_user.uid}\) .* not using it"):
            wait()
    finally:
        _servers.stop_servers()
        _servers.release_lease()
    assert racer.communicate(input="", timeout=90)[0].strip() == "0"  # not a byte reached him


def test_the_api_server_stops_only_when_no_lease_holds_it(tmp_path: Path, monkeypatch) -> None:
    """Issue 50: a run that ends (the pipeline's release: its lease given up, the server stopped unless leased) leaves
    the server to a process that still holds a lease (a stage run by hand, another run sharing PREFECT_HOME); the
    server stops by itself once that process is gone."""
    from flows import _process, _servers

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(_servers.AUTH_VAR, raising=False)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        url = _servers.api_url()
        pid = json.loads((tmp_path / ".prefect" / "servers" / "api.json").read_text())["pid"]
        _servers.take_lease(client=other.pid, owner=None)  # the other process's lease
        _servers.release_lease()
        _servers.stop_servers_of(os.getpid())  # what the pipeline does at its end
        assert _process.alive(pid) and _servers._healthy(url)
        assert _servers.api_gone() is None
        other.kill()
        other.wait()
        t0 = time.monotonic()
        while _process.alive(pid) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert not _process.alive(pid), "the server outlived its last lease"
        assert time.monotonic() - t0 < 3.0  # GRACE_S after the last lease's process
    finally:
        other.kill()
        _servers.stop_servers()
        _servers.release_lease()


def test_a_stale_record_naming_a_reused_pid_is_not_trusted(other_user, tmp_path: Path, monkeypatch) -> None:
    """Issue 50: the record of a server killed with kill -9 names a pid that another process got since: another
    user's listener (with the server's command line, on the recorded port), or a process of this user's. Neither is
    sent a request, waited for or killed; a new server is started."""
    from flows import _process, _servers

    home = tmp_path / ".prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(_servers.AUTH_VAR, raising=False)
    his = other_user.popen([other_user.python, "-c", LISTENER, "-m", "flows._servers", "api"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "flows._servers", "api"])
    try:
        port = int(his.stdout.readline())
        (home / "servers").mkdir(parents=True)
        for pid in (his.pid, mine.pid):  # the very start time of the process holding the pid: owner decides, or start
            start = _process.start_time(pid) - (1 if pid == mine.pid else 0)
            (home / "servers" / "api.json").write_text(json.dumps({
                "pid": pid, "start": start, "url": f"http://127.0.0.1:{port}/api", "started": time.time(),
                "auth": "dsm:x"}))
            (home / "servers" / "api.json").chmod(0o600)
            url = _servers.api_url()
            assert f":{port}/" not in url and _servers._healthy(url)
            assert his.poll() is None and mine.poll() is None  # neither was killed
            _servers.stop_servers()
        assert his.communicate(input="", timeout=60)[0].strip() == "0"  # not a byte reached him
    finally:
        his.kill()
        mine.kill()
        _servers.stop_servers()
        _servers.release_lease()

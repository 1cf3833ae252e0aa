"""The pipeline's servers serve only their owner, and its clients talk only to theirs (issue 46), against a second,
non-root local user (tests/other_user.py): the stage server (flows/_stage_server.py) closes another user's connection
unread and unanswered (so he can neither run a stage, nor learn what it expects, nor stall the pipeline by holding a
connection); a stage command sends nothing to a socket another user bound under the name it was given; a listener
another user put on a port is never taken for the project's Prefect API server (flows/_servers.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from flows import _servers
from flows._stage_server import ENV_VAR, StageServer

ROOT = Path(__file__).resolve().parents[2]

ATTACKER = r'''
import array, json, os, socket, struct, sys, time
name = sys.argv[1]
def attempt(request):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + name)
    data = json.dumps(request).encode()
    try:
        s.sendmsg([struct.pack("!I", len(data)) + data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    except OSError as e:
        return {"sent": False, "error": e.errno}
    s.settimeout(10)
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError as e:
        return {"got": got.decode(errors="replace"), "error": e.errno}
    return {"got": got.decode(errors="replace"), "closed": True}
leak = {"module": "flows.testsets", "args": ["--name", "leak", "--params", "/tmp/his-params.yaml"], "cwd": "/",
        "env": {"PATH": "/usr/bin"}, "executable": sys.executable, "pid": os.getpid()}
print(json.dumps({"listed": name in open("/proc/net/unix").read(), "run a stage": attempt(leak),
                  "learn from refusals": attempt(dict(leak, module="flows.data"))}), flush=True)
'''

HOLDER = r'''
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\0" + sys.argv[1])
t = time.monotonic()
s.settimeout(60)
print(s.recv(1) == b"", round(time.monotonic() - t, 2), flush=True)  # hold it until the server closes it
'''

SQUATTER = r'''
import json, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\0" + sys.argv[1])
srv.listen(4)
print("bound", flush=True)
srv.settimeout(30)
seen = {"connections": 0, "bytes": 0, "fds": 0}
try:
    conn, _ = srv.accept()
    seen["connections"] += 1
    conn.settimeout(5)
    while True:
        msg, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(64))
        seen["fds"] += sum(len(data) // 4 for level, kind, data in anc if kind == socket.SCM_RIGHTS)
        if not msg:
            break
        seen["bytes"] += len(msg)
except OSError:
    pass
print(json.dumps(seen), flush=True)
'''


def _wait_ready(server: StageServer) -> None:
    t0 = time.monotonic()
    while "ready:" not in Path(server.log).read_text() and time.monotonic() - t0 < 60:
        time.sleep(0.05)


def test_the_stage_server_serves_no_other_user(other_user, tmp_path: Path, monkeypatch) -> None:
    """He finds the socket (/proc/net/unix), asks it to run a stage, learns nothing from its refusals, and holding a
    connection open holds nothing up: closed at once (the pipeline's own commands: tests/flows/test_stage_server.py)."""
    monkeypatch.chdir(ROOT)
    server = StageServer(["json"], tmp_path).start()
    try:
        _wait_ready(server)
        name = server.sock[1:]
        assert len(name) == len("dsm-stage-server-") + 32  # 128 random bits: nobody binds it first
        held = other_user.python_code(HOLDER, name)
        res = other_user.python_code(ATTACKER, name)
        assert res.returncode == 0 and held.returncode == 0, res.stderr + held.stderr
        seen = json.loads(res.stdout)
    finally:
        server.stop()
    log = Path(server.log).read_text()
    assert seen["listed"]  # the name is no secret: the credentials decide
    for attempt in ("run a stage", "learn from refusals"):  # closed unread: not a byte back
        assert seen[attempt].get("got", "") == "", seen
    closed, after_s = held.stdout.split()
    assert closed == "True" and float(after_s) < 5, held.stdout  # never waited on
    refused = [x for x in log.splitlines() if x.startswith("refused a connection")]
    assert len(refused) == 3 and all(f"uid {other_user.uid}: not this pipeline's" in x for x in refused), log
    assert "ran " not in log


def test_a_stage_command_sends_nothing_to_a_squatted_name(other_user, monkeypatch, capsys) -> None:
    """He binds the name a stage command is given first: the command checks who listens before it sends anything
    (here in this process: flows._common.begin's forward, which returns to run the command itself)."""
    from flows import _stage_server

    name = f"dsm-stage-server-squatted-{os.getpid()}"
    squatter = other_user.popen([other_user.python, "-c", SQUATTER, name], stdout=subprocess.PIPE)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        monkeypatch.setenv(ENV_VAR, f"{os.getpid()}:@{name}")
        monkeypatch.setenv("HF_TOKEN", "hf_secret_of_the_victim")
        _stage_server.forward("flows.data", ["--help"])  # returns: the command runs here
        seen = json.loads(squatter.communicate(timeout=60)[0])
    finally:
        squatter.kill()
    assert f"uid {other_user.uid}, not the pipeline's" in capsys.readouterr().err
    assert seen == {"connections": 1, "bytes": 0, "fds": 0}  # no environment, no descriptor


def test_a_listener_of_another_user_is_not_taken_for_the_api_server(other_user) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listener = other_user.popen([other_user.python, "-c", "import socket, sys, time\ns = socket.socket()\n"
                                 "s.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen(1)\nprint('up', flush=True)\n"
                                 "time.sleep(60)", str(port)], stdout=subprocess.PIPE)
    try:
        assert listener.stdout.readline().strip() == "up"
        assert _servers.listener_uid(port) == other_user.uid
        assert not _servers.serves(listener.pid, port) and not _servers.serves(os.getpid(), port)
    finally:
        listener.kill()
        listener.wait()
    with socket.socket() as own:
        own.bind(("127.0.0.1", 0))
        own.listen(1)
        assert _servers.serves(os.getpid(), own.getsockname()[1])

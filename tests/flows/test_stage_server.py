"""The pipeline's stage server (flows/_stage_server.py): a ``python -m flows.<stage>`` command offered to it runs in
a fork with the command's own stdout / stderr, arguments and exit status; a request whose environment differs
from the server's runs on its own instead; nothing is offered without the pipeline's variable, nor on import."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from flows._stage_server import ENV_VAR, StageServer

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def _wait_ready(server: StageServer) -> None:
    t0 = time.monotonic()
    while "ready:" not in Path(server.log).read_text() and time.monotonic() - t0 < 60:
        time.sleep(0.05)


def test_stage_commands_run_in_the_server_with_their_output_and_status(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the server serves the working directory it was started in
    server = StageServer(["json"], tmp_path).start()
    try:
        _wait_ready(server)
        env = dict(os.environ)
        assert env[ENV_VAR] == f"{server.proc.pid}:{server.sock}"
        ok = _run(["flows.data", "--help"], env)  # argparse: usage on stdout, exit 0
        assert ok.returncode == 0 and "Run the data stage as a Prefect flow" in ok.stdout, ok.stderr
        bad = _run(["flows.data", "--params", str(tmp_path / "missing.yaml")], env)  # one-line error, exit 2
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "missing.yaml" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        other = _run(["flows.data", "--help"], dict(env, SOME_NEW_VARIABLE="1"))  # refused: runs on its own
        assert other.returncode == 0 and "Run the data stage" in other.stdout
    finally:
        server.stop()
    log = Path(server.log).read_text()
    assert "ran flows.data --help: exit 0" in log
    assert "ran flows.data --params" in log and ": exit 2 " in log
    assert "refused flows.data: another environment (SOME_NEW_VARIABLE)" in log
    assert server.summary() == ("stage server: ran 2 stage command(s); 1 ran on their own: "
                                "flows.data: another environment (SOME_NEW_VARIABLE)")
    assert ENV_VAR not in os.environ and not os.path.exists(server.sock)


def test_without_a_server_the_command_runs_as_usual(tmp_path: Path) -> None:
    env = dict(os.environ, **{ENV_VAR: str(tmp_path / "no-such.sock")})  # nobody listening: run here
    out = _run(["flows.data", "--help"], env)
    assert out.returncode == 0 and "Run the data stage" in out.stdout


def test_importing_a_flow_never_hands_the_process_over(tmp_path: Path, monkeypatch) -> None:
    """With a live server named in the environment, ``import flows.data`` (a test, a notebook, the stage server's
    own preload) runs nothing there: only the command's ``begin`` forwards."""
    monkeypatch.chdir(ROOT)
    server = StageServer(["json"], tmp_path).start()
    try:
        _wait_ready(server)
        code = "import flows, flows.data, flows.pipeline; print('still here')"
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, DVC_STAGE="data"),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "still here", out.stderr
    finally:
        server.stop()
    assert "ran " not in Path(server.log).read_text()

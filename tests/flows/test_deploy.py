"""The pipeline as a Prefect deployment (flows/deploy.py): a run started through the API, as the UI or a schedule
starts one, runs the stage through DVC (dvc.lock records it); serving without an API that stays up is refused."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.flows._project import env, make_project, run


def test_serving_without_an_api_server_is_refused_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "flows.deploy"], cwd=Path(__file__).resolve().parents[2], env=env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "PREFECT_API_URL" in out.stderr, out.stderr


@pytest.mark.slow  # ~1 min: .ci/slow dvc-graphs
def test_a_deployment_run_goes_through_dvc(tmp_path: Path, prefect_api: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    project = make_project(tmp_path / "proj")
    server = subprocess.Popen([sys.executable, "-m", "flows.deploy", "data"], cwd=project,
                              env=env(prefect_api, PREFECT_RUNNER_POLL_FREQUENCY="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        with get_client(sync_client=True) as client:
            for _ in range(120):  # the deployment exists once the serve process registered it
                try:
                    client.read_deployment_by_name("dvc-repro/dvc-repro")
                    break
                except Exception:  # noqa: BLE001 - not yet
                    assert server.poll() is None, server.stdout.read() if server.stdout else ""
                    time.sleep(1)
        flow_run = run_deployment("dvc-repro/dvc-repro", timeout=600)  # its default parameters: stages ["data"]
        assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
    finally:
        server.terminate()
        server.wait(timeout=60)
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"data"}  # recorded by DVC, and only the stage asked for
    assert "Data and pipelines are up to date" in run(["dvc", "status", "data"], project).stdout

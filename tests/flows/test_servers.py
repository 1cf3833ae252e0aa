"""The project's Prefect API server (flows/_servers.py) under a plain ``dvc repro``: one for every stage of the run,
started on demand, gone shortly after the run; no stage server (the fork server is the pipeline's alone); a stale
record (its server killed with kill -9) is replaced."""

from __future__ import annotations

import json
import sqlite3
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

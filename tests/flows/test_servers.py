"""The project's servers (flows/_servers.py) under a plain ``dvc repro``: one Prefect API server for every stage of
the run and one stage server for the commands after the first, started on demand, gone shortly after the run;
a stale record (its server killed with kill -9) is replaced."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.flows._project import env, make_project, processes_in, run, wait_gone


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("servers") / "proj")


def test_plain_dvc_repro_shares_one_api_server_and_a_stage_server(project: Path) -> None:
    out = run(["dvc", "repro", "data", "base_model"], project, env(), timeout=900)
    text = out.stdout + out.stderr
    ports = set(re.findall(r"View at http://127\.0\.0\.1:(\d+)/", text))
    assert len(ports) == 1, ports  # both stages' flow runs in one API server
    assert "Running stage 'data'" in text and "Running stage 'base_model'" in text
    log = (project / ".prefect" / "servers" / "stage-server.log").read_text()
    assert re.search(r"^ran flows\.base_model : exit 0", log, re.M), log  # forked by the on-demand stage server
    assert wait_gone(project, 10.0) == [], processes_in(project)  # both stopped once the run was over
    assert not list((project / ".prefect" / "servers" / "leases").glob("*.json"))


def test_a_stale_server_record_is_replaced(project: Path) -> None:
    servers = project / ".prefect" / "servers"
    servers.mkdir(parents=True, exist_ok=True)
    (servers / "api.json").write_text(json.dumps({"pid": 2**22 - 7, "url": "http://127.0.0.1:9/api", "started": 0}))
    out = run(["dvc", "repro", "-f", "data"], project, env(), timeout=900)
    assert "Running stage 'data'" in out.stdout and "127.0.0.1:9/" not in out.stdout
    assert wait_gone(project, 10.0) == [], processes_in(project)

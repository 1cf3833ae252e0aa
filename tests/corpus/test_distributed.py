"""The corpus stage on a real local Dask cluster (2 worker processes, through prefect-dask's DaskTaskRunner)
gives the same outputs as the local runner; so do other shard and partition counts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stages import corpus
from stages.core import paths
from tests.corpus.test_stage import _generate, _params

pytestmark = pytest.mark.slow  # a local Dask cluster: ~45 s on 2 cores; .ci/slow robustness (the suite stays under 10 min)

SMALL = dict(n_pages=1500, n_seed_pages=200)


def _outputs(root: Path) -> dict[str, Any]:
    """Everything the stage wrote that must not depend on the runner (timings aside)."""
    out = root / paths.CORPUS
    files = {f"{f.relative_to(out)}": f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file() and f.name != "classifier.bin"}
    metrics = json.loads((root / paths.details_file("corpus")).read_text())
    for key in ("timings_s", "wall_s", "work_split"):  # timings live in their own file now; kept if a stage adds them
        metrics.pop(key, None)
    for r in metrics.get("rounds", []):
        r.pop("train_s", None)
        r.pop("score_s", None)
    files["rounds.json"] = json.dumps([{k: v for k, v in r.items() if k not in ("train_s", "score_s")}
                                       for r in json.loads(files.pop("reports/rounds.json"))]).encode()
    return {"files": files, "metrics": metrics}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    _generate(root, **SMALL)
    return root


@pytest.fixture(scope="module")
def local(project: Path) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(project)
        corpus.run(_params(n_shards=3, **{"recall.rounds": 2}))
        return _outputs(project)


def test_dask_cluster_equals_local_runner(project: Path, local: dict[str, Any], prefect_api: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("prefect_dask")
    from distributed import Client, LocalCluster
    from prefect_dask import DaskTaskRunner

    from flows.corpus import corpus_shards_flow

    monkeypatch.chdir(project)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        runner = DaskTaskRunner(address=cluster.scheduler_address)
        p = _params(n_shards=3, task_runner="dask", address=cluster.scheduler_address, **{"recall.rounds": 2})
        corpus_shards_flow.with_options(task_runner=runner)(p)
        with Client(cluster) as client:  # both worker processes (not this one) ran tasks of the stage
            ran = client.run(lambda dask_worker: (os.getpid(), dask_worker.state.transition_counter))
    assert len(ran) == 2 and all(pid != os.getpid() and n > 0 for pid, n in ran.values()), ran
    got = _outputs(project)
    assert got["metrics"] == local["metrics"]
    assert got["files"].keys() == local["files"].keys()
    for name, data in local["files"].items():
        assert got["files"][name] == data, name


def test_shard_and_partition_counts_do_not_change_outputs(project: Path, local: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """5 shards and bucket partitions of 5,000 entries (many partitions) on a 4-thread local runner."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.chdir(project)
    with ThreadPoolExecutor(4) as pool:
        def threads(fn, items):  # noqa: ANN001, ANN202
            return list(pool.map(lambda kw: fn(**kw), items))
        m = corpus.run(_params(n_shards=5, **{"recall.rounds": 2, "dedup.partition_size": 5000}), map_fn=threads)
    assert m["work_split"]["dedup_partitions"] > 3 and m["work_split"]["shards"] == 5
    got = _outputs(project)
    assert got["metrics"] == local["metrics"]
    for name, data in local["files"].items():
        assert got["files"][name] == data, name


HANDSHAKE = r'''
import json, socket, ssl, sys
host, port = sys.argv[1], int(sys.argv[2])
out = {}
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
for how in ("tls without a certificate", "plain tcp"):
    try:
        with socket.create_connection((host, port), timeout=10) as raw:
            s = ctx.wrap_socket(raw) if how.startswith("tls") else raw
            s.sendall(b"\x00" * 64)
            out[how] = f"read {len(s.recv(1024))} bytes"
    except (ssl.SSLError, OSError) as e:
        out[how] = f"{type(e).__name__}: {e}"[:160]
print(json.dumps(out))
'''


def test_the_cluster_the_stage_starts_takes_only_its_own_credentials(
        other_user, project: Path, local: dict[str, Any], prefect_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50: ``corpus.task_runner: dask`` without an address starts a LocalCluster that speaks TLS with a key
    and certificate made for the run (``Security.temporary()``) and requires them of every connection: another user
    of the machine cannot even complete a handshake with its scheduler, and a client of this user without the run's
    credentials (plain tcp, or TLS with other credentials) cannot run anything; with them it can, and the stage run
    on such a cluster gives the local runner's outputs. Without that security, any local client ran code as the
    pipeline's user (the contrast at the end)."""
    pytest.importorskip("prefect_dask")
    from distributed import Client, LocalCluster
    from distributed.security import Security

    from flows.corpus import make_task_runner

    runner = make_task_runner(_params(task_runner="dask", workers=1))
    with runner:
        client = runner.client  # (the cluster starts with the runner's client)
        cluster = client.cluster
        addr = cluster.scheduler_address
        assert addr.startswith("tls://127.0.0.1:"), addr
        host, port = addr.removeprefix("tls://").rsplit(":", 1)
        res = other_user.python_code(HANDSHAKE, host, port)
        assert res.returncode == 0, res.stderr
        seen = json.loads(res.stdout)
        # the connection refused or closed at the handshake: not a byte of Dask's protocol back
        assert all(v == "read 0 bytes" or v.split(":")[0].endswith("Error") for v in seen.values()), seen
        for attempt in (addr.replace("tls://", "tcp://"), addr):  # this user, without the run's credentials
            with pytest.raises((OSError, TimeoutError)):
                with Client(attempt, security=Security.temporary() if attempt == addr else None, timeout=5) as c:
                    c.run(os.getpid)
        with Client(cluster) as own:  # the run's credentials: accepted
            assert len(own.run(os.getpid)) == 1
    from flows.corpus import corpus_shards_flow

    monkeypatch.chdir(project)
    p = _params(n_shards=3, task_runner="dask", workers=2, **{"recall.rounds": 2})
    corpus_shards_flow.with_options(task_runner=make_task_runner(p))(p)
    assert _outputs(project) == local
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as open_cluster:
        with Client(open_cluster.scheduler_address, timeout=10) as anyone:  # what it was: no credentials asked
            assert len(anyone.run(os.getpid)) == 1

"""Faults in a pipeline run (issue 50), on real runs of ``python -m flows.pipeline --force --only corpus`` (20 recall
rounds: 10-20 s of work), each killed mid-stage: the stage server, the Prefect API server, the stage itself with
SIGKILL (with Dask workers running under it), and the stage killed by the kernel's out-of-memory killer (a memory
cgroup). Each time the run ends within seconds, says what happened by name (never "bad input"), leaves no process
and no temporary path, and writes nothing after it ended.

Slow (a pipeline start and a corpus run each: ~25 s per case on 2 cores): .ci/slow robustness.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows import _process
from tests.flows._project import (
    env,
    make_project,
    processes_in,
    run,
    set_key,
    start,
    temporaries,
    tree_hash,
    wait_for,
    wait_gone,
)

pytestmark = pytest.mark.slow

BUDGET_S = 10.0
"""From the kill to the pipeline's exit."""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    proj = make_project(tmp_path_factory.mktemp("faults") / "proj")
    run([sys.executable, "-m", "flows.pipeline", "corpus"], proj, env(), timeout=900)
    run(["git", "add", "-A"], proj)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "corpus done"], proj)
    return proj


def _slow(project: Path, tmp_path: Path, **over: object) -> Path:
    raw = yaml.safe_load((project / "params.yaml").read_text())
    set_key(raw, "corpus.recall.rounds", 20)
    for k, v in over.items():
        set_key(raw, k, v)
    f = tmp_path / "slow.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def _children(pid: int, word: str) -> list[int]:
    return [p for p in _process.descendants(pid) if word in " ".join(_process.command_line(p))]


def _run_and_kill(project: Path, tmp_path: Path, target, sig: int | None = signal.SIGKILL, **over: object
                  ) -> tuple[int, float, str, list[int]]:
    """Start the pipeline, wait for the corpus rounds, send ``sig`` (None: none) to ``target(pipeline pid)``'s pids;
    return the pipeline's exit status, the seconds from the kill to its exit, its output and the pids."""
    log = tmp_path / "pipeline.log"
    params = _slow(project, tmp_path, **over)
    proc = start([sys.executable, "-m", "flows.pipeline", "--force", "--only", "corpus", "--params", str(params)],
                 project, env(), log)
    try:
        wait_for(lambda: "round 1:" in log.read_text(), 300, "the corpus rounds", proc, log)
        pids = target(proc.pid)
        assert pids, _process.descendants(proc.pid)
        t0 = time.monotonic()
        for p in pids if sig is not None else []:
            os.kill(p, sig)
        proc.wait(timeout=300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, took, log.read_text(), pids


def _contained(project: Path, before: str) -> None:
    """No process of the run left, no temporary path, and nothing written after the end (for 3 s)."""
    assert wait_gone(project, 5.0) == [], processes_in(project)
    assert temporaries(project) == []
    corpus = project / "data" / "corpus"
    now = tree_hash(corpus) if corpus.exists() else None
    time.sleep(3.0)
    assert (tree_hash(corpus) if corpus.exists() else None) == now and now in (None, before)
    run(["dvc", "checkout", "corpus"], project)  # what the hint names brings the last recorded outputs back
    assert tree_hash(corpus) == before


def _stage_server(pipeline: int) -> list[int]:
    return _children(pipeline, "flows._stage_server")[:1]


def _api_server(pipeline: int) -> list[int]:
    return _children(pipeline, "flows._servers api")


def _stage(pipeline: int) -> list[int]:
    server = _stage_server(pipeline)[0]
    return [p for p in _process.descendants(server) if _process.parent_of(p) == server][:1]  # its fork


@pytest.mark.parametrize(("target", "said"), [
    (_stage_server, "error: the stage server (pid {pid}) was killed by SIGKILL (kill -9"),
    (_api_server, "error: the Prefect API server (pid {pid}) was killed by SIGKILL (kill -9"),
    (_stage, "error: stage corpus was killed by SIGKILL (kill -9"),
], ids=["stage-server", "api-server", "stage"])
def test_a_killed_server_or_stage_ends_the_run_as_what_it_was(project: Path, tmp_path: Path, target, said: str) -> None:
    before = tree_hash(project / "data" / "corpus")
    code, took, out, pids = _run_and_kill(project, tmp_path, target)
    assert code == 1, out[-3000:]
    assert took < BUDGET_S, f"the run ended {took:.1f} s after the kill"
    assert said.format(pid=pids[0]) in out, out[-3000:]
    assert "bad input" not in out, out[-3000:]
    if target is _stage:  # the stage command died of SIGKILL as its fork did (not a crash of its own)
        assert "failed to run: python -m flows.corpus, exited with -9" in out, out[-3000:]
    assert "`dvc checkout corpus` restores" in out
    _contained(project, before)


def test_nothing_a_killed_stage_started_outlives_it(project: Path, tmp_path: Path) -> None:
    """The stage on a local Dask cluster (its worker processes under it), killed with SIGKILL: the pipeline adopts
    the orphans and stops them when the stage has ended."""
    pytest.importorskip("prefect_dask")
    before = tree_hash(project / "data" / "corpus")
    workers: list[int] = []

    def stage_with_workers(pipeline: int) -> list[int]:
        stage = _stage(pipeline)
        t0 = time.monotonic()
        while len(workers) < 2 and time.monotonic() - t0 < 60:
            workers[:] = [p for p in _process.descendants(stage[0]) if _process.parent_of(p) != stage[0]
                          or "multiprocessing" in " ".join(_process.command_line(p))]
            time.sleep(0.2)
        return stage

    code, took, out, _ = _run_and_kill(project, tmp_path, stage_with_workers,
                                       **{"runtime.corpus.task_runner": "dask", "runtime.corpus.workers": 2})
    assert code == 1 and took < BUDGET_S, out[-3000:]
    assert workers, "no Dask worker process under the stage"
    assert "error: stage corpus was killed by SIGKILL" in out
    assert not [p for p in workers if _process.alive(p)]
    _contained(project, before)


def _memory_cgroup(tmp_name: str) -> Path | None:
    """A new memory cgroup (v1) below this process's own, or None where none can be made (not root, no v1 memory
    controller mounted)."""
    try:
        own = next(line.split(":", 2)[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":")[1] == "memory")
    except (OSError, StopIteration, IndexError):
        return None
    cg = Path("/sys/fs/cgroup/memory") / own.lstrip("/") / tmp_name
    try:
        cg.mkdir()
    except OSError:
        return None
    return cg


def test_a_stage_killed_by_the_out_of_memory_killer_is_named_so(project: Path, tmp_path: Path) -> None:
    cg = _memory_cgroup(f"dsm-oom-{os.getpid()}")
    if cg is None:
        pytest.skip("no memory cgroup can be made here (needs root and cgroup v1's memory controller)")
    before = tree_hash(project / "data" / "corpus")

    def confine(pipeline: int) -> list[int]:  # the stage, moved into a cgroup where it may allocate 8 MiB more
        stage = _stage(pipeline)
        (cg / "memory.limit_in_bytes").write_text(str(8 << 20))
        (cg / "cgroup.procs").write_text(str(stage[0]))
        return stage

    oom_before = _process.oom_kills()
    try:
        code, took, out, _ = _run_and_kill(project, tmp_path, confine, sig=None)
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.5)
        cg.rmdir()
    assert code == 1, out[-3000:]
    assert _process.oom_kills() > oom_before  # the kernel did kill it
    assert "error: stage corpus was killed by SIGKILL: the out-of-memory killer" in out, out[-3000:]
    assert "bad input" not in out
    _contained(project, before)

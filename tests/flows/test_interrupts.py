"""Ctrl-C and SIGTERM stop a stage, the pipeline and a plain ``dvc repro`` within 5 s (flows/_process.py): every
process they started is gone (thread pools, the Prefect API server, the stage server, the stage command), no
temporary path is left, each output is its old complete version or absent (restorable with the ``dvc checkout``
the hint names), and the hint says how to resume. After a ``kill -9`` of everything, the next run removes what
was left (a work directory, a stale server record) and finishes.

The interrupted stage is corpus with 20 recall rounds on the tiny crawl (10-20 s of work, with its work directory
data/.corpus-work.<pid>.*.tmp in place the whole time).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from stages.params import resolve
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

pytestmark = pytest.mark.slow  # signals and kill -9 on real dvc / pipeline runs: ~110 s on 2 cores; .ci/slow robustness (the suite stays under 10 min)

BUDGET_S = 5.0


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> Path:
    proj = make_project(tmp_path_factory.mktemp("interrupts") / "proj")
    run(["dvc", "repro", "corpus"], proj, env(prefect_api))
    run(["git", "add", "-A"], proj)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "corpus done"], proj)
    return proj


def _slow_params(project: Path, path: Path) -> None:
    raw = resolve(project / "params.yaml")
    set_key(raw, "corpus.recall.rounds", 20)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def _work_dirs(project: Path) -> list[Path]:
    return list((project / "data").glob(".corpus-work.*.tmp"))


def _interrupt(proc, sig: int, group: bool) -> float:
    t0 = time.monotonic()
    (os.killpg if group else os.kill)(proc.pid, sig)
    proc.wait(timeout=60)
    return time.monotonic() - t0


def test_ctrl_c_stops_a_stage(project: Path, tmp_path: Path) -> None:
    """``python -m flows.corpus`` without PREFECT_API_URL (so it starts the project's API server itself), Ctrl-C to
    its process group mid-work: out within 5 s, the server it started gone, data/corpus unchanged."""
    before = tree_hash(project / "data" / "corpus")
    slow, log = tmp_path / "slow.yaml", tmp_path / "stage.log"
    _slow_params(project, slow)
    proc = start([sys.executable, "-m", "flows.corpus", "--params", str(slow)], project, env(), log)
    wait_for(lambda: _work_dirs(project) and "round 1:" in log.read_text(), 300, "the corpus rounds", proc, log)
    took = _interrupt(proc, signal.SIGINT, group=True)
    out = log.read_text()
    assert proc.returncode == 130, out[-3000:]
    assert took < BUDGET_S, f"stopped after {took:.1f} s"
    assert "interrupted (SIGINT): stopping stage corpus" in out
    assert "its outputs are unchanged" in out and "`python -m flows.corpus` runs it again" in out
    assert wait_gone(project, 1.0) == [], processes_in(project)
    assert temporaries(project) == [] and not _work_dirs(project)
    assert tree_hash(project / "data" / "corpus") == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_signal_stops_the_pipeline(project: Path, tmp_path: Path, sig: int) -> None:
    """``python -m flows.pipeline --force --only corpus``, the signal sent to the pipeline's pid only (not its group):
    it stops the stage command, the stage server and the API server it started within 5 s; DVC had removed
    data/corpus, and the ``dvc checkout corpus`` that the hint names brings it back."""
    before = tree_hash(project / "data" / "corpus")
    _slow_params(project, project / "params.yaml")
    log = tmp_path / "pipeline.log"
    try:
        proc = start([sys.executable, "-m", "flows.pipeline", "--force", "--only", "corpus"], project, env(), log)
        wait_for(lambda: _work_dirs(project) and "round 1:" in log.read_text(), 300, "the corpus rounds", proc, log)
        took = _interrupt(proc, sig, group=False)
    finally:
        run(["git", "checkout", "params.yaml"], project)
    out = log.read_text()
    assert proc.returncode == 128 + sig, out[-3000:]
    assert took < BUDGET_S, f"stopped after {took:.1f} s"
    assert "stopping the pipeline" in out
    assert "stage corpus was interrupted" in out and "`dvc checkout corpus` restores" in out, out[-2000:]
    assert wait_gone(project, 1.0) == [], processes_in(project)
    assert temporaries(project) == [] and not _work_dirs(project)
    assert not (project / "data" / "corpus").exists() or tree_hash(project / "data" / "corpus") == before
    run(["dvc", "checkout", "corpus"], project)
    assert tree_hash(project / "data" / "corpus") == before


def test_ctrl_c_stops_plain_dvc_repro(project: Path, tmp_path: Path) -> None:
    """``dvc repro -f corpus`` with Ctrl-C to its group: the stage command stops within 5 s (DVC reports it failed),
    the API server it started on demand with it."""
    _slow_params(project, project / "params.yaml")
    log = tmp_path / "dvc.log"
    try:
        proc = start(["dvc", "repro", "-f", "corpus"], project, env(), log)
        wait_for(lambda: _work_dirs(project) and "round 1:" in log.read_text(), 300, "the corpus rounds", proc, log)
        took = _interrupt(proc, signal.SIGINT, group=True)
    finally:
        run(["git", "checkout", "params.yaml"], project)
    out = log.read_text()
    assert proc.returncode != 0 and "interrupted (SIGINT): stopping stage corpus" in out, out[-3000:]
    assert took < BUDGET_S, f"stopped after {took:.1f} s"
    assert "`dvc checkout corpus` restores the last recorded ones" in out
    # -f re-ran data first, which started the API server on demand; it stops once dvc and its stages are gone
    # (flows/_servers.py GRACE_S after the last of them)
    assert wait_gone(project, 2.5) == [], processes_in(project)
    assert temporaries(project) == [] and not _work_dirs(project)
    hint = re.search(r"`(dvc checkout corpus)` restores the last recorded ones and `(git checkout -- [^`]+)`", out)
    assert hint, out[-1500:]
    for cmd in hint.groups():  # the two commands of the hint restore every output
        run(cmd.split(), project)
    assert run(["dvc", "status", "corpus"], project).stdout.strip().endswith("up to date."), \
        run(["dvc", "status", "corpus"], project).stdout


def test_kill_9_leftovers_are_removed_by_the_next_run(project: Path, tmp_path: Path) -> None:
    """Everything killed with SIGKILL mid-stage leaves a work directory and the servers' records behind; the next
    run removes the work directory, replaces the stale server and finishes; then nothing is left."""
    _slow_params(project, project / "params.yaml")
    log = tmp_path / "killed.log"
    try:
        proc = start([sys.executable, "-m", "flows.pipeline", "--force", "--only", "corpus"], project, env(), log)
        wait_for(lambda: _work_dirs(project) and "round 1:" in log.read_text(), 300, "the corpus rounds", proc, log)
        for line in processes_in(project):  # kill -9 of every process of the run (servers included)
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
    finally:
        run(["git", "checkout", "params.yaml"], project)
    assert wait_gone(project, 5.0) == []
    left = _work_dirs(project)
    assert left, "kill -9 left no work directory (nothing to clean up)"
    assert (project / ".prefect" / "servers" / "api.json").exists()  # the record of a server that is gone
    out = run([sys.executable, "-m", "flows.pipeline", "--force", "--only", "corpus"], project, env(), timeout=600)
    assert re.search(r"removed \d+ temporary path\(s\) left by a killed earlier run", out.stderr), out.stderr[-2000:]
    assert not any(p.exists() for p in left) and temporaries(project) == []
    assert re.search(r"^corpus\s+ran\s", out.stdout, re.M), out.stdout[-2000:]
    assert (project / "data" / "corpus" / "math_corpus.jsonl").is_file()
    assert wait_gone(project, 5.0) == [], processes_in(project)

"""Sharing a run through a DVC remote (issue 47), as docs/pipeline.md's "Sharing results through a DVC remote" tells a
producer and a teammate: the producer runs the shrunk graph (``dvc repro``), adds a local directory as the default
remote, ``dvc push --run-cache`` and commits what the pipeline's closing hint lists (``flows._dvc.git_recorded``:
dvc.lock and the ``cache: false`` metrics, plots and dvclive folders); a ``git clone`` of it runs ``dvc pull`` and
nothing else, then ``dvc status`` is clean, ``dvc repro`` and ``python -m flows.pipeline`` run nothing, and every
output is the same bytes. Each folder of the list is needed: without it ``dvc pull --run-cache`` cannot bring it
back (DVC neither caches nor pushes it, the run-cache included) and its stage shows as changed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows import _dvc
from flows.pipeline import git_hint
from stages.core.io import output_hashes
from stages.params import resolve
from tests.flows._project import GIT, ROOT, env, make_project, run
from tests.flows.test_dvc_determinism import shrink_graph, stage_walls

UP_TO_DATE = "Data and pipelines are up to date."


def test_the_docs_commit_the_list() -> None:
    """docs/pipeline.md's commit lines (the sharing section's, the experiments', the end hint's) add what
    ``git_recorded`` lists, and no other line of it adds something else."""
    import re

    recorded = " ".join(_dvc.git_recorded(_dvc.stages(ROOT)))
    docs = (ROOT / "docs" / "pipeline.md").read_text()
    share = docs.split("## Sharing results through a DVC remote")[1].split("\n## ")[0]
    assert f"git add {recorded} && git commit" in share, recorded
    added = re.findall(r"git add (dvc\.lock[^&`]*?) && git commit", docs)
    assert len(added) >= 3 and set(added) == {recorded}, (recorded, added)


@pytest.mark.slow  # the shrunk graph once, then a clone: minutes (.ci/slow dvc-graphs)
def test_a_clone_pulls_the_run_and_has_nothing_to_do(tmp_path: Path, prefect_api: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    producer = make_project(tmp_path / "producer")
    raw = shrink_graph(resolve(producer / "params.yaml"))
    (producer / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    run(GIT + ["commit", "-qam", "shrunk graph"], producer)
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-d", "storage", str(remote)], producer)  # once: the remote is in .dvc/config
    run(GIT + ["commit", "-qam", "the DVC remote"], producer)
    t0 = time.perf_counter()
    run(["dvc", "repro"], producer, env(prefect_api))
    repro_s = time.perf_counter() - t0
    run(["dvc", "push", "--run-cache"], producer)

    # what the closing hint of `python -m flows.pipeline` says to commit, run as it is printed
    monkeypatch.chdir(producer)
    known = _dvc.stages()
    recorded = _dvc.git_recorded(known)
    assert recorded == ["dvc.lock", "data/dvclive", "data/metrics", "data/plots"], recorded
    hint = git_hint(known)
    assert hint is not None
    cmd = hint.removeprefix("to record this run in git: ").split(" (`dvc push`")[0]
    assert cmd.startswith(f"git add {' '.join(recorded)} && git commit"), cmd  # the whole graph ran: every folder
    done = subprocess.run(cmd.replace("git commit", " ".join(GIT) + " commit", 1), shell=True, cwd=producer,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert run(["git", "status", "--porcelain"], producer).stdout == ""  # everything git should hold, it holds
    monkeypatch.chdir(tmp_path)

    # the teammate: clone, pull, nothing to do
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(producer), str(clone)], tmp_path)
    t0 = time.perf_counter()
    run(["dvc", "pull"], clone)
    pull_s = time.perf_counter() - t0
    assert run(["dvc", "status"], clone).stdout.strip() == UP_TO_DATE
    t0 = time.perf_counter()
    repro = run(["dvc", "repro"], clone).stdout
    repro_noop_s = time.perf_counter() - t0
    assert "Running stage" not in repro, repro[-3000:]
    assert "Data and pipelines are up to date." in repro, repro[-3000:]
    t0 = time.perf_counter()
    pipe = run([sys.executable, "-m", "flows.pipeline"], clone, env()).stdout  # no API: a no-op starts no server
    pipeline_noop_s = time.perf_counter() - t0
    assert "pipeline: every stage is up to date or restored from the run-cache (dvc status); nothing to run" in pipe, pipe[-3000:]
    assert not re.search(r"^\S+\s+ran\s", pipe, re.M), pipe[-3000:]
    mine, theirs = output_hashes(producer), output_hashes(clone)
    assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
    assert not [k for k in mine if mine[k] != theirs[k]]
    assert any(k.startswith("data/models/grpo/") for k in mine) and any(k.startswith("data/dvclive/") for k in mine)
    assert run(["git", "status", "--porcelain"], clone).stdout == ""
    print(f"\nshare: producer dvc repro {repro_s:.1f} s; clone: dvc pull {pull_s:.1f} s, no-op dvc repro "
          f"{repro_noop_s:.1f} s, no-op python -m flows.pipeline {pipeline_noop_s:.1f} s; {len(mine)} files the same "
          f"bytes; load {open('/proc/loadavg').read().split()[:3]}; stages {stage_walls(producer)}")

    # each folder of the list is needed: the remote does not hold it, and its stage is stale without it
    for folder in recorded[1:]:
        shutil.rmtree(clone / folder)
        run(["dvc", "pull", "--run-cache"], clone, check=False)  # DVC may say it cannot check out uncached outputs
        tracked = [f for f in run(["git", "ls-files", "--", folder], clone).stdout.split()
                   if not f.endswith(".gitignore")]
        assert tracked and not any((clone / f).exists() for f in tracked), folder  # git's files: only git has them
        status = run(["dvc", "status"], clone).stdout
        assert status.strip() != UP_TO_DATE and "changed outs" in status, f"{folder}: {status}"
        run(["git", "checkout", "--", folder], clone)
    assert run(["dvc", "status"], clone).stdout.strip() == UP_TO_DATE

"""Two runs in one checkout (issue 50): ``python -m flows.pipeline --params FILE`` (data.seed 7) and a default run
(params.yaml: seed 0), started 0-6 s apart in either order, :data:`RUNS` times (``DSM_RACE_RUNS``, default 20).

Each time: params.yaml never changes (read every 20 ms through both runs), the later run waits for the earlier one
with one line naming it, both finish, and what the checkout holds afterwards is byte for byte what a clean run of
the last run's values makes (data/generated, the stage's metrics and details, dvc.lock's entry), with ``dvc status``
clean exactly when those values are params.yaml's; no process of either run is left.

Slow (a pipeline start and the data stage per run: ~45 s per pair on 2 cores): .ci/slow robustness.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.flows._project import env, make_project, processes_in, run, start, tree_hash, wait_gone

pytestmark = pytest.mark.slow

RUNS = int(os.environ.get("DSM_RACE_RUNS", "20"))


def _state(project: Path) -> dict[str, Any]:
    """What a run of the data stage leaves: its outputs' bytes and dvc.lock's record of them."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["data"]
    md5 = {f: hashlib.md5((project / f).read_bytes()).hexdigest() for f in ("data/details/data.json",
                                                                            "data/metrics/data.json")}
    return {"seed": lock["params"]["params.yaml"]["data"]["seed"], "generated": tree_hash(project / "data/generated"),
            **md5, "lock_outs": sorted((o["path"], o["md5"]) for o in lock["outs"])}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[int, dict[str, Any]]]:
    """The checkout, the params file with seed 7, and what a clean run leaves for each seed."""
    proj = make_project(tmp_path_factory.mktemp("race") / "proj")
    seven = proj.parent / "seed7.yaml"
    raw = yaml.safe_load((proj / "params.yaml").read_text())
    raw["data"]["seed"] = 7
    seven.write_text(yaml.safe_dump(raw, sort_keys=False))
    clean = {}
    for seed, extra in ((7, ["--params", str(seven)]), (0, [])):  # one run at a time: the references
        run([sys.executable, "-m", "flows.pipeline", "--force", "--only", "data", *extra], proj, env(), timeout=900)
        clean[seed] = _state(proj)
    assert clean[0]["generated"] != clean[7]["generated"]
    return proj, seven, clean


def test_concurrent_runs_in_one_checkout_serialise_and_never_mix(project, tmp_path: Path) -> None:
    proj, seven, clean = project
    params = (proj / "params.yaml").read_bytes()
    rng = random.Random(50)
    waits, rows = 0, []
    for i in range(RUNS):
        changed: list[float] = []
        done = threading.Event()

        def watch(done: threading.Event = done, changed: list[float] = changed) -> None:
            while not done.is_set():
                if (proj / "params.yaml").read_bytes() != params:
                    changed.append(time.monotonic())
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        cmds = {0: [], 7: ["--params", str(seven)]}
        order = [7, 0] if i % 2 == 0 else [0, 7]
        delay = rng.uniform(0.0, 6.0)
        procs, logs, ended = {}, {}, {}
        t0 = time.monotonic()
        for n, seed in enumerate(order):
            if n:
                time.sleep(delay)
            logs[seed] = tmp_path / f"run{i}-seed{seed}.log"
            procs[seed] = start([sys.executable, "-m", "flows.pipeline", "--force", "--only", "data", *cmds[seed]],
                                proj, env(), logs[seed])
        while len(ended) < 2:
            for seed, p in procs.items():
                if seed not in ended and p.poll() is not None:
                    ended[seed] = time.monotonic()
            assert time.monotonic() - t0 < 900, "the runs took more than 15 minutes"
            time.sleep(0.05)
        done.set()
        watcher.join()
        outs = {seed: logs[seed].read_text() for seed in procs}
        for seed, p in procs.items():
            assert p.returncode == 0, f"run {i}, seed {seed}: exit {p.returncode}\n{outs[seed][-3000:]}"
        assert not changed, f"run {i}: params.yaml changed during the runs"
        second = order[1]
        waited = "waiting for it to finish" in outs[second]
        waits += waited
        assert "waiting for it to finish" not in outs[order[0]], outs[order[0]][-2000:]
        last = max(ended, key=ended.get)
        got = _state(proj)
        assert got == clean[last], f"run {i}: the checkout holds {got}, a clean seed-{last} run makes {clean[last]}"
        status = run(["dvc", "status", "data"], proj).stdout
        assert ("up to date" in status) == (last == 0), status
        assert wait_gone(proj, 10.0) == [], processes_in(proj)
        rows.append((i, order[0], round(delay, 1), waited, last, round(max(ended.values()) - t0, 1)))
    assert (proj / "params.yaml").read_bytes() == params
    print(f"\n{RUNS} pairs (first seed, delay s, second waited, last seed, wall s): {rows}")
    assert waits >= RUNS // 2, rows  # the runs overlapped (each takes longer than the 0-6 s between their starts)

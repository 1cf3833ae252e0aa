"""Byte-identical reruns (issue 29): the graph data -> corpus -> base_model -> a few pretrain, sft, reward_model and
grpo steps -> evaluate of every model -> report, shrunk to seconds per stage, runs with ``dvc repro`` in two clean
temporary repositories at once (each is the other's load), and every output DVC tracks is the same bytes in both:
dvc.lock's hashes, and every file under data/ except data/timings/ (what each run measured about itself: no DVC
output, git-ignored). The full default pipeline twice: benchmarks/load.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from stages.core.io import output_hashes
from stages.params import resolve
from tests.flows._project import GIT, env, kill_group, make_project, run, shrink, start


def shrink_graph(raw: dict[str, Any]) -> dict[str, Any]:
    """tests/flows/_project.shrink plus a few steps of the reward model and GRPO (CoT rollouts, the rule reward and
    the continued-SFT baseline, as the default) and a few problems per evaluation (greedy CoT / PoT / TIR and
    sampling: the sandbox and the answer checker run)."""
    raw = shrink(raw)
    raw["reward_model"].update(questions=8, samples_per_question=2, max_new_tokens=16, batch_size=8, best_of_n=2)
    raw["grpo"].update(steps=3, questions_per_step=2)
    raw["grpo"]["rollout"].update(group_size=4, max_new_tokens=16)
    raw["grpo"]["optim"].update(micro_batch_size=8)
    raw["evaluate"]["common"].update(limit=8, sample_limit=4, max_new_tokens=24, maj_subsets=8, batch_size=8)
    for m in raw["evaluate"]["models"].values():
        m.update(n_samples=min(m["n_samples"], 4), limit=None)
    return raw


pytestmark = pytest.mark.slow  # two shrunk full graphs at once: minutes (in .ci/run)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("determinism")
    projects = []
    for name in ("a", "b"):
        proj = make_project(base / name)
        raw = shrink_graph(resolve(proj / "params.yaml"))
        (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        run(GIT + ["commit", "-qam", "shrunk graph"], proj)
        projects.append(proj)
    t0 = time.perf_counter()
    procs = [start(["dvc", "repro"], p, env(prefect_api), p.parent / f"{p.name}.log") for p in projects]
    for p, proc in zip(projects, procs, strict=True):
        try:
            proc.wait(timeout=900)
        finally:
            kill_group(proc)
        assert proc.returncode == 0, (p.parent / f"{p.name}.log").read_text()[-4000:]
    return {"projects": projects, "wall_s": time.perf_counter() - t0,
            "logs": [(p.parent / f"{p.name}.log").read_text() for p in projects]}


def test_two_clean_runs_give_the_same_bytes_except_the_timings(two_runs: dict[str, Any]) -> None:
    a, b = two_runs["projects"]
    fa, fb = output_hashes(a), output_hashes(b)
    assert set(fa) == set(fb), sorted(set(fa) ^ set(fb))
    differ = sorted(k for k in fa if fa[k] != fb[k])
    assert not differ, differ
    stages = yaml.safe_load((a / "dvc.lock").read_text())["stages"]
    for must in ("data", "corpus", "base_model", "pretrain", "sft", "reward_model", "grpo", "evaluate@grpo", "report"):
        assert must in stages, sorted(stages)
    assert any(k.startswith("data/models/grpo/") for k in fa) and any(k.startswith("data/eval/grpo/") for k in fa)
    # the timings exist beside the results, and are the only thing that differs
    ta = json.loads((a / "data" / "timings" / "grpo.json").read_text())
    tb = json.loads((b / "data" / "timings" / "grpo.json").read_text())
    assert ta["wall_s"] > 0 and tb["wall_s"] > 0


def test_a_forced_rerun_changes_nothing_tracked(two_runs: dict[str, Any], prefect_api: str) -> None:
    """``dvc repro -f grpo`` (grpo only) in one project: the same bytes again, dvc.lock untouched."""
    a = two_runs["projects"][0]
    before = output_hashes(a)
    run(["dvc", "repro", "-f", "-s", "grpo"], a, env(prefect_api))
    assert output_hashes(a) == before
    assert run(["dvc", "status"], a).stdout.strip() == "Data and pipelines are up to date."

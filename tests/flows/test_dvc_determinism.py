"""Byte-identical reruns (issue 29): the graph data -> corpus -> base_model -> a few pretrain, sft, reward_model and
grpo steps -> evaluate of every model -> report, shrunk to seconds per stage, runs with ``dvc repro`` in two clean
temporary repositories at once (each is the other's load), and every output DVC tracks is the same bytes in both:
dvc.lock's hashes, and every file under data/ except data/timings/ (what each run measured about itself: no DVC
output, git-ignored). The full default pipeline twice: benchmarks/load.py.

With ``CI_SPEED_BASE=<revision>`` (.ci/run sets it to the commit that last passed CI's core) a third graph, that
revision's code shrunk by its own ``shrink_graph``, runs at the same time: each stage's wall time here against
there is CI's speed check, a ratio in the same run on the same machine, recorded (``$CI_SPEED_OUT``), never a
pass / fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.core.io import output_hashes
from stages.params import resolve
from tests.flows._project import GIT, ROOT, env, kill_group, make_project, run, shrink, start


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


def base_project(dst: Path, rev: str) -> Path:
    """Revision ``rev`` of this repository as a project, its params shrunk by that revision's own ``shrink_graph``."""
    dst.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=tar, check=True)
    subprocess.run([sys.executable, "-c", "import yaml; from tests.flows.test_dvc_determinism import shrink_graph as s;"
                    "p = 'params.yaml'; t = yaml.safe_dump(s(yaml.safe_load(open(p))), sort_keys=False); open(p, 'w').write(t)"],
                   cwd=dst, check=True, env={**os.environ, "PYTHONPATH": str(dst)})
    run(["git", "init", "-q"], dst)
    run(["git", "add", "-A"], dst)
    run(GIT + ["commit", "-qm", f"{rev}, shrunk graph"], dst)
    return dst


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
    speed_base = os.environ.get("CI_SPEED_BASE")
    others = [base_project(base / "base", speed_base)] if speed_base else []
    t0 = time.perf_counter()
    procs = [start(["dvc", "repro"], p, env(prefect_api), p.parent / f"{p.name}.log") for p in projects + others]
    for p, proc in zip(projects + others, procs, strict=True):
        try:
            proc.wait(timeout=900)
        finally:
            kill_group(proc)
        assert proc.returncode == 0, (p.parent / f"{p.name}.log").read_text()[-4000:]
    return {"projects": projects, "base": others[0] if others else None, "wall_s": time.perf_counter() - t0,
            "logs": [(p.parent / f"{p.name}.log").read_text() for p in projects]}


def stage_walls(project: Path) -> dict[str, float]:
    """{stage: wall seconds} as each stage recorded it (data/timings/<stage>.json)."""
    return {f.stem: float(json.loads(f.read_text())["wall_s"]) for f in sorted((project / "data/timings").glob("*.json"))}


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


def test_speed_against_the_base_revision(two_runs: dict[str, Any]) -> None:
    """Each stage's wall time in this code's two runs against the base revision's run beside them (CI_SPEED_BASE):
    printed and written to $CI_SPEED_OUT as ratios (here / base). Speed is recorded, not judged: no budget."""
    if two_runs["base"] is None:
        pytest.skip("CI_SPEED_BASE not set (.ci/run sets it to the commit that last passed CI's core)")
    a, b = (stage_walls(p) for p in two_runs["projects"])
    base = stage_walls(two_runs["base"])
    assert set(base) & set(a), f"no stage in common: {sorted(base)} vs {sorted(a)}"
    rows = {s: {"here_s": round((a[s] + b[s]) / 2, 2), "base_s": base[s], "ratio": round((a[s] + b[s]) / 2 / base[s], 2)}
            for s in sorted(set(a) & set(base)) if base[s] > 0}
    here, there = sum(r["here_s"] for r in rows.values()), sum(r["base_s"] for r in rows.values())
    out = {"base": os.environ["CI_SPEED_BASE"], "loadavg": [round(x, 2) for x in os.getloadavg()], "stages": rows,
           "total": {"here_s": round(here, 1), "base_s": round(there, 1), "ratio": round(here / there, 3)}}
    print(f"{'stage':<24}{'here s':>9}{'base s':>9}{'ratio':>7}")
    for s, r in rows.items():
        print(f"{s:<24}{r['here_s']:>9}{r['base_s']:>9}{r['ratio']:>7}")
    print(f"{'all':<24}{out['total']['here_s']:>9}{out['total']['base_s']:>9}{out['total']['ratio']:>7}")
    if os.environ.get("CI_SPEED_OUT"):
        Path(os.environ["CI_SPEED_OUT"]).write_text(json.dumps(out, indent=1) + "\n")

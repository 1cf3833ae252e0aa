"""Two RL runs as DVC experiments, compared the DVC way (issue 32 item 5): in a temporary git repo (a copy of the
project whose dvc.yaml keeps the grpo stage alone, as the project declares it) that stage runs twice under ``dvc exp run -s grpo -S ...`` on a tiny model; ``dvc exp show``
lists both side by side with their dvclive metrics (data/dvclive/grpo/metrics.json) and params, and ``dvc plots diff``
gives both runs' per-step curves (data/dvclive/grpo/plots/metrics/grpo/*.tsv). Slow (two Prefect flow runs of the stage,
~1-2 min on the shared machine): in .ci/slow rl-experiments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from stages.params import resolve
from tests.flows._project import GIT, env, make_project, run
from tests.rl.conftest import make_tiny_model_dir, write_prompts

CURVE = "data/dvclive/grpo/plots/metrics/grpo/kl.tsv"


def _tiny_grpo(raw: dict) -> dict:
    g = raw["grpo"]
    g.update(steps=3, questions_per_step=2, log_completions_every=0)
    g["rollout"].update(group_size=4, max_new_tokens=8, backend="hf")
    g["reward"].update(custom=["tests.rl.custom_rewards:length_reward"], custom_weights=[1.0])
    g["optim"].update(lr=1e-3, micro_batch_size=8)
    g["baseline"]["enabled"] = False
    g["heldout"]["every"] = 0
    g["validation"].update(size=3, every=1, max_new_tokens=8)
    g["compute"].update(num_threads=1, precision="fp32")
    raw.setdefault("runtime", {}).setdefault("grpo", {})["checkpoint_every"] = 0
    return raw


@pytest.mark.slow
def test_exp_show_and_plots_diff_compare_two_rl_runs(tmp_path: Path, prefect_api: str) -> None:
    proj = make_project(tmp_path / "proj")
    raw = _tiny_grpo(resolve(proj / "params.yaml"))
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    # the project's grpo stage as dvc.yaml declares it, alone (its inputs are files here, not upstream outputs)
    stages = yaml.safe_load((proj / "dvc.yaml").read_text())
    (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"grpo": stages["stages"]["grpo"]}}, sort_keys=False))
    # the stage's inputs, as upstream stages would leave them: a tiny SFT model, RL prompts, a held-out test set
    make_tiny_model_dir(proj / "data/models/sft")
    for d in ("pretrain", "reward_model"):  # declared deps of the grpo stage, unused by this run
        (proj / "data/models" / d).mkdir(parents=True)
        (proj / "data/models" / d / "README").write_text("unused\n")
    (proj / "data/corpus/problems").mkdir(parents=True)
    write_prompts(proj / "data/corpus/problems/rl.jsonl", 10)
    (proj / "data/testsets").mkdir(parents=True)
    (proj / "data/testsets/generated.jsonl").write_text(
        json.dumps({"question": "What is 2 + 2?", "answer": "4"}) + "\n"
    )
    run(["git", "add", "-A"], proj)
    run(GIT + ["commit", "-qm", "tiny grpo"], proj)
    e = env(prefect_api, OMP_NUM_THREADS="1")
    for name, lr in (("rl-lr-small", "1e-4"), ("rl-lr-large", "1e-2")):
        out = run(["dvc", "exp", "run", "-s", "grpo", "-n", name, "-S", f"grpo.optim.lr={lr}"], proj, e, timeout=1200)
        assert f"Ran experiment(s): {name}" in out.stdout, out.stdout[-3000:]
    shown = json.loads(run(["dvc", "exp", "show", "--json"], proj).stdout)
    exps = {x["name"]: x["revs"][0] for rev in shown for x in (rev.get("experiments") or []) if x.get("name")}
    assert {"rl-lr-small", "rl-lr-large"} <= set(exps), json.dumps(shown)[:2000]
    live = {
        n: exps[n]["data"]["metrics"]["data/dvclive/grpo/metrics.json"]["data"]["grpo"] for n in ("rl-lr-small", "rl-lr-large")
    }
    lrs = {n: exps[n]["data"]["params"]["params.yaml"]["data"]["grpo"]["optim"]["lr"] for n in live}
    assert lrs == {"rl-lr-small": 1e-4, "rl-lr-large": 1e-2}
    for m in live.values():
        assert {"reward_mean", "kl", "validation_accuracy", "grad_norm"} <= set(m)
        assert not any(k.startswith(("t_", "cpu_")) for k in m)  # no timings in DVC-tracked files
    assert live["rl-lr-small"]["kl"] != live["rl-lr-large"]["kl"]  # two different runs
    table = run(["dvc", "exp", "show", "--no-pager", "--md", "--only-changed"], proj).stdout
    header = table.splitlines()[0]
    assert "rl-lr-small" in table and "rl-lr-large" in table and "grpo.optim.lr" in header and "grpo.kl" in header, table
    diff = json.loads(run(["dvc", "plots", "diff", "rl-lr-small", "rl-lr-large", "--json"], proj).stdout)["data"]
    (entry,) = diff[CURVE]
    points = entry["content"]["data"]["values"]
    assert entry["revisions"] == ["rl-lr-small", "rl-lr-large"]
    by_rev = {r: [(p["step"], float(p["kl"])) for p in points if p["rev"] == r] for r in entry["revisions"]}
    assert [s for s, _ in by_rev["rl-lr-small"]] == [s for s, _ in by_rev["rl-lr-large"]] == ["1", "2", "3"]
    assert by_rev["rl-lr-small"] != by_rev["rl-lr-large"]  # the two runs' curves, side by side
    assert "data/dvclive/grpo/plots/metrics/grpo/validation_accuracy.tsv" in diff
    assert not any(k.startswith("data/plots/grpo") for k in diff)  # one copy of each curve: dvclive's
    run(["dvc", "exp", "remove", "rl-lr-small", "rl-lr-large"], proj)
    shutil.rmtree(proj / ".dvc" / "cache", ignore_errors=True)

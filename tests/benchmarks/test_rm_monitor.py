"""benchmarks/rm_monitor.py's summary: the paired bootstrap of each of the paper's pairs over problems (each problem's mean
over the seeds), the SFT start from the step-0 evaluation, and Gao et al.'s binning of the step rows by sqrt(KL)."""

from __future__ import annotations

import math

from benchmarks import rm_monitor


def _run(method, seed, final, kl=0.25):
    steps = [{"step": i + 1, "reward": 0.5, "rm_raw": 0.1 * i, "rule_accuracy": 0.5 - 0.1 * i, "kl": kl * i,
              "completion_len": 40.0} for i in range(4)]
    return {"method": method, "seed": seed, "steps": steps, "heldout": {"0": 0.5, "4": sum(final) / len(final)},
            "correct": {"0": [1, 1, 0, 0], "4": final}, "wall_s": 1.0, "load": [1.0, 1.5]}


def test_pairs_average_seeds_per_problem_and_use_step_0_as_the_start():
    runs = [_run("grpo_os_rm", 0, [1, 1, 1, 0]), _run("grpo_os_rm", 1, [1, 1, 1, 1]),
            _run("online_rft", 0, [1, 0, 0, 0]), _run("online_rft", 1, [1, 0, 0, 0])]
    s = rm_monitor.summarize(runs, resamples=200)
    g = s["methods"]["grpo_os_rm"]
    assert (g["steps"], g["mean"], g["sd"]) == ([0, 4], [0.5, 0.875], [0.0, round(math.sqrt(0.03125), 4)])
    assert s["sft"] == 0.5
    pairs = {(q["better"], q["worse"]): q for q in s["pairs"]}
    assert set(pairs) == {("grpo_os_rm", "online_rft"), ("grpo_os_rm", "sft")}  # only pairs with runs on both sides
    assert pairs["grpo_os_rm", "online_rft"]["diff"] == 0.625 and pairs["grpo_os_rm", "online_rft"]["holds"]
    assert pairs["grpo_os_rm", "sft"]["diff"] == 0.375  # (1 + 1 + 1 + 0.5) / 4 - 0.5
    assert s["methods"]["online_rft"]["last5"]["kl"] == 0.375  # the last (up to) 5 step rows of both seeds
    assert s["comparison"]["reward_model"]["pairs"] == [
        {"pair": "grpo_os_rm > online_rft", "diff": 0.625, "clear": True, "verdict": "agree; paired bootstrap over "
         f"problems, 95%: {pairs['grpo_os_rm', 'online_rft']['lo']:+.3f} to {pairs['grpo_os_rm', 'online_rft']['hi']:+.3f}"}]


def test_gao_curve_bins_rm_runs_by_sqrt_kl():
    runs = [_run("grpo_ps_rm", 0, [1, 0, 0, 0]), _run("rft", 0, [0, 0, 0, 0])]
    g = rm_monitor.gao_curve(runs, bins=2)
    assert list(g) == ["grpo_ps_rm"]  # the rule-rewarded method has no proxy reward
    assert [p["sqrt_kl"] for p in g["grpo_ps_rm"]] == [round(math.sqrt(0.25) / 2, 4),
                                                       round((math.sqrt(0.5) + math.sqrt(0.75)) / 2, 4)]
    assert [p["rule_accuracy"] for p in g["grpo_ps_rm"]] == [0.45, 0.25]

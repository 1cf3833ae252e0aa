"""benchmarks/tir_rl.py's --resume selection and per-mode summary on fabricated result files (the benchmark itself
trains 6 GRPO runs for about an hour and is not in CI; run_all runs a 2-step smoke of it)."""

from __future__ import annotations

from typing import Any

from benchmarks import tir_rl as T


def _run(seed: int, mode: str, cot: float, tir: float, step_s: float) -> dict[str, Any]:
    stats = {k: 1.0 for k in ("t_generation_mean", "t_update_mean", "t_logprobs_mean", "tool_wait_s_mean",
                              "tool_exec_s_mean", "tool_programs_mean", "sandbox_exec_share_of_step",
                              "sandbox_wait_share_of_step", "programs_per_s_of_rollout",
                              "programs_per_s_of_sandbox_time", "completion_len_mean", "reward_first5",
                              "reward_last5")}
    return {"seed": seed, "mode": mode, "loadavg_before": 1.0 + seed, "loadavg_after": 2.0 + seed,
            "eval": {"cot": {"acc": cot}, "tir": {"acc": tir}}, "stats": {**stats, "step_s_mean": step_s}}


def _prev() -> dict[str, Any]:
    return {"benchmark": "tir_rl", "data": "/d", "steps": 20, "eval_limit": 500, "command": "first",
            "machine": {"cpus": 2}, "start": {"eval": {"cot": {"acc": 0.4}, "tir": {"acc": 0.7}}},
            "runs": [_run(0, "cot", 0.5, 0.7, 10.0), _run(0, "tir", 0.4, 0.8, 40.0), {"seed": 1, "mode": "cot"}]}


def test_resume_keeps_start_and_finished_runs_only() -> None:
    kept = T.reusable(_prev(), "/d", 20, 500)
    assert kept is not None
    assert kept["start"] == _prev()["start"]
    assert [(r["seed"], r["mode"]) for r in kept["runs"]] == [(0, "cot"), (0, "tir")]  # the unfinished run dropped
    assert kept["commands"] == ["first"] and kept["machines"] == [{"cpus": 2}]
    assert kept["loads"] == [1.0, 2.0, 1.0, 2.0]
    # a file that was itself resumed keeps its whole command history
    assert T.reusable({**_prev(), "commands": ["a", "b"]}, "/d", 20, 500)["commands"] == ["a", "b"]


def test_resume_refuses_other_settings() -> None:
    assert T.reusable(_prev(), "/other", 20, 500) is None
    assert T.reusable(_prev(), "/d", 10, 500) is None
    assert T.reusable(_prev(), "/d", 20, 50) is None
    assert T.reusable({k: v for k, v in _prev().items() if k != "start"}, "/d", 20, 500) is None


def test_summary_mean_and_sd_over_seeds() -> None:
    res = {"runs": [_run(0, "cot", 0.5, 0.7, 10.0), _run(1, "cot", 0.7, 0.9, 14.0), _run(0, "tir", 0.4, 0.8, 40.0)]}
    s = T.summarize(res)
    assert s["cot"]["seeds"] == [0, 1] and s["tir"]["seeds"] == [0]
    assert s["cot"]["heldout_cot_greedy"]["mean"] == 0.6
    assert abs(s["cot"]["heldout_cot_greedy"]["sd"] - 0.1414) < 1e-4  # sample sd of 0.5, 0.7
    assert s["cot"]["step_s_mean"] == {"mean": 12.0, "sd": round(2 ** 0.5 * 2, 4)}
    assert s["tir"]["heldout_tir_greedy"] == {"mean": 0.8, "sd": 0.0, "runs": [0.8]}

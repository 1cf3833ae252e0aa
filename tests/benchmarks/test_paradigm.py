"""benchmarks/paradigm.py's collection, aggregation, ordering and plot on fabricated inputs (the comparison itself
runs DVC experiments for hours and is not in CI; it was run end to end on tiny models, see the report of issue 10)."""

from __future__ import annotations

import math

import pytest

from benchmarks import paradigm as P


def _exp(name: str, rev: str, curve: dict[str, float] | None) -> dict:
    """One experiment entry shaped like ``dvc exp show --json`` output (dvc 3.x)."""
    metrics = ({"data/metrics/grpo.json": {"data": {"algorithm": "x", "wall_s": 1.0,
                                                      "heldout": {"n": 4, "accuracy_at_step": curve}}}}
               if curve is not None else
               {"data/metrics/grpo.json": {"error": {"type": "FileNotFoundError", "msg": "no file"}}})
    return {"revs": [{"rev": rev, "name": name, "data": {"rev": rev, "metrics": metrics, "params": {}}, "error": None,
                      "experiments": None}], "executor": {"state": "success"}, "name": name}


def _show(tag: str, curves: dict[tuple[str, int], dict[str, float] | None]) -> list:
    exps = [_exp(P.exp_name(tag, m, s), f"{i:040x}", c) for i, ((m, s), c) in enumerate(curves.items())]
    other = _exp("paradigm-othertag-rft-s0", "f" * 40, {"0": 0.9})
    return [{"rev": "workspace", "name": None, "data": {"metrics": {}}, "experiments": None},
            {"rev": "a" * 40, "name": "main", "data": {"metrics": {}}, "experiments": exps + [other]}]


def test_names_round_trip_and_reject_others() -> None:
    for m in P.METHODS:
        assert P.parse_name(P.exp_name("t1", m, 2), "t1") == (m, 2)
    assert P.parse_name(P.exp_name("t1", "rft", 0), "t2") is None
    assert P.parse_name("paradigm-t1-ppo-s0", "t1") is None


def test_queue_command_sets_method_seed_curve_and_overrides() -> None:
    cmd = P.queue_command("n1", "grpo_ps_rm", 3, heldout_every=5, heldout_limit=50, sets=["grpo.steps=2"],
                          copy_paths=["data/models/sft"])
    assert cmd[:5] == ["exp", "run", "--queue", "-s", "-n"] and cmd[5] == "n1" and cmd[-1] == "grpo"
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-S"]
    assert {"++grpo.algorithm=grpo", "++grpo.reward.source=process_rm", "++grpo.seed=3", "++grpo.heldout.every=5",
            "++grpo.heldout.limit=50", "++grpo.baseline.enabled=false", "++grpo.steps=2"} <= set(sets)
    assert sets.index("++grpo.steps=2") > sets.index("++grpo.seed=3")  # user overrides come last and win
    assert cmd[cmd.index("-C") + 1] == "data/models/sft"


def test_extract_aggregate_order_and_compare() -> None:
    curves = {("rft", 0): {"0": 0.1, "5": 0.2, "10": 0.25}, ("rft", 1): {"0": 0.1, "5": 0.3, "10": 0.35},
              ("online_rft", 0): {"0": 0.1, "5": 0.3, "10": 0.4}, ("online_rft", 1): {"10": 0.5, "0": 0.1, "5": 0.3},
              ("grpo_os", 0): {"0": 0.1, "5": 0.4, "10": 0.6}, ("grpo_ps", 0): {"0": 0.1, "5": 0.4, "10": 0.7},
              ("grpo_ps", 1): None}  # failed run: no metrics file
    runs = P.extract_runs(_show("tg", curves), "tg")
    assert len(runs) == 7 and {r["name"] for r in runs} == {P.exp_name("tg", m, s) for m, s in curves}
    failed = [r for r in runs if r["accuracy"] is None]
    assert [(r["method"], r["seed"]) for r in failed] == [("grpo_ps", 1)]
    on1 = next(r for r in runs if r["method"] == "online_rft" and r["seed"] == 1)
    assert on1["steps"] == [0, 5, 10] and on1["accuracy"] == [0.1, 0.3, 0.5]  # sorted by step

    summary = P.aggregate(runs)
    assert summary["rft"]["steps"] == [0, 5, 10] and summary["rft"]["seeds"] == [0, 1]
    assert summary["rft"]["mean"] == pytest.approx([0.1, 0.25, 0.3])
    assert summary["rft"]["sd"][2] == pytest.approx(math.sqrt(((0.25 - 0.3) ** 2 + (0.35 - 0.3) ** 2) / 1))
    assert summary["grpo_ps"]["seeds"] == [0] and summary["grpo_ps"]["final_sd"] == 0.0
    assert P.ordering(summary) == ["grpo_ps", "grpo_os", "online_rft", "rft"]
    cmp = P.compare_with_paper(summary)
    assert cmp["matches_paper"] and cmp["pairs_agreeing"] == cmp["n_pairs"] == 6
    # online RFT (0.45 +- 0.07) vs RFT (0.30 +- 0.07): apart by more than the two sds
    pair = next(p for p in cmp["pairs"] if p["pair"] == "online_rft > rft")
    assert pair["diff"] == pytest.approx(0.15) and pair["clear"]
    text = P.table(summary)
    assert "GRPO+PS" in text and "0.700±0.000" in text


def test_compare_reports_disagreement_and_ties() -> None:
    def s(final: float) -> dict:
        return {"final_mean": final, "final_sd": 0.0, "steps": [0], "mean": [final], "sd": [0.0], "seeds": [0]}

    cmp = P.compare_with_paper({"grpo_ps": s(0.3), "grpo_os": s(0.5), "rft": s(0.3)})
    verdicts = {p["pair"]: p["verdict"] for p in cmp["pairs"]}
    assert verdicts == {"grpo_ps > grpo_os": "disagree", "grpo_ps > rft": "tied", "grpo_os > rft": "agree"}
    assert not cmp["matches_paper"] and cmp["pairs_agreeing"] == 1
    assert P.order_text({"grpo_ps": s(0.3), "grpo_os": s(0.5), "rft": s(0.3)}) == "GRPO+OS > GRPO+PS = RFT"


def test_parse_queue_status() -> None:
    text = ("Task     Name                          Created    Status\n"
            "a960a31  paradigm-t-rft-s0             11:21 AM   Success\n"
            "9602f81  paradigm-t-grpo-os-s0         11:21 AM   Queued\n\n"
            "Worker status: 0 active, 0 idle\n")
    st, workers = P.parse_queue_status(text, ["paradigm-t-rft-s0", "paradigm-t-grpo-os-s0", "paradigm-t-x-s0"])
    assert st == {"paradigm-t-rft-s0": "Success", "paradigm-t-grpo-os-s0": "Queued"} and workers == 0


def test_plot_writes_a_png(tmp_path) -> None:
    summary = {"rft": {"steps": [0, 5], "mean": [0.1, 0.2], "sd": [0.0, 0.05], "seeds": [0, 1]},
               "grpo_ps": {"steps": [0, 5], "mean": [0.1, 0.4], "sd": [0.0, 0.02], "seeds": [0, 1]}}
    P.plot(summary, tmp_path / "p.png", "test")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exact_and_reward_model_chains_are_compared_separately() -> None:
    def s(final: float) -> dict:
        return {"final_mean": final, "final_sd": 0.0, "steps": [0], "mean": [final], "sd": [0.0], "seeds": [0]}

    summary = {"rft": s(0.4), "online_rft": s(0.5), "grpo_os": s(0.55), "grpo_ps": s(0.6),
               "grpo_os_rm": s(0.2), "grpo_ps_rm": s(0.3)}
    exact = P.compare_with_paper(summary, P.CHAINS["exact"])
    rm = P.compare_with_paper(summary, P.CHAINS["reward_model"])
    assert exact["matches_paper"] and exact["paper_order"] == ["grpo_ps", "grpo_os", "online_rft", "rft"]
    assert not rm["matches_paper"] and rm["measured_order"] == ["online_rft", "rft", "grpo_ps_rm", "grpo_os_rm"]
    assert rm["pairs_agreeing"] == 2  # ps_rm > os_rm and online_rft > rft
    assert P.ordering(summary)[:2] == ["grpo_ps", "grpo_os"]


def test_reuse_keeps_finished_runs_and_plan_skips_their_pairs(tmp_path, capsys) -> None:
    """``--reuse``: the earlier file's finished runs are kept (with where they first came from) and the plan holds
    only the (method, seed) pairs without one."""
    import json

    old = {"tag": "b2", "measured_at": "2026-12-01T14:20:09", "runs": [
        {"method": "rft", "seed": 0, "accuracy": [0.35, 0.4], "steps": [0, 10]},
        {"method": "rft", "seed": 1, "accuracy": None, "error": "killed"},  # failed: run again
        {"method": "grpo_os", "seed": 0, "accuracy": [0.35, 0.5], "steps": [0, 10], "reused_from": "b1 (2026-11-30)"},
        {"method": "not_a_method", "seed": 0, "accuracy": [0.1]}]}
    f = tmp_path / "old.json"
    f.write_text(json.dumps(old))
    got = P.reuse_runs(f)
    assert [(r["method"], r["seed"], r["reused_from"]) for r in got] == [("rft", 0, "b2 (2026-12-01)"),
                                                                         ("grpo_os", 0, "b1 (2026-11-30)")]
    assert P.main(["--project", str(tmp_path), "--methods", "rft", "grpo_os", "--seeds", "0", "1", "--tag", "t",
                   "--reuse", str(f)]) == 0
    plan = [line.split(" -n ")[1].split()[0] for line in capsys.readouterr().out.splitlines() if " -n " in line]
    assert plan == ["paradigm-t-rft-s1", "paradigm-t-grpo-os-s1"]


def test_versus_grpo_says_which_recipes_beat_it_beyond_the_seed_spread() -> None:
    def s(final: float, sd: float, wall: float | None = None) -> dict:
        return {"final_mean": final, "final_sd": sd, "steps": [0], "mean": [final], "sd": [sd], "seeds": [0, 1, 2],
                **({"grpo_wall_s": wall} if wall else {})}

    summary = {"grpo_os": s(0.50, 0.01, 100.0), "dapo": s(0.56, 0.02, 150.0), "gspo": s(0.52, 0.02),
               "cispo": s(0.40, 0.03, 90.0)}
    got = {v["method"]: v for v in P.versus(summary)}
    assert set(got) == {"dapo", "gspo", "cispo"} and all(v["vs"] == "grpo_os" for v in got.values())
    assert got["dapo"]["verdict"] == "better" and got["dapo"]["wall_ratio"] == 1.5
    assert got["gspo"]["verdict"] == "within spread" and got["gspo"]["wall_ratio"] is None  # 0.02 < 0.01 + 0.02
    assert got["cispo"]["verdict"] == "worse" and got["cispo"]["diff"] == pytest.approx(-0.10)
    assert P.versus({"dapo": s(0.5, 0.0)}) == []  # no baseline, no comparison
    assert set(P.RECIPES) <= set(P.METHODS) and all(m in P.LABELS and m in P._RANK for m in P.METHODS)


def test_run_wall_time_from_the_polls_that_saw_the_run_running() -> None:
    # seen running at t=100 s and last at t=160 s, polled every 5 s: 65 s (to within one poll); never seen: unknown
    assert P.run_wall_s([100.0, 160.0], 5.0) == 65.0
    assert P.run_wall_s(None, 5.0) is None and P.run_wall_s([], 5.0) is None

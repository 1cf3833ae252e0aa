"""RL with learned reward models on the tiny default (paper 4.1.3-4.1.4, Figures 5 and 6), in one process per run.

Every run starts from a finished default run's SFT model (``--project``: its data/models/sft, its RL problems, its
held-out test set) with the reward model in ``--rm``; the grpo section of the project's params.yaml with each method's
overrides (:data:`METHODS`), ``--steps`` in all (an iterative method splits them over its iterations), the held-out
greedy CoT evaluation every ``--heldout-every`` steps on ``--heldout-limit`` problems. Per run it keeps the step rows
the overoptimisation monitor reads (RM reward, rule accuracy of the same samples, KL, length, the guard's events),
the held-out curve and, at each evaluation, every problem's correctness. The summary: mean +- sd per method and
evaluation; for each of the paper's pairs (:data:`PAIRS`) the paired bootstrap over problems of the final accuracy
(each problem's mean over the seeds; stages.core.stats.paired_bootstrap); Gao et al. (2022)'s curve: the RM reward
and the rule accuracy of the same samples against sqrt(KL).

    python benchmarks/rm_monitor.py --project RUN --jobs 2         # RUN's data/models/reward_model
    python benchmarks/rm_monitor.py --project RUN --rm /tmp/rm --methods grpo_os_rm grpo_os_rm_guard --seeds 0

Finished runs are kept in ``--work`` (one JSON each) and not run again: a stopped comparison resumes. Writes
``--out`` (default benchmarks/results/paradigm_rm.json, which the report reads) and a .png beside it. Not in CI (an hour of CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "paradigm_rm.json"  # the report's Figure 5 with learned RMs
GUARD = {"action": "revert", "window": 5, "drop": 0.1}
METHODS: dict[str, dict[str, Any]] = {
    "rft": {"algorithm": "rft", "reward.source": "rule"},
    "online_rft": {"algorithm": "online_rft", "reward.source": "rule"},
    "grpo_os_rm": {"reward.source": "outcome_rm"},
    "grpo_ps_rm": {"reward.source": "process_rm"},
    "grpo_ps_rm_iter4": {"reward.source": "process_rm", "iterative.iterations": 4},
    "grpo_os_rm_guard": {"reward.source": "outcome_rm", "reward.rm_guards.divergence": GUARD},
    "grpo_ps_rm_stop": {"reward.source": "process_rm", "reward.rm_guards.divergence": {**GUARD, "action": "stop"}},
}
LABELS = {"sft": "SFT (start)", "rft": "RFT", "online_rft": "Online RFT", "grpo_os_rm": "GRPO+OS(RM)",
          "grpo_ps_rm": "GRPO+PS(RM)", "grpo_ps_rm_iter4": "GRPO+PS(RM), 4 iterations",
          "grpo_os_rm_guard": "GRPO+OS(RM), guard (revert)", "grpo_ps_rm_stop": "GRPO+PS(RM), guard (stop)"}
PAIRS = [("grpo_ps_rm", "grpo_os_rm"), ("grpo_os_rm", "online_rft"), ("grpo_ps_rm", "online_rft"),
         ("grpo_os_rm", "rft"), ("grpo_ps_rm", "rft"), ("online_rft", "rft"), ("grpo_os_rm", "sft"),
         ("grpo_ps_rm", "sft"), ("grpo_ps_rm_iter4", "grpo_ps_rm"), ("grpo_os_rm_guard", "grpo_os_rm"),
         ("grpo_ps_rm_stop", "grpo_ps_rm"), ("grpo_ps_rm_stop", "sft")]
"""(paper's better, worse): Figure 5's order with learned RMs, both above the SFT start, Figure 6 (iterative RL
with an RM update every ``steps / 4`` steps above one iteration at equal steps), and each guard above no guard and
the start."""
FIGURE6 = ("grpo_ps_rm", "grpo_ps_rm_iter4")
"""Paper Figure 6: (one iteration, several iterations at equal total steps)."""


def one(method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``method`` with ``seed`` in the current directory (a finished default run)."""
    import torch

    from stages.core.io import read_jsonl
    from stages.core.modeling import load_model, load_tokenizer
    from stages.params import load_params
    from stages.rl.heldout import HeldoutEval
    from stages.rl.iterative import run_iterations
    from stages.rl.loop import begin_iteration, close, setup, train

    torch.set_num_threads(args.threads)
    over = dict(METHODS[method])
    iters = int(over.get("iterative.iterations", 1))
    p = load_params("params.yaml").grpo.updated({
        "seed": seed, "steps": args.steps // iters, "checkpoint_every": 0, "log_completions_every": 0,
        "baseline.enabled": False, "iterative.iterations": 1, "heldout.every": args.heldout_every,
        "heldout.limit": args.heldout_limit, **over})
    held = HeldoutEval.from_params(p.heldout, p.template)
    correct: dict[str, list[int]] = {}
    evaluate = held.evaluate

    def keep(done: int, generator: Any) -> float:  # each problem's correctness, per evaluation
        acc = evaluate(done, generator)
        correct[str(done)] = [int(bool(r["completions"][0]["correct"])) for r in held.last]
        return acc

    held.evaluate = keep  # type: ignore[method-assign]
    sft = "data/models/sft"
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    run, models, state = setup(p, load_model(sft), load_tokenizer(sft), rows=read_jsonl("data/corpus/problems/rl.jsonl"),
                               rm_dir=args.rm, heldout=held)
    try:
        if iters > 1:
            with tempfile.TemporaryDirectory() as tmp:
                run_iterations(run, models, state, ckpt_dir=None, out_dir=Path(tmp))
        else:
            begin_iteration(run, models, state, 1, None)
            train(run, models, state, 0, p.steps)
        if state.stopped:  # the guard's stop: the restored policy is the run's, at every later evaluation too
            keep(args.steps, models.generator)
            for k in range(0, args.steps, args.heldout_every):
                correct.setdefault(str(k), correct[str(args.steps)])
    finally:
        close(run, models, state)
    rm_ups = [{"iteration": it["iteration"], **{f"{k}_{w}": ((it.get("rm") or {}).get(f"heldout_{w}_update") or {}).get(k)
                                                for w in ("before", "after") for k in ("outcome_auc", "step_auc")}}
              for it in state.info.get("iterations", []) if it.get("rm")]
    return {"method": method, "seed": seed, "steps": [
        {"step": r["step"] + 1, "reward": r["reward_mean"], "rm_raw": r.get("rm_raw_mean"), "rule_accuracy": r["accuracy"],
         "kl": r["kl"], "completion_len": r["completion_len"]} for r in state.history],
        "heldout": {k: sum(v) / len(v) for k, v in correct.items()}, "correct": correct, "stopped": state.stopped,
        "rm_divergence": state.info.get("rm_divergence", []), "rm_updates": rm_ups,
        "wall_s": round(time.perf_counter() - t0, 1), "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}


def run_all(args: argparse.Namespace, work: Path) -> None:
    """Every (method, seed) without a result in ``work``, ``--jobs`` child processes at a time."""
    todo = [(m, s) for m in args.methods for s in args.seeds if not (work / f"{m}-s{s}.json").exists()]
    todo = todo if args.jobs > 0 else []  # --jobs 0: collect what finished
    live: list[tuple[subprocess.Popen[bytes], str]] = []
    while todo or live:
        while todo and len(live) < args.jobs:
            m, s = todo.pop(0)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", m, str(s), "--work", str(work),
                   "--rm", str(Path(args.project, args.rm).resolve()), "--steps", str(args.steps), "--threads", str(args.threads),
                   "--heldout-every", str(args.heldout_every), "--heldout-limit", str(args.heldout_limit)]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            with open(work / f"{m}-s{s}.log", "wb") as log:  # the child writes through its own copy of the fd
                live.append((subprocess.Popen(cmd, cwd=args.project, env=env, stdout=log, stderr=subprocess.STDOUT),
                             f"{m}-s{s}"))
            print(f"{time.strftime('%H:%M:%S')} start {m} seed {s} (load {os.getloadavg()[0]:.2f})", flush=True)
        time.sleep(5)
        for proc, name in list(live):
            if proc.poll() is not None:
                live.remove((proc, name))
                print(f"{time.strftime('%H:%M:%S')} {name}: exit {proc.returncode}", flush=True)


def summarize(runs: list[dict[str, Any]], resamples: int = 2000) -> dict[str, Any]:
    """``methods``: per method, in benchmarks/paradigm.py's summary schema (the report draws it), the held-out mean
    and sd at each evaluation all its seeds share, with the last 5 steps' monitor means; ``sft``: the step-0
    accuracy (the same model in every run); ``pairs``: the paired bootstrap of every pair in :data:`PAIRS` with runs
    on both sides (``sft``: the step-0 evaluation); ``comparison``: Figure 5's chain as paradigm.py compares it."""
    from benchmarks.paradigm import PAPER_ORDER_RM, _mean_sd, compare_with_paper
    from stages.core.stats import paired_bootstrap

    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["method"], []).append(r)
    methods: dict[str, Any] = {}
    final: dict[str, list[float]] = {}
    for m, rs in by.items():
        steps = sorted(set.intersection(*(set(map(int, r["heldout"])) for r in rs)))
        ms = [_mean_sd([r["heldout"][str(s)] for r in rs]) for s in steps]
        final[m] = [sum(c) / len(rs) for c in zip(*(r["correct"][str(steps[-1])] for r in rs), strict=True)]
        tail = [row for r in rs for row in r["steps"][-5:]]
        methods[m] = {"seeds": sorted(r["seed"] for r in rs), "steps": steps, "mean": [round(x[0], 4) for x in ms],
                      "sd": [round(x[1], 4) for x in ms], "final_mean": round(ms[-1][0], 4),
                      "final_sd": round(ms[-1][1], 4),
                      "last5": {k: round(sum(x[k] for x in tail) / len(tail), 4)
                                for k in ("reward", "rule_accuracy", "kl", "completion_len")},
                      "wall_s": round(sum(r["wall_s"] for r in rs) / len(rs), 1),
                      "load": [min(r["load"][0] for r in rs), max(max(r["load"]) for r in rs)]}
    final["sft"] = [float(c) for c in runs[0]["correct"]["0"]]
    pairs = []
    for a, b in PAIRS:
        if a in final and b in final:
            bs = paired_bootstrap(final[b], final[a], resamples=resamples)
            pairs.append({"better": a, "worse": b, "diff": round(float(bs["diff"]), 4), "lo": round(float(bs["lo"]), 4),
                          "hi": round(float(bs["hi"]), 4), "p_value": round(float(bs["p_value"]), 4),
                          "holds": bool(bs["diff"] > 0), "beyond_noise": bool(bs["beyond_noise"])})
    chain = {m: methods[m] for m in PAPER_ORDER_RM if m in methods}
    comparison = compare_with_paper(chain, PAPER_ORDER_RM) if len(chain) > 1 else None
    boot = {f"{q['better']} > {q['worse']}": q for q in pairs}
    for c in comparison["pairs"] if comparison else []:  # the report shows the verdict: with its interval
        q = boot[c["pair"]]
        c["verdict"] += f"; paired bootstrap over problems, 95%: {q['lo']:+.3f} to {q['hi']:+.3f}"
    return {"methods": methods, "sft": round(sum(final["sft"]) / len(final["sft"]), 4), "pairs": pairs,
            "n_problems": len(final["sft"]),
            "comparison": {"reward_model": comparison} if comparison else {}}


def figure6(runs: list[dict[str, Any]], summ: dict[str, Any], steps: int) -> dict[str, Any] | None:
    """Paper Figure 6 in benchmarks/results/iterative_rl.json's schema (the report reads ``runs[].supervision`` /
    ``accuracy_per_iteration`` and ``sft_accuracy``; results_pages' ``iterations`` the ``summary``): per run of
    :data:`FIGURE6` the held-out accuracy after each iteration's steps, mean +- sd per method, and the final
    difference with its paired bootstrap; None without runs of both."""
    from benchmarks.paradigm import _mean_sd

    one, many = FIGURE6
    k = int(METHODS[many]["iterative.iterations"])
    m_steps = steps // k
    labels = {one: f"1 iteration x {k * m_steps} steps", many: f"{k} iterations x {m_steps} steps"}
    rs = [r for r in runs if r["method"] in labels]
    pair = next((q for q in summ["pairs"] if (q["better"], q["worse"]) == (many, one)), None)
    if pair is None:
        return None
    out = [{"seed": r["seed"], "method": r["method"], "supervision": labels[r["method"]], "rm_updates": r["rm_updates"],
            "accuracy_per_iteration": [r["heldout"][str(m_steps * (j + 1))] for j in range(k)]} for r in rs]
    summary = {}
    for m, label in labels.items():
        accs = [r["accuracy_per_iteration"] for r in out if r["method"] == m]
        ms = [_mean_sd([a[j] for a in accs]) for j in range(k)]
        summary[label] = {"seeds": len(accs), "mean": [x[0] for x in ms], "sd": [x[1] for x in ms]}
    return {"source": "benchmarks/rm_monitor.py", "sft_accuracy": summ["sft"], "steps_per_iteration": m_steps, "runs": out,
            "summary": summary, "comparison": {
                "iterative_minus_one_final": pair["diff"], "interval_95": [pair["lo"], pair["hi"]],
                "clear": pair["beyond_noise"],
                "paper": "iterative RL improves on one iteration, especially at the first iteration"}}


def gao_curve(runs: list[dict[str, Any]], bins: int = 8) -> dict[str, list[dict[str, float]]]:
    """Per RM-rewarded method: the step rows of all seeds binned by sqrt(KL) (equal counts), each bin's mean
    sqrt(KL), RM reward and rule accuracy (Gao et al. 2022, Figure 1's axes: the proxy and the gold reward)."""
    out: dict[str, list[dict[str, float]]] = {}
    for m in dict.fromkeys(r["method"] for r in runs):
        rows = sorted((math.sqrt(max(x["kl"], 0.0)), x["rm_raw"] if x["rm_raw"] is not None else x["reward"],
                       x["rule_accuracy"]) for r in runs if r["method"] == m for x in r["steps"])
        if "rm" not in m or not rows:
            continue
        k = max(1, len(rows) // bins)
        out[m] = [{"sqrt_kl": round(sum(x[0] for x in c) / len(c), 4), "rm_reward": round(sum(x[1] for x in c) / len(c), 4),
                   "rule_accuracy": round(sum(x[2] for x in c) / len(c), 4)}
                  for c in (rows[i:i + k] for i in range(0, len(rows), k))]
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out accuracy against step per method (left); the monitor per RM-rewarded method, the mean over seeds per
    step of the RM reward (solid) and the rule accuracy of the same samples (dashed) (middle); the same two against
    sqrt(KL), Gao et al.'s axes (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    colors = {m: f"C{i}" for i, m in enumerate(result["summary"])}
    for m, s in result["summary"].items():
        a.errorbar(s["steps"], s["mean"], s["sd"], color=colors[m], capsize=2, label=LABELS[m])
    for m in result["gao"]:
        rs = [r for r in result["runs"] if r["method"] == m]
        n = min(len(r["steps"]) for r in rs)
        x = list(range(1, n + 1))
        for key, ls in (("reward", "-"), ("rule_accuracy", "--")):
            b.plot(x, [sum(r["steps"][i][key] for r in rs) / len(rs) for i in range(n)], ls, color=colors[m],
                   label=f"{LABELS[m]}: {'RM reward' if key == 'reward' else 'rule accuracy'}")
        pts = result["gao"][m]
        c.plot([q["sqrt_kl"] for q in pts], [q["rm_reward"] for q in pts], "-o", ms=3, color=colors[m], label=LABELS[m])
        c.plot([q["sqrt_kl"] for q in pts], [q["rule_accuracy"] for q in pts], "--", color=colors[m])
    a.set(xlabel="step", ylabel="held-out greedy accuracy", title="held-out accuracy (mean ± sd over seeds)")
    b.set(xlabel="step", title="the monitor: RM reward (solid), rule accuracy (dashed)")
    c.set(xlabel="sqrt(KL to the reference)", title="the same against sqrt(KL) (Gao et al. 2022)")
    for ax in (a, b, c):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(frameon=False, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", default=".", help="a finished default run (its SFT model, problems, params.yaml)")
    ap.add_argument("--rm", default="data/models/reward_model", help="the reward model directory (in --project)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS),
                    choices=list(METHODS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--heldout-every", type=int, default=10)
    ap.add_argument("--heldout-limit", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (0: run nothing, collect the finished runs)")
    ap.add_argument("--work", default=None, help="one JSON per finished run (default: WORK beside --out)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--iterative-out", default=None, metavar="JSON", help="also write paper Figure 6 to this file")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    work = Path(args.work or out.with_suffix(".runs"))
    work.mkdir(parents=True, exist_ok=True)
    if args.one:
        r = one(args.one[0], int(args.one[1]), args)
        tmp = work / f".{args.one[0]}-s{args.one[1]}.json"
        tmp.write_text(json.dumps(r) + "\n")
        tmp.replace(work / f"{args.one[0]}-s{args.one[1]}.json")
        return 0
    t0 = time.perf_counter()
    run_all(args, work)
    runs = [json.loads((work / f"{m}-s{s}.json").read_text()) for m in args.methods for s in args.seeds
            if (work / f"{m}-s{s}.json").exists()]
    if not runs:
        raise SystemExit(f"no finished run in {work}: see the .log files there")
    from benchmarks._tiny import machine

    summ = summarize(runs)
    result = {"project": str(Path(args.project).resolve()), "rm": str(Path(args.project, args.rm).resolve()),
              "args": {k: v for k, v in vars(args).items() if k != "one"}, "seeds": args.seeds,
              "summary": summ["methods"], **{k: v for k, v in summ.items() if k != "methods"}, "gao": gao_curve(runs),
              "runs": runs, "note": f"benchmarks/rm_monitor.py: the RM {args.rm}, {args.steps} steps, held-out greedy CoT on "
                                    f"{summ['n_problems']} problems; a shared 2-core machine, {args.jobs} run(s) at a time", "machine": machine(), "wall_s": round(time.perf_counter() - t0, 1),
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    plot(result, out.with_suffix(".png"))
    fig6 = figure6(runs, summ, args.steps) if args.iterative_out else None
    if fig6 is not None:
        fig6.update(measured_at=result["measured_at"], note=result["note"], machine=result["machine"])
        Path(args.iterative_out).write_text(json.dumps(fig6, indent=1) + "\n")
    print(f"SFT (start): {result['sft']:.3f}")
    for m, s in result["summary"].items():
        curve = zip(s["steps"], s["mean"], s["sd"], strict=True)
        print(f"{LABELS[m]:32s} " + "  ".join(f"{k}: {v:.3f}±{d:.3f}" for k, v, d in curve))
    for q in result["pairs"]:
        print(f"{LABELS[q['better']]} > {LABELS[q['worse']]}: {q['diff']:+.3f} [{q['lo']:+.3f}, {q['hi']:+.3f}]"
              f"{' beyond noise' if q['beyond_noise'] else ''}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

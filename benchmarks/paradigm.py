"""The paper's unified-paradigm comparison (DeepSeekMath section 5.2.1, Figure 5): RFT, online RFT, GRPO with outcome
supervision and GRPO with process supervision, several seeds each, as DVC experiments of the grpo stage.

Each run is ``dvc exp run --queue -s grpo -n <name> -S grpo.algorithm=... -S grpo.reward.source=... -S grpo.seed=...``
plus the held-out curve (``grpo.heldout.every``) and any ``--set`` overrides; then ``dvc queue start`` runs the
queue and the script waits for it. It collects every experiment's held-out greedy accuracy versus step
(data/metrics/grpo.json, ``heldout.accuracy_at_step``) from ``dvc exp show --json``, writes benchmarks/results/paradigm.json and
benchmarks/results/paradigm.png (mean +- sd over seeds per method), prints a table, and compares the ordering of the
final accuracies with the paper's: GRPO+PS > GRPO+OS > online RFT > RFT.

    python benchmarks/paradigm.py                  # print the plan (the dvc commands) and exit: queues nothing
    python benchmarks/paradigm.py --run            # 4 methods x 3 seeds with params.yaml's grpo section
    python benchmarks/paradigm.py --run --seeds 0 --methods rft grpo_os --set grpo.steps=2 --heldout-every 1
    python benchmarks/paradigm.py --collect-only --tag 20261130-1200  # re-collect a finished queue

Methods: rft / online_rft use the rule reward (answer correctness), as in the paper's table. GRPO runs twice over:
with exact supervision, grpo_os (the rule reward: answer correctness) and grpo_ps (``process_rule``: the generated
problems' exact step labels), and with the trained reward model as the paper does, grpo_os_rm / grpo_ps_rm
(data/models/reward_model: ``reward_source`` outcome_rm / process_rm). The exact pair separates "process vs
outcome supervision" from "how good the RM is"; each pair is compared with the paper's order on its own. The experiments run
``-s`` (only the grpo stage) in DVC's temporary directories, which DVC fills from the committed ``dvc.lock`` and
the cache: run ``dvc repro reward_model`` and commit ``dvc.lock`` first (the script refuses otherwise).
``--copy-inputs`` also copies the workspace's grpo inputs in (``-C``); with DVC 3.67 a copied output without a
lock entry was removed again before the stage ran, so the lock is what counts. The continued-SFT baseline is
switched off (``grpo.baseline.enabled=false``). Not in CI: the full comparison (6 methods x 3 seeds) took 70 min
with two parallel experiments on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "paradigm.json"

METHODS: dict[str, dict[str, str]] = {
    "rft": {"grpo.algorithm": "rft", "grpo.reward.source": "rule"},
    "online_rft": {"grpo.algorithm": "online_rft", "grpo.reward.source": "rule"},
    "grpo_os": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule"},
    "grpo_ps": {"grpo.algorithm": "grpo", "grpo.reward.source": "process_rule"},
    "grpo_os_rm": {"grpo.algorithm": "grpo", "grpo.reward.source": "outcome_rm"},
    "grpo_ps_rm": {"grpo.algorithm": "grpo", "grpo.reward.source": "process_rm"},
    # issue 17: PPO on the same data (G outputs per question, the rule reward), and GRPO from the pretrained model
    # with DeepSeek-R1-Zero's template and format reward (no SFT)
    "ppo_os": {"grpo.algorithm": "ppo", "grpo.advantage.estimator": "gae", "grpo.reward.source": "rule"},
    "grpo_zero": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.start": "pretrain",
                  "grpo.template": "r1", "grpo.reward.format_weight": "1.0"},
    # issue 19, Figure 6: iterative RL, 2 iterations of 20 steps (the RM retrained on the policy's samples with 10%
    # replay in between) against the 40-step one-iteration grpo_ps_rm runs: equal total steps
    "grpo_ps_rm_iter2": {"grpo.algorithm": "grpo", "grpo.reward.source": "process_rm",
                         "grpo.iterative.iterations": "2", "grpo.steps": "20"},
    # issue 32: today's recipes against the paper's GRPO (grpo_os), same data, steps and rollouts per step. GSPO, CISPO
    # and DAPO's clip-higher act only when the ratio moves off 1: they run with 4 minibatches (4 optimizer steps per
    # rollout batch, as DAPO's 16 and verl's ppo_mini_batch_size), against the same GRPO (grpo_mb4) as well
    "grpo_mb4": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.optim.minibatches": "4"},
    "grpo_ds": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.dynamic_sampling.enabled": "true"},
    "dapo": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.loss.clip_eps_high": "0.28",
             "grpo.loss.aggregation": "token-mean", "grpo.dynamic_sampling.enabled": "true",
             "grpo.reward.overlong.factor": "1.0", "grpo.kl.beta": "0.0", "grpo.optim.minibatches": "4"},
    "gspo": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.loss.policy": "gspo",
             "grpo.loss.clip_eps": "0.0003", "grpo.loss.clip_eps_high": "0.0004", "grpo.optim.minibatches": "4"},
    "cispo": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.loss.policy": "cispo",
              "grpo.loss.aggregation": "token-mean", "grpo.optim.minibatches": "4"},
    "dr_grpo": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.advantage.scale_rewards": "none",
                "grpo.loss.aggregation": "seq-mean-token-sum-norm"},
    "grpo_entropy": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.loss.entropy_coef": "0.01"},
    "grpo_curriculum": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.curriculum.enabled": "true"},
    # LoRA GRPO (issue 32 item 3): rank 16 on every linear layer (params.yaml's grpo.lora), at 10x the full-parameter
    # learning rate, the usual LoRA practice (Schulman et al. 2025, "LoRA Without Regret": LoRA's best LR ~10x FullFT's)
    "grpo_lora": {"grpo.algorithm": "grpo", "grpo.reward.source": "rule", "grpo.lora.enabled": "true",
                  "grpo.optim.lr": "2.0e-4"},
}
LABELS = {"rft": "RFT", "online_rft": "Online RFT", "grpo_os": "GRPO+OS", "grpo_ps": "GRPO+PS",
          "grpo_os_rm": "GRPO+OS(RM)", "grpo_ps_rm": "GRPO+PS(RM)", "ppo_os": "PPO+OS",
          "grpo_zero": "GRPO-Zero (R1)", "grpo_ps_rm_iter2": "GRPO+PS(RM), 2 iterations",
          "grpo_mb4": "GRPO, 4 minibatches", "grpo_ds": "GRPO + dynamic sampling", "dapo": "DAPO", "gspo": "GSPO",
          "cispo": "CISPO", "dr_grpo": "Dr. GRPO", "grpo_entropy": "GRPO + entropy bonus",
          "grpo_curriculum": "GRPO + curriculum", "grpo_lora": "LoRA GRPO (r 16)"}
PAPER_ORDER = ("grpo_ps", "grpo_os", "online_rft", "rft")  # Figure 5, best first (exact labels as the supervision)
# the same order with trained reward models as the supervision, as in the paper's runs
PAPER_ORDER_RM = ("grpo_ps_rm", "grpo_os_rm", "online_rft", "rft")
CHAINS = {"exact": PAPER_ORDER, "reward_model": PAPER_ORDER_RM}
_RANK = ("grpo_ps", "grpo_ps_rm", "grpo_ps_rm_iter2", "grpo_os", "grpo_os_rm", "online_rft", "rft", "ppo_os",
         "grpo_zero", "grpo_mb4", "grpo_ds", "dapo", "gspo", "cispo", "dr_grpo", "grpo_entropy",
         "grpo_curriculum", "grpo_lora")  # tie-break
RECIPES = ("grpo_os", "grpo_mb4", "grpo_ds", "dapo", "gspo", "cispo", "dr_grpo", "grpo_entropy", "grpo_curriculum",
           "grpo_lora", "grpo_zero")
"""Issue 32's comparison (``--methods`` of its runs): each against the paper's GRPO (:func:`versus`)."""
FIGURE6 = ("grpo_ps_rm", "grpo_ps_rm_iter2")  # (one iteration, two iterations at equal total steps)
# the grpo stage's inputs, as directories: DVC's -C copies a file only into an existing directory
UPSTREAM = ("data", "corpus", "sft", "reward_model")  # the stages whose outputs the grpo stage reads
GRPO_INPUTS = ("data/models/sft", "data/models/pretrain", "data/models/reward_model", "data/corpus/problems",
               "data/generated/problems")


# ---------------------------------------------------------------------------------------------
# pure pieces (tests/benchmarks/test_paradigm.py)


def exp_name(tag: str, method: str, seed: int) -> str:
    """The DVC experiment name of one run: ``paradigm-<tag>-<method>-s<seed>``."""
    return f"paradigm-{tag}-{method.replace('_', '-')}-s{seed}"


def parse_name(name: str, tag: str) -> tuple[str, int] | None:
    """(method, seed) of an experiment name made by :func:`exp_name` with ``tag``; None for other names."""
    m = re.fullmatch(rf"paradigm-{re.escape(tag)}-([a-z0-9-]+)-s(\d+)", name or "")
    if m is None or m.group(1).replace("-", "_") not in METHODS:
        return None
    return m.group(1).replace("-", "_"), int(m.group(2))


def force(override: str) -> str:
    """``KEY=VALUE`` as ``++KEY=VALUE`` (Hydra's add-or-override): params.yaml names only what differs from the
    schema's defaults, and a plain ``-S`` of a key the file does not name is refused by DVC."""
    return override if override.startswith(("+", "~")) else f"++{override}"


def queue_command(name: str, method: str, seed: int, *, heldout_every: int, heldout_limit: int | None,
                  sets: Sequence[str], copy_paths: Sequence[str]) -> list[str]:
    """The ``dvc exp run --queue`` arguments (after ``dvc``) of one run."""
    params = {"grpo.seed": str(seed), "grpo.heldout.every": str(heldout_every), "grpo.baseline.enabled": "false",
              "grpo.iterative.iterations": "1", **METHODS[method]}  # a method may set iterations (grpo_ps_rm_iter2)
    if heldout_limit is not None:
        params["grpo.heldout.limit"] = str(heldout_limit)
    cmd = ["exp", "run", "--queue", "-s", "-n", name]
    for s in [f"{k}={v}" for k, v in params.items()] + list(sets):
        cmd += ["-S", force(s)]
    for c in copy_paths:
        cmd += ["-C", c]
    return cmd + ["grpo"]


def _walk(node: Any) -> Iterable[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def extract_runs(exp_show: Any, tag: str) -> list[dict[str, Any]]:
    """The runs of ``tag`` in ``dvc exp show --json`` output: method, seed, name, rev, held-out curve, error.

    A run whose metrics file lacks the held-out curve (failed or still queued) has ``steps`` / ``accuracy`` None
    and its ``error`` / status noted."""
    runs: dict[str, dict[str, Any]] = {}
    for node in _walk(exp_show):
        name = node.get("name")
        parsed = parse_name(name, tag) if isinstance(name, str) else None
        if parsed is None or "rev" not in node:
            continue
        data = node.get("data") or {}
        metrics = ((data.get("metrics") or {}).get("data/metrics/grpo.json") or {}).get("data") or {}
        held = metrics.get("heldout") or {}
        curve = sorted((int(k), float(v)) for k, v in (held.get("accuracy_at_step") or {}).items())
        run = {"method": parsed[0], "seed": parsed[1], "name": name, "rev": node.get("rev"),
               "status": data.get("status") or node.get("status"),
               "steps": [s for s, _ in curve] or None, "accuracy": [a for _, a in curve] or None,
               "n_heldout": held.get("n"),
               "wall_s": metrics.get("wall_s"), "error": node.get("error") or data.get("error"),
               **run_stats({"step_s_mean": (metrics.get("grpo") or {}).get("step_s_mean"),
                            "grpo_wall_s": metrics.get("grpo_wall_s"), "memory": metrics.get("memory"),
                            "trained_parameters": metrics.get("trained_parameters")})}
        if name not in runs or (run["accuracy"] is not None and runs[name]["accuracy"] is None):
            runs[name] = run
    return sorted(runs.values(), key=lambda r: (list(METHODS).index(r["method"]), r["seed"]))


def run_stats(run: dict[str, Any] | None) -> dict[str, Any]:
    """Time per step, peak memory and trained parameters of one run (its metrics, or pipeline.json's ``run``)."""
    run = run or {}
    mem = run.get("memory") or {}
    return {"step_s_mean": run.get("step_s_mean"), "grpo_wall_s": run.get("grpo_wall_s"),
            "peak_rss_mib": mem.get("peak_rss_mib"), "peak_cuda_allocated_mib": mem.get("peak_cuda_allocated_mib"),
            "trained_parameters": run.get("trained_parameters")}


TRAINING_KEYS = ("reward_mean_first5", "reward_mean_last5", "accuracy_first5", "accuracy_last5", "kl_last5",
                 "completion_len_first5", "completion_len_last5")
"""The training signals kept per run (the grpo stage's summary): the reward the policy optimised against the rule
accuracy of its samples, the KL and the completion length (a reward-hacked run's reward rises as its accuracy falls)."""


def training_stats(info: dict[str, Any]) -> dict[str, Any]:
    """The :data:`TRAINING_KEYS` of a run's pipeline.json ``summary`` and, with iterative RL, the RM's held-out AUCs
    before / after each update (``iterations[].rm``)."""
    summ = info.get("summary") or {}
    out: dict[str, Any] = {k: summ[k] for k in TRAINING_KEYS if summ.get(k) is not None}
    ups = []
    for it in info.get("iterations") or []:
        rm = (it or {}).get("rm") or {}
        if rm:
            b, a = rm.get("heldout_before_update") or {}, rm.get("heldout_after_update") or {}
            ups.append({"iteration": it.get("iteration"), "n_new_examples": rm.get("n_new_examples"),
                        **{f"{k}_before": b.get(k) for k in ("outcome_auc", "step_auc")},
                        **{f"{k}_after": a.get(k) for k in ("outcome_auc", "step_auc")}})
    if ups:
        out["rm_updates"] = ups
    return out


def read_model_curves(project: Path, runs: list[dict[str, Any]]) -> None:
    """Fill in the curve of runs whose metrics file was not in ``dvc exp show`` (a project whose .gitignore still
    ignores data/metrics, so its experiments do not commit it) from the experiment's DVC-cached model: ``heldout``
    of data/models/grpo/pipeline.json at the experiment's revision (``dvc.api.read``), with the run's training
    signals (:func:`training_stats`)."""
    import dvc.api

    for r in runs:
        if r["accuracy"] is not None or not r.get("rev") or r.get("reused_from"):
            continue
        try:
            info = json.loads(dvc.api.read("data/models/grpo/pipeline.json", repo=str(project), rev=r["rev"]))
        except Exception as e:  # noqa: BLE001 - a failed run has no model; keep it as missing
            r["error"] = r.get("error") or f"{type(e).__name__}: {str(e)[:200]}"
            continue
        held = info.get("heldout") or {}
        curve = sorted((int(k), float(v)) for k, v in (held.get("accuracy_at_step") or {}).items())
        if curve:
            r["steps"], r["accuracy"], r["n_heldout"] = [s for s, _ in curve], [a for _, a in curve], held.get("n")
            r["curve_from"] = "data/models/grpo/pipeline.json"
            if info.get("run"):
                r.update({k: v for k, v in run_stats(info["run"]).items() if v is not None})
            if training_stats(info):
                r["training"] = training_stats(info)


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: seeds, the mean and sd of the held-out accuracy at every step all its finished runs share,
    and the final (last shared step) accuracy's mean and sd."""
    out: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        done = [r for r in runs if r["method"] == method and r.get("accuracy")]
        if not done:
            continue
        common = sorted(set.intersection(*(set(r["steps"]) for r in done)))
        means, sds = [], []
        for s in common:
            m, sd = _mean_sd([r["accuracy"][r["steps"].index(s)] for r in done])
            means.append(m)
            sds.append(sd)
        out[method] = {"seeds": [r["seed"] for r in done], "steps": common, "mean": means, "sd": sds,
                       "final_mean": means[-1] if means else math.nan, "final_sd": sds[-1] if sds else math.nan}
        for key in ("step_s_mean", "grpo_wall_s", "peak_rss_mib", "peak_cuda_allocated_mib", "load_mean"):
            vals = [r[key] for r in done if r.get(key) is not None]
            if vals:
                out[method][key] = _mean_sd(vals)[0]
        params = [r["trained_parameters"] for r in done if r.get("trained_parameters")]
        if params:
            out[method]["trained_parameters"] = params[0]
        train = {k: _mean_sd([(r.get("training") or {}).get(k) for r in done])[0] for k in TRAINING_KEYS}
        train = {k: round(v, 6) for k, v in train.items() if math.isfinite(v)}
        if train:
            out[method]["training"] = train
    return out


def reuse_runs(path: Path) -> list[dict[str, Any]]:
    """The finished runs of a previous result file (``--reuse``), each marked ``reused_from`` with the file it first
    came from (its own ``reused_from``, else this file's tag and date)."""
    old = json.loads(Path(path).read_text())
    src = f"{old.get('tag')} ({str(old.get('measured_at'))[:10]})"
    return [{**r, "reused_from": r.get("reused_from") or src} for r in old.get("runs", [])
            if r.get("method") in METHODS and r.get("accuracy")]


def _at(run: dict[str, Any], step: int) -> float | None:
    return run["accuracy"][run["steps"].index(step)] if step in (run.get("steps") or []) else None


def iterative_result(runs: Sequence[dict[str, Any]], one: str = FIGURE6[0], two: str = FIGURE6[1]
                     ) -> dict[str, Any] | None:
    """Paper Figure 6 from the runs of ``two`` (2 iterations of M steps) and ``one`` (one iteration of 2M steps): per
    run the held-out accuracy after M and 2M steps, in benchmarks/results/iterative_rl.json's schema (the report
    reads ``runs[].supervision`` / ``accuracy_per_iteration`` and ``sft_accuracy``), the mean +- sd per method and
    the final difference; None without finished runs of both."""
    two_runs = [r for r in runs if r["method"] == two and r.get("accuracy")]
    one_runs = [r for r in runs if r["method"] == one and r.get("accuracy")]
    if not two_runs or not one_runs:
        return None
    M = max(two_runs[0]["steps"]) // 2
    labels = {one: f"1 iteration x {2 * M} steps", two: f"2 iterations x {M} steps"}
    out_runs: list[dict[str, Any]] = []
    per: dict[str, list[list[float]]] = {}
    for r in one_runs + two_runs:
        accs = [_at(r, M), _at(r, 2 * M)]
        if any(a is None for a in accs):
            continue
        out_runs.append({"seed": r["seed"], "method": r["method"], "supervision": labels[r["method"]],
                         "accuracy_per_iteration": accs, "name": r.get("name"),
                         "rm_updates": (r.get("training") or {}).get("rm_updates")})
        per.setdefault(r["method"], []).append(accs)
    start = [a for r in one_runs + two_runs if (a := _at(r, 0)) is not None]
    summary = {labels[m]: {"seeds": len(v), "mean": [_mean_sd([x[j] for x in v])[0] for j in range(2)],
                           "sd": [_mean_sd([x[j] for x in v])[1] for j in range(2)]} for m, v in per.items()}
    if len(summary) < 2:
        return None
    a, b = summary[labels[two]], summary[labels[one]]
    diff = a["mean"][1] - b["mean"][1]
    return {"source": "benchmarks/paradigm.py", "sft_accuracy": _mean_sd(start)[0] if start else None,
            "steps_per_iteration": M, "runs": out_runs, "summary": summary,
            "comparison": {"two_minus_one_final": round(diff, 6), "clear": abs(diff) > a["sd"][1] + b["sd"][1],
                           "paper": "iterative RL (2 iterations) improves on one, especially at the first iteration"}}


def ordering(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Methods by final mean held-out accuracy, best first (ties keep the paper's order; :func:`compare_with_paper`
    reports them as ties, not as agreement)."""
    return sorted(summary, key=lambda m: (-summary[m]["final_mean"], _RANK.index(m)))


def order_text(summary: dict[str, dict[str, Any]]) -> str:
    """The measured order as text, ``=`` between methods with equal final means."""
    order = ordering(summary)
    out = LABELS[order[0]] if order else "-"
    for a, b in zip(order, order[1:], strict=False):
        out += (" = " if summary[a]["final_mean"] == summary[b]["final_mean"] else " > ") + LABELS[b]
    return out


def compare_with_paper(summary: dict[str, dict[str, Any]], chain: Sequence[str] = PAPER_ORDER) -> dict[str, Any]:
    """How the final accuracies agree with the paper's PS > OS > online RFT > RFT, pair by pair over the methods
    present: ``agree`` (a's mean above b's, a ranked above b in the paper), ``disagree``, ``tied`` (equal means);
    a pair is ``clear`` when the means differ by more than the sum of the two sds. ``matches_paper``: every pair
    agrees (no tie, no disagreement)."""
    present = [m for m in chain if m in summary]
    pairs = []
    for i, a in enumerate(present):
        for b in present[i + 1:]:
            diff = summary[a]["final_mean"] - summary[b]["final_mean"]
            spread = (summary[a]["final_sd"] or 0.0) + (summary[b]["final_sd"] or 0.0)
            verdict = "tied" if diff == 0 else ("agree" if diff > 0 else "disagree")
            pairs.append({"pair": f"{a} > {b}", "diff": round(diff, 6), "verdict": verdict,
                          "clear": abs(diff) > spread})
    return {"paper_order": present, "measured_order": [m for m in ordering(summary) if m in present], "pairs": pairs,
            "pairs_agreeing": sum(p["verdict"] == "agree" for p in pairs), "n_pairs": len(pairs),
            "pairs_clear_agreeing": sum(p["verdict"] == "agree" and p["clear"] for p in pairs),
            "matches_paper": bool(pairs) and all(p["verdict"] == "agree" for p in pairs)}


def versus(summary: dict[str, dict[str, Any]], base: str = "grpo_os") -> list[dict[str, Any]]:
    """Each method against ``base`` (the paper's GRPO): the difference of the final mean held-out accuracies, whether
    it is beyond the seed spread (larger than the two sds added), and the wall time of a run relative to base's."""
    if base not in summary:
        return []
    b = summary[base]
    out = []
    for m, v in summary.items():
        if m == base:
            continue
        diff = v["final_mean"] - b["final_mean"]
        spread = (v["final_sd"] or 0.0) + (b["final_sd"] or 0.0)
        wall = v.get("grpo_wall_s") / b["grpo_wall_s"] if v.get("grpo_wall_s") and b.get("grpo_wall_s") else None
        out.append({"method": m, "vs": base, "diff": round(diff, 6), "spread": round(spread, 6),
                    "verdict": ("better" if diff > 0 else "worse") if abs(diff) > spread else "within spread",
                    "wall_ratio": None if wall is None else round(wall, 3)})
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    """A text table: method, seeds, held-out accuracy per step (mean +- sd), final."""
    steps = sorted({s for v in summary.values() for s in v["steps"]})
    head = f"{'method':<12}{'seeds':>6} " + " ".join(f"{'step ' + str(s):>13}" for s in steps)
    lines = [head, "-" * len(head)]
    for m, v in summary.items():
        cells = []
        for s in steps:
            if s in v["steps"]:
                i = v["steps"].index(s)
                cells.append(f"{v['mean'][i]:>7.3f}±{v['sd'][i]:<5.3f}")
            else:
                cells.append(f"{'-':>13}")
        lines.append(f"{LABELS[m]:<12}{len(v['seeds']):>6} " + " ".join(cells))
    return "\n".join(lines)


def cost_table(summary: dict[str, dict[str, Any]]) -> str:
    """Per method: seconds per step, peak resident memory and trained parameters (means over its runs)."""
    lines = [f"{'method':<26}{'s/step':>8}{'run wall s':>11}{'load':>6}{'peak RSS MiB':>14}{'trained params':>26}"]
    for m, v in summary.items():
        tp = v.get("trained_parameters") or {}
        params = " + ".join(f"{k} {n / 1e6:.2f}M" for k, n in tp.items()) or "-"
        s, w, ld = v.get("step_s_mean"), v.get("grpo_wall_s"), v.get("load_mean")
        rss = v.get("peak_rss_mib")
        lines.append(f"{LABELS[m]:<26}{'-' if s is None else f'{s:.2f}':>8}{'-' if w is None else f'{w:.0f}':>11}"
                     f"{'-' if ld is None else f'{ld:.1f}':>6}{'-' if rss is None else f'{rss:.0f}':>14}{params:>26}")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str, methods: Sequence[str] | None = None) -> None:
    """Held-out accuracy versus step, mean over seeds with a +- sd band, one line per method (of ``methods``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in _RANK if m in summary and (methods is None or m in methods)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2) if len(shown) <= 6 else (8.0, 5.6))
    colors = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20").colors
    for i, m in enumerate(shown):
        v = summary[m]
        lo = [a - b for a, b in zip(v["mean"], v["sd"], strict=True)]
        hi = [a + b for a, b in zip(v["mean"], v["sd"], strict=True)]
        c = colors[i % len(colors)]
        ax.plot(v["steps"], v["mean"], marker="o", color=c, label=f"{LABELS[m]} (n={len(v['seeds'])})")
        ax.fill_between(v["steps"], lo, hi, alpha=0.12 if len(shown) > 6 else 0.2, color=c)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small" if len(shown) > 6 else None)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# DVC


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the workers' dvc, the stage's python
    env.setdefault("DVC_NO_ANALYTICS", "1")
    return env


def dvc(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m dvc ARGS`` in ``project`` (this interpreter's dvc, its bin directory first on PATH)."""
    out = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, env=_env(), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise SystemExit(f"dvc {' '.join(args)} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-1500:]}")
    return out


def run_wall_s(span: Sequence[float] | None, poll_s: float) -> float | None:
    """A run's wall time from the polls that saw it running (first, last): last - first + one poll interval, to
    within +- ``poll_s``; it includes the experiment's checkout and commit by DVC. Since issue 29 the stage's own
    wall time (``grpo_wall_s``) is in data/timings/grpo.json, which an experiment does not keep."""
    if not span:
        return None
    return round(span[1] - span[0] + poll_s, 1)


def start_workers(project: Path, jobs: int) -> None:
    """``dvc queue start -j JOBS``, not waiting for the workers: they run detached and would hold a captured
    output pipe open (measured: a ``dvc queue start`` run with captured output returned only when its worker
    exited, an hour later)."""
    out = subprocess.run([sys.executable, "-m", "dvc", "queue", "start", "-j", str(jobs)], cwd=project, env=_env(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if out.returncode != 0:
        raise SystemExit(f"dvc queue start -j {jobs} failed ({out.returncode}) in {project}")


def check_lock(project: Path) -> None:
    """Refuse to queue when the committed dvc.lock lacks a stage the grpo stage reads from (the experiments would fail)."""
    import yaml

    out = subprocess.run(["git", "show", "HEAD:dvc.lock"], cwd=project, capture_output=True, text=True)
    stages = set((yaml.safe_load(out.stdout) or {}).get("stages", {})) if out.returncode == 0 else set()
    missing = [s for s in UPSTREAM if s not in stages]
    if missing:
        raise SystemExit(f"{project}: the committed dvc.lock has no {', '.join(missing)}; the experiments check their "
                         "inputs out from it: run `dvc repro reward_model` and `git add dvc.lock && git commit` first")


def copy_inputs(project: Path) -> list[str]:
    """The grpo inputs present in the workspace but ignored by git (``-C``: a queued experiment's temporary
    directory is a git checkout; git-tracked inputs are there already)."""
    out = []
    for p in GRPO_INPUTS:
        if (project / p).exists():
            ignored = subprocess.run(["git", "check-ignore", "-q", p], cwd=project).returncode == 0
            if ignored:
                out.append(p)
    return out


def parse_queue_status(text: str, names: Sequence[str]) -> tuple[dict[str, str], int | None]:
    """(status of each named task: Queued, Running, Success, Failed, ...; number of active + idle workers, None
    when the output does not say) from the text of ``dvc queue status``."""
    states: dict[str, str] = {}
    workers = None
    for line in text.splitlines():
        parts = line.split()
        for n in names:
            if n in parts:
                states[n] = parts[-1]
        m = re.search(r"Worker status:\s*(\d+) active,\s*(\d+) idle", line)
        if m:
            workers = int(m.group(1)) + int(m.group(2))
    return states, workers


def queue_states(project: Path, names: Sequence[str]) -> tuple[dict[str, str], int | None]:
    """:func:`parse_queue_status` of ``dvc queue status``."""
    return parse_queue_status(dvc(project, "queue", "status", check=False).stdout, names)


def wait_for(project: Path, names: Sequence[str], poll_s: float, timeout_s: float, jobs: int,
             loads: dict[str, list[float]] | None = None,
             spans: dict[str, list[float]] | None = None) -> dict[str, str]:
    """Poll the queue until none of ``names`` is queued or running (or ``timeout_s`` passes). Workers stop when
    they find the queue empty, which can happen while a task is still being queued: tasks left queued with no
    worker get new workers. ``loads``: the machine's 1-minute load average at each poll, appended per task while it
    runs (the load each run was measured under). ``spans``: per task, the first and the last poll (monotonic
    seconds) that saw it running (:func:`run_wall_s`)."""
    t0 = time.monotonic()
    last = ""
    while True:
        st, workers = queue_states(project, names)
        now_t = time.monotonic()
        if loads is not None or spans is not None:
            now = os.getloadavg()[0]
            for n in names:
                if st.get(n) == "Running":
                    if loads is not None:
                        loads.setdefault(n, []).append(now)
                    if spans is not None:
                        spans.setdefault(n, [now_t, now_t])[1] = now_t
        active = [n for n in names if st.get(n) in ("Queued", "Running")]
        if workers == 0 and any(st.get(n) == "Queued" for n in names):
            start_workers(project, jobs)
        line = ", ".join(f"{k}: {sum(1 for v in st.values() if v == k)}" for k in sorted(set(st.values())))
        if line != last:
            print(f"[{time.monotonic() - t0:7.0f}s] queue: {line}", flush=True)
            last = line
        if not active or time.monotonic() - t0 > timeout_s:
            return st
        time.sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", default=str(ROOT), help="the DVC project (default: this repository)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--heldout-every", type=int, default=5, help="grpo.heldout.every (steps between evaluations)")
    ap.add_argument("--heldout-limit", type=int, default=None, help="grpo.heldout.limit (default: params.yaml's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra -S override (repeatable)")
    ap.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M%S"), help="experiment name tag (default: now)")
    ap.add_argument("--jobs", type=int, default=1, help="dvc queue start -j (parallel experiments)")
    ap.add_argument("--copy-inputs", action="store_true", help="also copy the workspace's grpo inputs in (-C)")
    ap.add_argument("--run", action="store_true", help="queue and run the experiments (without it: print the plan)")
    ap.add_argument("--collect-only", action="store_true", help="only collect the experiments of --tag")
    ap.add_argument("--poll", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=48 * 3600.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--reuse", default=None, metavar="JSON",
                    help="keep the finished runs of this earlier result file (e.g. the committed RFT / online-RFT "
                         "runs), marked reused_from, and run only the (method, seed) pairs it has no finished run of")
    ap.add_argument("--iterative-out", default=None, metavar="JSON",
                    help=f"also write paper Figure 6 ({' vs '.join(FIGURE6)}) to this file, in "
                         "benchmarks/results/iterative_rl.json's schema, with a .png beside it")
    args = ap.parse_args(argv)
    project = Path(args.project).resolve()
    reused = reuse_runs(Path(args.reuse)) if args.reuse else []
    done = {(r["method"], r["seed"]) for r in reused}
    names = {exp_name(args.tag, m, s): (m, s) for m in args.methods for s in args.seeds if (m, s) not in done}
    t0 = time.perf_counter()
    loads: dict[str, list[float]] = {}
    spans: dict[str, list[float]] = {}
    copy = copy_inputs(project) if args.copy_inputs else []
    if args.run:
        check_lock(project)
    if not args.run and not args.collect_only:
        print(f"plan ({len(names)} experiments in {project}; add --run to queue and run them):")
        for name, (m, s) in names.items():
            print("  dvc " + " ".join(queue_command(name, m, s, heldout_every=args.heldout_every,
                                                    heldout_limit=args.heldout_limit, sets=args.set, copy_paths=copy)))
        print(f"  dvc queue start -j {args.jobs}")
        return 0
    if not args.collect_only:
        for name, (m, s) in names.items():
            dvc(project, *queue_command(name, m, s, heldout_every=args.heldout_every,
                                        heldout_limit=args.heldout_limit, sets=args.set, copy_paths=copy))
            print(f"queued {name}", flush=True)
        start_workers(project, args.jobs)
        states = wait_for(project, list(names), args.poll, args.timeout, args.jobs, loads, spans)
        dvc(project, "queue", "stop", check=False)  # workers stop by themselves on an empty queue; make sure
    else:
        states = {}
    shown = json.loads(dvc(project, "exp", "show", "--json", "-A").stdout or "[]")
    runs = [r for r in extract_runs(shown, args.tag) if r["name"] in names]
    read_model_curves(project, runs)
    for r in runs:
        r["queue_status"] = states.get(r["name"])
        if loads.get(r["name"]):
            ld = loads[r["name"]]
            r["load_mean"], r["load_max"] = round(sum(ld) / len(ld), 2), round(max(ld), 2)
        if r.get("grpo_wall_s") is None and (w := run_wall_s(spans.get(r["name"]), args.poll)) is not None:
            r["grpo_wall_s"], r["wall_from"] = w, f"queue polls every {args.poll:g} s"
    runs = sorted(reused + runs, key=lambda r: (list(METHODS).index(r["method"]), r["seed"]))
    missing = sorted(set(names) - {r["name"] for r in runs if r.get("accuracy")})
    summary = aggregate(runs)
    cmps = {k: compare_with_paper(summary, chain) for k, chain in CHAINS.items()
            if sum(m in summary for m in chain) >= 2}
    out_path = Path(args.out)
    png = out_path.with_suffix(".png")
    result = {
        "tag": args.tag, "project": str(project), "methods": [m for m in METHODS if m in summary or m in args.methods],
        "seeds": args.seeds, "reused_from": sorted({r["reused_from"] for r in reused}) or None,
        "overrides": args.set, "heldout_every": args.heldout_every, "runs": runs, "missing_or_failed": missing,
        "summary": summary, "comparison": cmps, "versus_grpo": versus(summary),
        "plot": str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png),
        "wall_s": round(time.perf_counter() - t0, 1), "note": "shared 2-core machine; timings noisy",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    if summary:
        plot(summary, png, f"Held-out accuracy vs step ({args.tag})", [m for m in summary if m != FIGURE6[1]])
    fig6 = iterative_result(runs) if args.iterative_out else None
    if fig6 is not None:
        it_path = Path(args.iterative_out)
        fig6.update(tag=args.tag, measured_at=result["measured_at"], note=result["note"],
                    plot=str(it_path.with_suffix(".png").relative_to(ROOT)
                             if it_path.with_suffix(".png").is_relative_to(ROOT) else it_path.with_suffix(".png")))
        it_path.parent.mkdir(parents=True, exist_ok=True)
        it_path.write_text(json.dumps(fig6, indent=1) + "\n")
        plot(summary, it_path.with_suffix(".png"), f"Iterative RL, PS(RM): held-out accuracy vs step ({args.tag})",
             FIGURE6)
        print(f"\nFigure 6: {json.dumps(fig6['summary'])}; 2 minus 1 iteration at the end: "
              f"{fig6['comparison']['two_minus_one_final']:+.3f} (beyond seed spread: {fig6['comparison']['clear']})")
        print(f"wrote {it_path} and {it_path.with_suffix('.png')}")
    print("\nheld-out greedy accuracy, mean ± sd over seeds")
    print(table(summary) if summary else "(no finished run)")
    print("\n" + cost_table(summary))
    print(f"\nmeasured order: {order_text(summary)}")
    for v in versus(summary):
        print(f"  {LABELS[v['method']]} vs {LABELS[v['vs']]}: {v['diff']:+.3f} (seed spread {v['spread']:.3f}: "
              f"{v['verdict']}); run wall time x{v['wall_ratio']}")
    for k, cmp in cmps.items():
        print(f"\n[{k}] paper order: {' > '.join(LABELS[m] for m in cmp['paper_order'])}; measured: "
              f"{' > '.join(LABELS[m] for m in cmp['measured_order'])}")
        print(f"pairs ordered as in the paper: {cmp['pairs_agreeing']}/{cmp['n_pairs']} "
              f"({cmp['pairs_clear_agreeing']} by more than the sum of the two sds); matches the paper: "
              f"{cmp['matches_paper']}")
        for p in cmp["pairs"]:
            if p["verdict"] != "agree":
                print(f"  {p['pair']}: {p['verdict']} (difference {p['diff']:+.3f})")
    if missing:
        print(f"missing or failed runs: {', '.join(missing)}")
    print(f"wrote {out_path}" + (f" and {png}" if summary else ""))
    return 0 if not missing else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The overoptimisation monitor on the tiny default: GRPO from the SFT model with the learned outcome reward
model, the same seed twice: without a guard (the RM is hacked when its reward rises while the rule accuracy of the same
samples falls and the KL grows) and with ``grpo.reward.rm_guards.divergence`` (stages/rl/guards.py). Per step: the
RM reward (``reward_mean``), the rule accuracy of the same samples (``accuracy``) and the KL, as the step row has
them; the guard's events. Other GRPO settings come from params.yaml's grpo section.

    python benchmarks/rm_monitor.py --sft data/models/sft --rm data/models/reward_model --steps 20

Writes benchmarks/results/rm_monitor.json and benchmarks/results/rm_monitor.png. Not in CI (minutes of CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "rm_monitor.json"


def run(p: Any, sft: str, rm: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One GRPO run of ``p`` from ``sft`` with the RM in ``rm``: the per-step monitor and the guard's events."""
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.loop import fit

    t0 = time.perf_counter()
    _, _, state = fit(p, load_model(sft), load_tokenizer(sft), rows=rows, rm_dir=rm)
    return finish({"steps": [{"step": r["step"], "rm_reward": r["reward_mean"], "rule_accuracy": r["accuracy"],
                              "kl": r["kl"], "completion_len": r["completion_len"],
                              "rm_divergence": r.get("rm_divergence")} for r in state.history],
                   "rm_divergence": state.info.get("rm_divergence", []), "stopped": state.stopped,
                   "wall_s": round(time.perf_counter() - t0, 1)})


def finish(r: dict[str, Any], k: int = 5) -> dict[str, Any]:
    """Step numbers as steps done (the row's ``step`` + 1, dvclive's x), the guard's events likewise, and the means of
    the first and last ``k`` steps."""
    for s in r["steps"]:
        s["step"] += 1
    for ev in r["rm_divergence"]:
        ev["step"], ev["best_step"] = ev["step"] + 1, ev["best_step"] + 1
    r["summary"] = {f"{key}_{part}{k}": round(sum(s[key] for s in sl) / len(sl), 4)
                    for key in ("rm_reward", "rule_accuracy", "kl", "completion_len")
                    for part, sl in (("first", r["steps"][:k]), ("last", r["steps"][-k:]))}
    return r


def plot(out: dict[str, Any], path: Path) -> None:
    """RM reward and rule accuracy against step (left), KL against step (right); one colour per run, dotted lines at
    the guard's events."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for color, (name, r) in zip(("C3", "C0"), out["runs"].items(), strict=False):
        x = [s["step"] for s in r["steps"]]
        a.plot(x, [s["rm_reward"] for s in r["steps"]], "-", color=color, label=f"{name}: RM reward")
        a.plot(x, [s["rule_accuracy"] for s in r["steps"]], "--", color=color, label=f"{name}: rule accuracy")
        b.plot(x, [s["kl"] for s in r["steps"]], "-", color=color, label=name)
        for ev in r["rm_divergence"]:
            for ax in (a, b):
                ax.axvline(ev["step"], color=color, ls=":", lw=1)
    a.set_title("the same samples: RM reward, rule accuracy")
    b.set_title("KL to the reference")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", default=str(ROOT / "data/models/sft"))
    ap.add_argument("--rm", default=str(ROOT / "data/models/reward_model"))
    ap.add_argument("--rl", default=str(ROOT / "data/corpus/problems/rl.jsonl"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--action", choices=("stop", "revert"), default="revert")
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--drop", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    import torch

    from stages.core.io import read_jsonl
    from stages.params import load_params

    torch.set_num_threads(args.threads)
    base = load_params(args.params).grpo.updated({
        "seed": args.seed, "steps": args.steps, "reward.source": "outcome_rm", "checkpoint_every": 0,
        "log_completions_every": 0, "baseline.enabled": False, "iterative.iterations": 1})
    guard = {"action": args.action, "window": args.window, "drop": args.drop}
    rows = read_jsonl(args.rl)
    out: dict[str, Any] = {"sft": args.sft, "rm": args.rm, "args": vars(args), "runs": {}}
    for name, p in (("no guard", base), (f"guard ({args.action})", base.updated({"reward.rm_guards.divergence": guard}))):
        out["runs"][name] = r = run(p, args.sft, args.rm, rows)
        first, last = r["steps"][0], r["steps"][-1]
        print(f"{name}: {len(r['steps'])} steps, RM reward {first['rm_reward']:.3f} -> {last['rm_reward']:.3f}, rule "
              f"accuracy {first['rule_accuracy']:.3f} -> {last['rule_accuracy']:.3f}, KL {last['kl']:.3f}; guard "
              f"events {[e['step'] for e in r['rm_divergence']]} ({r['wall_s']:.0f}s)", flush=True)
    out["note"] = "shared 2-core machine; the per-step values are the step rows' (stages/rl/metrics.py)"
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    plot(out, Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()

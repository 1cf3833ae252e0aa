"""Reward models compared on the same held-out questions: outcome AUC, within-question outcome AUC, step
AUC against the exact ``values`` labels and best-of-n reranking gain, for each ``--rm`` directory, on the held-out
examples of ``--heldout`` (a reward model directory's heldout.jsonl) minus every question any of the compared RMs
trained on (its examples.jsonl), so that no RM is scored on its own training questions.

    python -m benchmarks.rm_auc --rm main=/work/wt/baserun/data/models/reward_model \
        --rm rm=/tmp/rmp/proj/data/models/reward_model --heldout /tmp/rmp/proj/data/models/reward_model/heldout.jsonl

Scores with stages.rl.rm.evaluate_reward_model (the reward_model stage's own metrics); writes ``--out``
(benchmarks/results/reward_model_auc.json), with the machine and, per RM, its directory's ``train_run.json`` when
there is one (benchmarks/rm_kinds.sh writes the training's wall time, load and stage metrics there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

from stages.core.io import read_jsonl
from stages.core.modeling import load_tokenizer
from stages.core.stats import paired_bootstrap
from stages.rl.rm.metrics import evaluate_reward_model, within_question_auc
from stages.rl.rm.model import example_scores, load_examples, load_reward_model

ROOT = Path(__file__).resolve().parent.parent


def _key(ex: dict) -> str:
    return str(ex["id"]) + "\0" + ex["question"]


def per_question_within(examples: list[dict], last: list[float]) -> dict[str, float]:
    """Each question's within-question AUC (its samples' outcome scores ``last``), for the questions with a (right,
    wrong) pair."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(_key(ex), []).append(i)
    out = {}
    for k, idx in groups.items():
        v = within_question_auc([examples[i] for i in idx], [last[i] for i in idx],
                                [int(examples[i]["outcome"]) for i in idx])
        if not math.isnan(v):
            out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rm", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--heldout", required=True, help="heldout.jsonl of labelled examples")
    ap.add_argument("--best-of", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "reward_model_auc.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rms = dict(s.split("=", 1) for s in args.rm)
    held = read_jsonl(args.heldout)
    trained = {name: {_key(ex) for ex in load_examples(d)} for name, d in rms.items()}
    seen = set().union(*trained.values())
    keep = [ex for ex in held if _key(ex) not in seen]
    out: dict = {"heldout_file": args.heldout, "n_heldout_examples": len(held), "n_kept_examples": len(keep),
                 "n_kept_questions": len({_key(ex) for ex in keep}),
                 "excluded_questions_trained_on": {n: len({_key(ex) for ex in held} & t) for n, t in trained.items()},
                 "reward_models": {}}
    per_q: dict[str, dict[str, float]] = {}
    for name, d in rms.items():
        t0 = time.perf_counter()
        rm = load_reward_model(d)
        tok = load_tokenizer(d)
        with torch.no_grad():
            ev = evaluate_reward_model(rm, tok, keep, 32, best_of=args.best_of)
            per_q[name] = per_question_within(keep, [s[-1] for s in example_scores(rm, tok, keep, 32, share_prompts=True)])
        info = json.loads((Path(d) / "pipeline.json").read_text()) if (Path(d) / "pipeline.json").is_file() else {}
        out["reward_models"][name] = {"dir": os.fspath(d), "n_train_examples": len(load_examples(d)),
                                      "train_params": (info.get("params") or {}), **ev,
                                      "eval_s": round(time.perf_counter() - t0, 1)}
        if (Path(d) / "train_run.json").is_file():
            out["reward_models"][name]["train_run"] = json.loads((Path(d) / "train_run.json").read_text())
        b = ev.get("best_of_n") or {}
        print(f"{name:>8}: outcome AUC {ev['outcome_auc']}, within-question {ev['outcome_auc_within']}, step AUC "
              f"(exact labels) {ev['step_auc_values']}, best-of-{b.get('n')} {b.get('rm_last')} vs random "
              f"{b.get('random')} (gain {b.get('gain')})", flush=True)
    base = next(iter(rms))  # each RM's per-question within-question AUC against the first's, paired over questions
    qs = sorted(per_q[base])
    for name in rms:
        row = out["reward_models"][name]
        row["within_per_question_mean"] = round(sum(per_q[name][q] for q in qs) / len(qs), 4) if qs else None
        if name != base and qs:
            row[f"within_per_question_vs_{base}"] = paired_bootstrap([per_q[base][q] for q in qs],
                                                                   [per_q[name][q] for q in qs])
    out["load_average"] = os.getloadavg()
    from benchmarks._tiny import machine  # run as python -m benchmarks.rm_auc (or with the root on PYTHONPATH)

    out["machine"] = machine()
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

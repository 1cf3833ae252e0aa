"""Iterative RL (paper Algorithm 1, Figure 6) and process versus outcome supervision (paper 4.1.3, Figure 5)
on the tiny default, over seeds.

Per seed: train a reward model on labelled samples of the SFT policy (stages.rl.rm; held-out
outcome / step AUCs), then for each supervision (process_rm, outcome_rm) run ``--iterations`` iterations of
``--steps`` GRPO steps (stages.rl.iterative.run_iterations around the loop's stages.rl.loop.train: reference reset
each iteration, RM update with replay after each), and measure held-out greedy accuracy (CoT, generated
test problems) of the SFT model and of the policy after every iteration, plus the RM AUCs before / after
every update. GRPO settings not given on the command line come from params.yaml's grpo section.

    python benchmarks/iterative_rl.py --sft data/models/sft --seeds 0 1 2 --steps 10 --iterations 2
    python benchmarks/iterative_rl.py --steps 2 --seeds 0 --test 50      # a quick smoke run

Writes benchmarks/results/iterative_rl.json and prints a table. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "iterative_rl.json"


def greedy_accuracy(model: Any, tok: Any, problems: list[dict[str, Any]], max_new_tokens: int) -> float:
    """Share of ``problems`` whose greedy CoT answer equals the gold one (chat prompt, integer answers)."""
    from stages.core.answers import extract_answer, is_equivalent
    from stages.core.generation import SamplingParams, make_generator
    from stages.core.prompts import chat_prompt

    was = model.training
    model.eval()
    gen = make_generator("hf", model, tok, batch_size=64)
    outs = gen.generate([chat_prompt(p["question"], "cot") for p in problems],
                        SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    model.train(was)
    ok = sum(is_equivalent(extract_answer(o[0].text, "math"), p["answer"], percent_variants=False)
             for o, p in zip(outs, problems, strict=True))
    return ok / len(problems)


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", default=str(ROOT / "data/models/sft"), help="SFT model directory (policy + RM init)")
    ap.add_argument("--rl", default=str(ROOT / "data/corpus/problems/rl.jsonl"))
    ap.add_argument("--test-file", default=str(ROOT / "data/generated/problems/test.jsonl"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--supervision", nargs="+", default=["process_rm", "outcome_rm"])
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="GRPO steps per iteration (M)")
    ap.add_argument("--questions-per-step", type=int, default=None)
    ap.add_argument("--group-size", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--test", type=int, default=200, help="held-out test problems for greedy accuracy")
    ap.add_argument("--rm-questions", type=int, default=None, help="reward_model.questions (default: params.yaml)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    import torch

    from stages.core.io import read_jsonl
    from stages.core.modeling import load_model, load_tokenizer
    from stages.params import load_params
    from stages.rl.iterative import run_iterations
    from stages.rl.loop import close, setup
    from stages.rl.rm.labels import SampleConfig, collect_examples
    from stages.rl.rm.metrics import evaluate_reward_model
    from stages.rl.rm.model import init_reward_model, save_reward_model
    from stages.rl.rm.train import split_by_question, train_reward_model

    torch.set_num_threads(args.threads)
    P = load_params(args.params)
    rp = P.reward_model
    rows = read_jsonl(args.rl)
    test = read_jsonl(args.test_file)[: args.test]
    tok = load_tokenizer(args.sft)
    t0 = time.perf_counter()
    sft_acc = greedy_accuracy(load_model(args.sft), tok, test, P.grpo.rollout.max_new_tokens)
    print(f"SFT greedy accuracy on {len(test)} held-out problems: {sft_acc:.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    out: dict[str, Any] = {"sft": args.sft, "n_test": len(test), "sft_accuracy": sft_acc, "args": vars(args), "runs": []}
    tmp_root = Path(tempfile.mkdtemp(prefix="iterative_rl."))
    for seed in args.seeds:
        # reward model from labelled SFT samples
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        rm_rows = random.Random(seed).sample(rows, min(args.rm_questions or rp.questions, len(rows)))
        cfg = SampleConfig(samples_per_question=rp.samples_per_question, temperature=rp.temperature,
                           max_new_tokens=rp.max_new_tokens, labels=rp.labels, rollouts_per_step=rp.rollouts_per_step,
                           seed=seed, backend="hf")
        ex = collect_examples(load_model(args.sft), tok, rm_rows, cfg, origin="sft")
        tr, held = split_by_question(ex, rp.heldout_fraction, seed)
        rm = init_reward_model(args.sft)
        train_reward_model(rm, tok, tr, epochs=rp.epochs, lr=rp.lr, batch_size=rp.batch_size, seed=seed, train_on=rp.train_on)
        rm_metrics = evaluate_reward_model(rm, tok, held, rp.batch_size)
        rm_dir = tmp_root / f"rm_seed{seed}"
        save_reward_model(rm, tok, rm_dir, tr, held, {"seed": seed})
        rm_s = time.perf_counter() - t0
        print(f"seed {seed}: RM outcome AUC {rm_metrics['outcome_auc']} step AUC {rm_metrics['step_auc']} "
              f"({len(tr)} train / {len(held)} held-out examples, {rm_s:.0f}s)", flush=True)
        for sup in args.supervision:
            upd: dict[str, Any] = {"seed": seed, "reward.source": sup, "steps": args.steps, "checkpoint_every": 0,
                                   "log_completions_every": 0, "iterative.iterations": args.iterations,
                                   "baseline.enabled": False}
            for k, v in (("questions_per_step", args.questions_per_step), ("rollout.group_size", args.group_size),
                         ("rollout.max_new_tokens", args.max_new_tokens), ("optim.lr", args.lr)):
                if v is not None:
                    upd[k] = v
            p = P.grpo.updated(upd)
            model = load_model(args.sft)
            accs: list[float] = []

            def on_iteration(k: int, m: Any, _rm: Any, accs: list[float] = accs, tag: str = f"seed {seed} {sup}") -> None:
                accs.append(greedy_accuracy(m, tok, test, P.grpo.rollout.max_new_tokens))
                print(f"  {tag} iteration {k}: held-out greedy accuracy {accs[-1]:.3f}", flush=True)

            t1 = time.perf_counter()
            run, models, state = setup(p, model, tok, rows=rows, rm_dir=rm_dir)
            try:
                hist = run_iterations(run, models, state, ckpt_dir=None, out_dir=tmp_root / f"iters_{sup}_seed{seed}",
                                      on_iteration=on_iteration)
            finally:
                close(run, models, state)
            info = state.info
            out["runs"].append({
                "seed": seed, "supervision": sup, "rm_initial": rm_metrics, "accuracy_per_iteration": accs,
                "iterations": info["iterations"], "wall_s": round(time.perf_counter() - t1, 1),
                "train_accuracy_per_step": [r.get("accuracy") for r in hist],
            })
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")

    # table
    print(f"\nheld-out greedy accuracy (n={len(test)}), SFT = {sft_acc:.3f}; mean ± sd over seeds {args.seeds}")
    print(f"{'supervision':<12} " + " ".join(f"{'iter ' + str(k):>14}" for k in range(1, args.iterations + 1))
          + f" {'RM outcome AUC':>15} {'RM step AUC':>12}")
    summary: dict[str, Any] = {}
    for sup in args.supervision:
        runs = [r for r in out["runs"] if r["supervision"] == sup]
        cols = []
        for k in range(args.iterations):
            m, sd = _mean_sd([r["accuracy_per_iteration"][k] for r in runs if len(r["accuracy_per_iteration"]) > k])
            cols.append((m, sd))
        oa = _mean_sd([r["rm_initial"]["outcome_auc"] for r in runs])
        sa = _mean_sd([r["rm_initial"]["step_auc"] for r in runs])
        summary[sup] = {"accuracy_per_iteration_mean_sd": cols, "rm_outcome_auc_mean_sd": oa, "rm_step_auc_mean_sd": sa}
        print(f"{sup:<12} " + " ".join(f"{m:>8.3f}±{sd:<5.3f}" for m, sd in cols) + f" {oa[0]:>9.3f}±{oa[1]:<5.3f}"
              f" {sa[0]:>6.3f}±{sa[1]:<5.3f}")
    out["summary"] = summary
    out["note"] = "shared 2-core machine (several agents); timings noisy"
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

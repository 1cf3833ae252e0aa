"""GRPO's step against PPO's on the same work, interleaved in one process (so machine load hits both alike).

    python benchmarks/grpo_vs_ppo_step.py [--model data/models/sft] [--steps 5] [--threads 1]

Both start from the same model with params.yaml's grpo section (questions_per_step x group_size outputs, the rule
reward, beta in the loss for GRPO and in the reward for PPO, GRPO skipping all-equal-reward groups as the stage does,
PPO training every output), and run step s on the same questions with the same sampling seed, alternately
GRPO, PPO, GRPO, ... Reports wall and CPU seconds per phase (median over steps) and the memory of the trained
state measured from the tensors themselves: weights, gradients and AdamW moments of every trained model, plus the
frozen reference model. Writes benchmarks/results/grpo_vs_ppo_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import paths  # noqa: E402
from stages.core.generation import make_generator  # noqa: E402
from stages.core.modeling import load_model, load_tokenizer  # noqa: E402
from stages.rl.data import load_prompts  # noqa: E402
from stages.rl.loop import begin_iteration, run_step, setup  # noqa: E402
from stages.rl.types import LoopState, Models, RunSpec  # noqa: E402
from stages.schema.grpo import GrpoParams  # noqa: E402

PARTS = ("t_generation", "t_scoring", "t_logprobs", "t_update", "step_s", "cpu_step_s")
OUT = ROOT / "benchmarks" / "results" / "grpo_vs_ppo_step.json"


def tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes of a model's weights, gradients and optimizer state (tied weights counted once). The gradients are
    counted at the update's peak (one per trained weight, its dtype: the updater frees them after each step)."""
    params = list({id(p): p for p in model.parameters()}.values())
    out = {"weights": sum(p.numel() * p.element_size() for p in params),
           "gradients": sum(p.numel() * p.element_size() for p in params if p.requires_grad) if optimizer else 0,
           "optimizer": 0}
    if optimizer is not None:
        for st in optimizer.state.values():
            out["optimizer"] += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v) and v.dim())
    return out


def setup_algo(algo: str, p: GrpoParams, model_dir: str, rows: list[dict[str, Any]]
               ) -> tuple[RunSpec, Models, LoopState]:
    """The loop's run of ``algo`` (stages.rl.loop.setup, begin_iteration: reference, value model) on a fresh copy
    of the model."""
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    pa = p.updated({"algorithm": algo, "advantage.estimator": "gae" if algo == "ppo" else "grpo"})
    parts = setup(pa, model, tok, rows=rows, generator=make_generator("hf", model, tok))
    torch.manual_seed(p.seed)
    begin_iteration(*parts, 1, None)
    return parts


def memory(models: Models) -> dict[str, Any]:
    out = {"policy": tensor_bytes(models.policy, models.updater.optimizer)}
    if models.critic is not None:
        out["value_model"] = tensor_bytes(models.critic.model, models.critic.updater.optimizer)
    if models.reference is not None:
        out["reference"] = tensor_bytes(models.reference, None)
    out["total_mib"] = round(sum(sum(v.values()) for v in out.values() if isinstance(v, dict)) / 2**20, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / paths.SFT_MODEL))
    ap.add_argument("--prompts", default=str(ROOT / paths.RL_PROMPTS))
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p = GrpoParams.from_file(args.params).model_copy(update={"steps": args.steps})
    rows = load_prompts(args.prompts)
    load_before = os.getloadavg()
    ctxs = {a: setup_algo(a, p, args.model, rows) for a in ("grpo", "ppo")}
    hist: dict[str, list[dict[str, Any]]] = {a: [] for a in ctxs}
    for step in range(args.steps):
        for a, ctx in ctxs.items():
            m, _, _ = run_step(*ctx, step)
            hist[a].append(m)
            print(f"{a} step {step}: " + "  ".join(f"{k}={m[k]:.2f}" for k in PARTS) +
                  f"  trained outputs {m['n_train_outputs']}", flush=True)
    result: dict[str, Any] = {"model": args.model, "threads": args.threads, "steps": args.steps,
                              "questions_per_step": p.questions_per_step, "group_size": p.rollout.group_size,
                              "max_new_tokens": p.rollout.max_new_tokens, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "load_average_before": [round(x, 2) for x in load_before],
                              "load_average_after": [round(x, 2) for x in os.getloadavg()],
                              "note": "interleaved in one process; on a loaded machine the CPU seconds are the steadier"}
    for a, ctx in ctxs.items():
        h = hist[a]
        result[a] = {"median_s": {k: round(statistics.median(r[k] for r in h), 3) for k in PARTS},
                     "n_train_outputs_mean": statistics.mean(r["n_train_outputs"] for r in h),
                     "accuracy_mean": statistics.mean(r["accuracy"] for r in h), "memory": memory(ctx[1])}
    result["ppo_over_grpo_step_s"] = round(result["ppo"]["median_s"]["step_s"] / result["grpo"]["median_s"]["step_s"], 3)
    result["ppo_over_grpo_trained_state"] = round(result["ppo"]["memory"]["total_mib"] /
                                                  result["grpo"]["memory"]["total_mib"], 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'':8}" + "".join(f"{k:>14}" for k in PARTS) + f"{'state MiB':>12}")
    for a in ctxs:
        print(f"{a:8}" + "".join(f"{result[a]['median_s'][k]:>14.2f}" for k in PARTS) +
              f"{result[a]['memory']['total_mib']:>12.1f}")
    print(f"PPO / GRPO: {result['ppo_over_grpo_step_s']}x time per step, {result['ppo_over_grpo_trained_state']}x "
          f"model-state memory; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

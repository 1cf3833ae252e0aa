"""Time per GRPO step, split into generation / scoring / log-probs (pi_ref, pi_old) / update.

Usage: ``python benchmarks/grpo_step.py [--model data/models/sft] [--steps 3] [--threads 2]``
Writes benchmarks/results/grpo_step.json and prints a table: wall seconds (t_*) and CPU seconds of this
process, all threads (cpu_*); on a shared machine the CPU seconds are the steadier figure. Uses the grpo section of params.yaml
(questions_per_step x group_size, max_new_tokens, beta, ...), except that zero-std groups are kept so
that every step runs a full update. Without --model (or when data/models/sft is absent) it times a
randomly initialised model of the tiny default size (base_model section), whose outputs run to
max_new_tokens: an upper bound on generation time for the tiny default.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.base_model import init_model, train_tokenizer  # noqa: E402
from stages.core import paths  # noqa: E402
from stages.core.generation import make_generator  # noqa: E402
from stages.core.modeling import load_model, load_tokenizer, save_model  # noqa: E402
from stages.params import load_params  # noqa: E402
from stages.rl.loop import begin_iteration, run_step, setup  # noqa: E402

PARTS = ("t_generation", "t_scoring", "t_logprobs", "t_update", "step_s",
         "cpu_generation", "cpu_scoring", "cpu_logprobs", "cpu_update", "cpu_step_s")


def _prompts() -> list[dict[str, str]]:
    f = ROOT / paths.RL_PROMPTS
    if f.is_file():
        from stages.rl.data import load_prompts

        return load_prompts(f)
    from stages.data.problems import generate_splits

    rows = generate_splits(0, n_sft=1, n_rl=256, n_test=1, min_steps=1, max_steps=3, max_value=20)["rl"]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model directory (default: data/models/sft if present, else random)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    p = params.grpo.updated({"advantage.skip_zero_std_groups": False, "steps": args.steps})
    model_dir = args.model or (str(ROOT / paths.SFT_MODEL) if (ROOT / paths.SFT_MODEL / "config.json").is_file() else None)
    rows = _prompts()
    if model_dir:
        model, tok, kind = load_model(model_dir), load_tokenizer(model_dir), model_dir
    else:
        tok = train_tokenizer([r["question"] + "\n" + r["cot"] for r in rows], params.base_model.vocab_size)
        tmp = tempfile.mkdtemp()  # round-trip through a model directory, as the pipeline loads models
        save_model(init_model(params.base_model, tok), tok, tmp)
        model, tok = load_model(tmp), load_tokenizer(tmp)
        kind = "random init, base_model size"
    parts = setup(p, model, tok, rows=rows, generator=make_generator(p.rollout.backend, model, tok))
    begin_iteration(*parts, 1, None)  # the reference model (beta > 0), the reward source
    rows_out = []
    for step in range(args.steps):
        m, _, _ = run_step(*parts, step)
        rows_out.append(m)
        print(f"step {step}: " + "  ".join(f"{k}={m[k]:.2f}" for k in PARTS[:5]), flush=True)
    summary = {k: {"mean": round(statistics.mean(r[k] for r in rows_out), 3),
                   "median": round(statistics.median(r[k] for r in rows_out), 3)} for k in PARTS}
    result = {
        "model": kind, "n_params": sum(t.numel() for t in model.parameters()), "threads": args.threads,
        "questions_per_step": p.questions_per_step, "group_size": p.rollout.group_size, "max_new_tokens": p.rollout.max_new_tokens,
        "beta": p.kl.beta, "backend": p.rollout.backend, "steps": args.steps,
        "completion_len_mean": round(statistics.mean(r["completion_len"] for r in rows_out), 2),
        "seconds": summary, "machine": platform.processor() or platform.machine(),
        "note": "shared 2-core machine; timings noisy",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = ROOT / "benchmarks" / "results" / "grpo_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'part':<16}{'mean s':>10}{'median s':>10}")
    for k in PARTS:
        print(f"{k:<16}{summary[k]['mean']:>10.3f}{summary[k]['median']:>10.3f}")
    print(f"completion length {result['completion_len_mean']} tokens; wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

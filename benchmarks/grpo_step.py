"""Time per RL step by phase (generation / scoring / log-probs / update), one or more algorithms interleaved.

    python benchmarks/grpo_step.py [--model data/models/sft] [--steps 3] [--threads 2]
    python benchmarks/grpo_step.py --algorithms grpo ppo --as-stage --steps 5 --threads 1 --out FILE  # GRPO vs PPO

Each algorithm runs the RL driver (stages.rl.loop: setup, begin_iteration, run_step) on a fresh copy of the model with
params.yaml's grpo section (PPO with the ``gae`` estimator); step s of every algorithm samples the same questions
with the same seed, the algorithms alternating (GRPO, PPO, GRPO, ...) so that machine load hits all alike.
Zero-std groups are kept, so every step runs a full update (``--as-stage``: skipped as the stage does).
Reports wall (t_*) and CPU (cpu_*) seconds per phase, mean and median over steps (on a shared machine the CPU
seconds are the steadier figure), and the memory of the trained state measured from the tensors: weights,
gradients and AdamW moments of every trained model, plus the frozen reference. Without --model (or when
data/models/sft is absent) the model is the tiny default size with random weights, whose outputs run to
max_new_tokens: an upper bound on generation time. Writes benchmarks/results/grpo_step.json (``--out``: another
file; grpo_vs_ppo_step.json holds an earlier GRPO-vs-PPO run). scaling.py times its grid with :func:`time_steps`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import paths  # noqa: E402
from stages.core.generation import make_generator  # noqa: E402
from stages.core.modeling import load_model, load_tokenizer, save_model  # noqa: E402
from stages.params import load_params  # noqa: E402
from stages.rl.loop import begin_iteration, run_step, setup  # noqa: E402

PARTS = ("t_generation", "t_scoring", "t_logprobs", "t_update", "step_s",
         "cpu_generation", "cpu_scoring", "cpu_logprobs", "cpu_update", "cpu_step_s")


def prompts() -> list[dict[str, Any]]:
    f = ROOT / paths.RL_PROMPTS
    if f.is_file():
        from stages.rl.data import load_prompts

        return load_prompts(f)
    from stages.data.problems import generate_splits

    return generate_splits(0, n_sft=1, n_rl=256, n_test=1, min_steps=1, max_steps=3, max_value=20)["rl"]


def start(algo: str, p: Any, model_dir: str, rows: list[dict[str, Any]], **generator_kw: Any) -> tuple[Any, ...]:
    """The driver's run of ``algo`` on a fresh copy of the model in ``model_dir``, begun (reference, value model)."""
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    pa = p.updated({"algorithm": algo, **({"advantage.estimator": "gae"} if algo == "ppo" else {})})
    parts = setup(pa, model, tok, rows=rows, generator=make_generator(pa.rollout.backend, model, tok, **generator_kw))
    torch.manual_seed(p.seed)
    begin_iteration(*parts, 1, None)
    return parts


def time_steps(runs: dict[str, tuple[Any, ...]], steps: int, step0: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``steps`` steps of every run, interleaved; each step's metrics row plus ``wall_s`` and generated ``tokens``."""
    hist: dict[str, list[dict[str, Any]]] = {a: [] for a in runs}
    for step in range(step0, step0 + steps):
        for a, parts in runs.items():
            t0 = time.perf_counter()
            m, ro, _ = run_step(*parts, step)
            m["wall_s"] = time.perf_counter() - t0
            m["tokens"] = int(ro.completion_mask.sum()) if ro is not None else 0
            hist[a].append(m)
    return hist


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


def memory(models: Any) -> dict[str, Any]:
    out = {"policy": tensor_bytes(models.policy, models.updater.optimizer)}
    if models.critic is not None:
        out["value_model"] = tensor_bytes(models.critic.model, models.critic.updater.optimizer)
    if models.reference is not None:
        out["reference"] = tensor_bytes(models.reference, None)
    out["total_mib"] = round(sum(sum(v.values()) for v in out.values() if isinstance(v, dict)) / 2**20, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF model directory (default: data/models/sft if present, else random)")
    ap.add_argument("--algorithms", nargs="+", default=["grpo"], help="interleaved, e.g. grpo ppo")
    ap.add_argument("--as-stage", action="store_true", help="skip zero-std groups as params.yaml says")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grpo_step.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    p = params.grpo.updated({"steps": args.steps, **({} if args.as_stage else {"advantage.skip_zero_std_groups": False})})
    rows = prompts()
    model_dir = args.model or (str(ROOT / paths.SFT_MODEL) if (ROOT / paths.SFT_MODEL / "config.json").is_file() else None)
    kind = model_dir or "random init, base_model size"
    if model_dir is None:
        from stages.base_model import init_model, train_tokenizer

        tok = train_tokenizer([r["question"] + "\n" + r["cot"] for r in rows], params.base_model.vocab_size)
        model_dir = tempfile.mkdtemp()  # round-trip through a model directory, as the pipeline loads models
        save_model(init_model(params.base_model, tok), tok, model_dir)
    load_before = os.getloadavg()
    runs = {a: start(a, p, model_dir, rows) for a in args.algorithms}
    hist = time_steps(runs, args.steps)
    result: dict[str, Any] = {
        "model": kind, "threads": args.threads, "steps": args.steps, "questions_per_step": p.questions_per_step,
        "group_size": p.rollout.group_size, "max_new_tokens": p.rollout.max_new_tokens, "beta": p.kl.beta,
        "backend": p.rollout.backend, "skip_zero_std_groups": p.advantage.skip_zero_std_groups,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    for a, h in hist.items():
        result[a] = {"seconds": {k: {"mean": round(statistics.mean(r[k] for r in h), 3),
                                     "median": round(statistics.median(r[k] for r in h), 3)} for k in PARTS},
                     "completion_len_mean": round(statistics.mean(r["completion_len"] for r in h), 2),
                     "n_train_outputs_mean": statistics.mean(r["n_train_outputs"] for r in h),
                     "accuracy_mean": statistics.mean(r["accuracy"] for r in h), "memory": memory(runs[a][1])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'median s':10}" + "".join(f"{k:>14}" for k in PARTS[:5]) + f"{'state MiB':>12}")
    for a in hist:
        print(f"{a:10}" + "".join(f"{result[a]['seconds'][k]['median']:>14.2f}" for k in PARTS[:5]) +
              f"{result[a]['memory']['total_mib']:>12.1f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

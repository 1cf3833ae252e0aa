"""GPU check: a randomly initialised ~0.5B Qwen2-shaped model (Qwen2.5-0.5B's architecture, built from a config:
no download) through GRPO steps and SFT steps on one GPU, within ``--budget-s`` (default 4 minutes, model build
included, so a rerun fits a 15-minute GPU slot). A random model rarely emits EOS, so its outputs run to the length
limit: this is a throughput and memory check, not a learning check.

    PYTHONPATH=. python benchmarks/gpu_check.py                      # on the GPU machine: results/gpu_check.json
    PYTHONPATH=. python benchmarks/gpu_check.py --allow-cpu --size tiny --grpo-steps 2 --sft-steps 2   # code path

What runs is the stages' own code: the RL loop (``stages.rl.loop.fit``) with the hf backend (vLLM and DeepSpeed are not on
the GPU machine), plain PyTorch with bf16 autocast (``grpo.compute.precision: bf16``: fp32 weights and AdamW, bf16
matmuls; hf rollouts from a bf16 copy of the policy), gradient checkpointing, the chunked log-probs, a reference
model (beta 0.04) kept in CPU memory while idle; then SFT steps of the training loop's forward
(``stages.train.loop.forward_nll``) through the one update path (``stages.train.update.Updater``) on packed random
tokens. It prints and writes rollout tokens/s, training tokens/s (GRPO update and SFT), model FLOP utilisation
against the GPU's dense bf16 peak (``--peak-tflops``, else looked up from the device name), and the peak GPU memory
(``torch.cuda.max_memory_allocated``) of each phase next to the memory planner's estimate (stages/plan.py).

It imports only torch, transformers, tokenizers, safetensors, numpy, pydantic, pyyaml, tqdm and what they need,
plus math-verify for the answer check: benchmarks/gpu_wheels.txt lists the wheels to install with ``pip install
--no-deps --target`` next to the GPU machine's own torch, docs/real-mode.md the command. Without a CUDA GPU it refuses in one line (exit 2)
unless ``--allow-cpu``.
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

PEAK_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0,
               "H100": 756.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}
"""Dense bf16 tensor-core peaks (TFLOP/s, NVIDIA datasheets) by device-name substring, most specific first."""

SIZES = {
    # Qwen2.5-0.5B: hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864, vocabulary 151,936, tied
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=128, vocab_size=151936),
}


def peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of a device by name, or None when unknown."""
    for key, v in PEAK_TFLOPS.items():
        if key.lower() in name.lower():
            return v
    return None


def build(size: str, device: Any, seed: int) -> tuple[Any, Any, list[dict[str, Any]]]:
    """(model, tokenizer, RL prompt rows): a random Qwen2 of ``size`` on ``device`` in float32 (the weights the
    plain update trains), a byte-level BPE tokenizer trained on generated problems (its ids are a prefix of the
    model's 151,936; generated ids beyond it decode to nothing), and those problems."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmarks._tiny import problem_rows
    from stages.base_model import train_tokenizer

    rows = problem_rows(256, seed)
    tok = train_tokenizer([r["question"] + "\n" + r.get("cot", "") for r in rows], 4000)
    cfg = Qwen2Config(**SIZES[size], max_position_embeddings=4096, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok, [{"id": f"q{i}", "question": r["question"], "answer": r["answer"]} for i, r in enumerate(rows)]


def grpo_params(args: argparse.Namespace, on_gpu: bool) -> Any:
    """params.yaml's grpo section with the check's sizes: GRPO, rule reward, hf backend, bf16 autocast,
    checkpointing, plain PyTorch, no side outputs."""
    from stages.schema.base import read_params_file, validate_section
    from stages.schema.grpo import GrpoParams

    base = validate_section(GrpoParams, read_params_file(args.params), args.params)
    return base.updated({
        "algorithm": "grpo", "advantage.estimator": "grpo", "loss.policy": "clipped",
        "steps": args.grpo_steps, "questions_per_step": args.questions, "rollout.group_size": args.group_size,
        "rollout.max_new_tokens": args.max_new_tokens, "rollout.backend": "hf",
        "optim.micro_batch_size": args.grpo_micro_batch, "optim.mu": 1, "optim.minibatches": 1, "kl.beta": 0.04,
        "optim.lr": 1e-6, "advantage.skip_zero_std_groups": False, "checkpoint_every": 0, "log_completions_every": 0,
        "compute": {"offload_idle_models": True, "share_prompt_prefix": True, "precision": "bf16" if on_gpu else "fp32",
                    "gradient_checkpointing": True, "logprob_chunk_tokens": args.chunk, "attn_implementation": "sdpa",
                    "num_threads": 0 if on_gpu else 1},
        "heldout.every": 0, "baseline.enabled": False, "iterative.iterations": 1, "deepspeed.enabled": False,
        "reward": {"source": "rule", "accuracy_weight": 1.0, "format_weight": 0.0, "custom": [], "custom_weights": [],
                   "rm_guards": base.reward.rm_guards.model_dump()},
    })


class Budget(Exception):
    """Raised from the step callback: the next step would not finish within the phase's share of the budget."""


def mem_reset(on_gpu: bool) -> None:
    import torch

    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def mem_peak(on_gpu: bool) -> float | None:
    import torch

    if not on_gpu:
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def run_grpo(model: Any, tok: Any, rows: list[dict[str, Any]], p: Any, deadline: float, on_gpu: bool
             ) -> list[dict[str, Any]]:
    """GRPO steps of the RL loop (``stages.rl.loop.fit``) until ``p.steps`` or the deadline (a step is not started
    when the previous one says it would not end in time)."""
    from stages.rl.loop import fit

    steps: list[dict[str, Any]] = []

    def on_step(row: dict[str, Any]) -> None:
        steps.append(row)
        if time.perf_counter() + row["step_s"] > deadline:
            raise Budget

    try:
        fit(p, model, tok, rows=rows, on_step=on_step)
    except Budget:
        pass
    return steps


def run_sft(model: Any, args: argparse.Namespace, deadline: float, on_gpu: bool) -> list[dict[str, float]]:
    """SFT steps: ``stages.train.loop.forward_nll`` (packed random tokens, bf16 autocast on a GPU, chunked loss)
    through an :class:`stages.train.update.Updater` with the loop's AdamW; gradient checkpointing on."""
    import torch

    from stages.core.modeling import enable_checkpointing
    from stages.schema.base import read_params_file, validate_section
    from stages.schema.sft import SftParams
    from stages.train.loop import forward_nll, make_optimizer
    from stages.train.update import Updater

    t = validate_section(SftParams, read_params_file(args.params), args.params).train
    enable_checkpointing(model, True)
    model.train()
    upd = Updater(model, optimizer=make_optimizer(model, t), max_grad_norm=1.0)
    dev = upd.device
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    out: list[dict[str, float]] = []
    for step in range(args.sft_steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, V, (args.sft_micro_batch, args.seq), generator=g)
        batch = {"input_ids": ids, "labels": ids.clone(),
                 "position_ids": torch.arange(args.seq).expand(args.sft_micro_batch, -1).clone()}
        upd.zero_grad()
        nll, n = forward_nll(upd.forward_model, batch, on_gpu, dev, args.chunk)
        upd.backward(nll / n, last=True)
        gn, _ = upd.step(bad=False)
        if on_gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out.append({"step": step, "step_s": dt, "loss": float(nll.detach() / n), "grad_norm": gn,
                    "tokens": args.sft_micro_batch * args.seq})
        if time.perf_counter() + dt > deadline:
            break
    return out


def estimates(model: Any, args: argparse.Namespace, p: Any, prompt_len: int) -> dict[str, float]:
    """The planner's peak (GiB) for the GRPO phase and the SFT phase of this run."""
    from stages import plan

    m = plan.ModelShape.from_config(model.config.to_dict())
    gib = plan.GIB
    seq = prompt_len + args.max_new_tokens
    upd = plan.train_memory(m, plan.TrainSetup(micro_batch=args.grpo_micro_batch, seq=seq, autocast=True,
                                               checkpointing=True, chunk=args.chunk, masked=True, entropy=True))
    P = m.n_params()
    rows = args.questions * args.group_size
    gen_copy = 2 * P  # the hf generator's bf16 copy of the fp32 policy
    static = upd.parts["weights"] + upd.parts["optimizer_states"]
    generation = static + gen_copy + plan.hf_generation_memory(m, rows, seq, wb=2)
    ref_pass = static + gen_copy + plan.inference_memory(m, args.grpo_micro_batch * seq, wb=4, chunk=args.chunk)
    grpo = max(upd.peak + gen_copy, generation, ref_pass)
    sft = plan.train_memory(m, plan.TrainSetup(micro_batch=args.sft_micro_batch, seq=args.seq, autocast=True,
                                               checkpointing=True, chunk=args.chunk, masked=False)).peak
    return {"grpo": round(grpo / gib, 3), "sft": round(sft / gib, 3), "grpo_update": round(upd.peak / gib, 3),
            "grpo_generation": round(generation / gib, 3), "grpo_reference_pass": round(ref_pass / gib, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="0.5b", choices=sorted(SIZES))
    ap.add_argument("--budget-s", type=float, default=240.0, help="the whole run, model build included")
    ap.add_argument("--grpo-steps", type=int, default=4)
    ap.add_argument("--questions", type=int, default=8, help="questions per GRPO step")
    ap.add_argument("--group-size", type=int, default=8, help="G, outputs per question")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--grpo-micro-batch", type=int, default=16)
    ap.add_argument("--sft-steps", type=int, default=20)
    ap.add_argument("--sft-micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024, help="SFT tokens per packed sequence")
    ap.add_argument("--chunk", type=int, default=256, help="logprob_chunk_tokens")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU (the code path only; use --size tiny)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.allow_cpu:
        print("gpu_check: no CUDA GPU on this machine; run it on a GPU node (or pass --allow-cpu --size tiny to "
              "exercise the code path)", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if not on_gpu:
        torch.set_num_threads(1)
    name = torch.cuda.get_device_name(0) if on_gpu else (platform.processor() or "cpu")
    peak = args.peak_tflops or (peak_tflops(name) if on_gpu else None)
    model, tok, rows = build(args.size, device, args.seed)
    n_params = sum(q.numel() for q in model.parameters())
    t_build = time.perf_counter() - t_start
    p = grpo_params(args, on_gpu)
    from stages.core.prompts import chat_prompt

    prompt_len = max(len(tok(chat_prompt(r["question"], "cot"))["input_ids"]) for r in rows)
    est = estimates(model, args, p, prompt_len)

    mem_reset(on_gpu)
    t0 = time.perf_counter()
    grpo_deadline = t_start + 0.6 * args.budget_s
    steps = run_grpo(model, tok, rows, p, grpo_deadline, on_gpu)
    t_grpo = time.perf_counter() - t0
    grpo_mem = mem_peak(on_gpu)

    mem_reset(on_gpu)
    sft = run_sft(model, args, t_start + 0.95 * args.budget_s, on_gpu)
    sft_mem = mem_peak(on_gpu)

    rollout = [{"step": r["step"], "step_s": round(r["step_s"], 3), "t_generation": round(r["t_generation"], 3),
                "t_logprobs": round(r["t_logprobs"], 3), "t_update": round(r["t_update"], 3),
                "rollout_tokens": int(round(r["completion_len"] * args.questions * args.group_size)),
                "reward_mean": r["reward_mean"], "kl": r["kl"], "grad_norm": r["grad_norm"]} for r in steps]
    timed = rollout[1:] or rollout  # the first step includes warm-up
    gen_tok = sum(x["rollout_tokens"] for x in timed)
    gen_s = sum(x["t_generation"] for x in timed)
    upd_tok = sum(x["rollout_tokens"] + prompt_len * args.questions * args.group_size for x in timed)
    upd_s = sum(x["t_update"] for x in timed)
    sft_timed = sft[1:] or sft
    sft_tok = sum(x["tokens"] for x in sft_timed)
    sft_s = sum(x["step_s"] for x in sft_timed)
    L, h = model.config.num_hidden_layers, model.config.hidden_size

    def mfu(tokens: float, seconds: float, per_token: float) -> float | None:
        return round(tokens * per_token / seconds / (peak * 1e12), 4) if peak and seconds > 0 else None

    rollout_tps = gen_tok / gen_s if gen_s else None
    total = time.perf_counter() - t_start
    result = {
        "device": name, "peak_bf16_tflops": peak, "torch": torch.__version__, "size": args.size,
        "n_params": n_params, "budget_s": args.budget_s, "total_s": round(total, 1), "build_s": round(t_build, 1),
        "within_budget": total <= args.budget_s,
        "grpo": {"steps_run": len(rollout), "questions": args.questions, "group_size": args.group_size,
                 "max_new_tokens": args.max_new_tokens, "micro_batch": args.grpo_micro_batch,
                 "wall_s": round(t_grpo, 1),
                 "rollout_tokens_per_s": round(rollout_tps, 1) if rollout_tps else None,
                 "rollout_mfu": mfu(gen_tok, gen_s, 2 * n_params),
                 "update_tokens_per_s": round(upd_tok / upd_s, 1) if upd_s else None,
                 "update_mfu": mfu(upd_tok, upd_s, 6 * n_params + 6 * L * h * (prompt_len + args.max_new_tokens)),
                 "peak_memory_gib": round(grpo_mem, 3) if grpo_mem is not None else None,
                 "planner_estimate_gib": est["grpo"], "per_step": rollout},
        "sft": {"steps_run": len(sft), "micro_batch": args.sft_micro_batch, "seq": args.seq,
                "tokens_per_s": round(sft_tok / sft_s, 1) if sft_s else None,
                "mfu": mfu(sft_tok, sft_s, 6 * n_params + 6 * L * h * args.seq),
                "peak_memory_gib": round(sft_mem, 3) if sft_mem is not None else None,
                "planner_estimate_gib": est["sft"],
                "loss_first": round(sft[0]["loss"], 4) if sft else None,
                "loss_last": round(sft[-1]["loss"], 4) if sft else None},
        "planner": est, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "settings": "hf backend, plain PyTorch, bf16 autocast (fp32 weights and AdamW), gradient checkpointing, "
                    f"chunked log-probs ({args.chunk} positions), reference model offloaded while idle",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    g, s = result["grpo"], result["sft"]
    print(f"{name}: {n_params / 1e6:.0f}M parameters, built in {t_build:.1f}s")
    print(f"GRPO  {g['steps_run']} steps: rollout {g['rollout_tokens_per_s']} tokens/s (MFU {g['rollout_mfu']}), "
          f"update {g['update_tokens_per_s']} tokens/s (MFU {g['update_mfu']}); peak memory {g['peak_memory_gib']} "
          f"GiB, planner {g['planner_estimate_gib']} GiB")
    print(f"SFT   {s['steps_run']} steps: {s['tokens_per_s']} tokens/s (MFU {s['mfu']}); peak memory "
          f"{s['peak_memory_gib']} GiB, planner {s['planner_estimate_gib']} GiB")
    print(f"total {total:.1f}s of a {args.budget_s:.0f}s budget -> {out}")
    if total > args.budget_s:
        print(f"gpu_check: over the budget ({total:.1f}s > {args.budget_s:.0f}s); lower --grpo-steps / --sft-steps",
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

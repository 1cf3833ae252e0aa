"""Training throughput and model FLOP utilisation (MFU) of the shared training loop on this machine.

Measures (1) this machine's matmul peak in fp32 and in bf16 (square GEMMs, the best of several sizes), and
(2) one training step of the tiny default model (params.yaml ``base_model`` sizes, random weights; shapes of
``pretrain.train``: micro_batch_size x seq_len) in fp32 and with bf16 autocast, split into data (packing
text into sequences), forward, backward and optimizer (clip + AdamW) time. MFU = model FLOPs per second /
the measured peak of the same precision, with model FLOPs per token = 6 * (matmul parameters, lm_head
included) + 12 * layers * hidden * seq_len (attention scores and values, forward + backward, PaLM's count).

    python benchmarks/training.py                  # JSON to benchmarks/results/training.json
    python benchmarks/training.py --steps 3 --threads 1

Timings on a shared machine are noisy: the JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "training.json"


def matmul_peak(dtype: Any, sizes: tuple[int, ...] = (512, 1024, 2048), reps: int = 5) -> dict[str, float]:
    """Best FLOP/s of ``a @ b`` over square sizes (warm-up excluded)."""
    import torch

    best = {"tflops": 0.0, "n": 0}
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            a @ b
            ts.append(time.perf_counter() - t)
        tf = 2 * n**3 / min(ts) / 1e12
        if tf > best["tflops"]:
            best = {"tflops": tf, "n": n}
    return best


def model_flops_per_token(cfg: Any, seq_len: int) -> tuple[float, int]:
    """(training FLOPs per token, matmul parameter count)."""
    d, ff, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * ff  # q, o; k, v; gate, up, down
    n_matmul = L * per_layer + d * V
    return 6 * n_matmul + 12 * L * d * seq_len, n_matmul


def bench_step(model: Any, data: Any, p: Any, bf16: bool, steps: int) -> dict[str, float]:
    """Median seconds of the phases of one training step, as the loop runs it."""
    import torch

    from stages.train.loop import forward_nll, make_optimizer

    opt = make_optimizer(model, p)
    params = [q for q in model.parameters() if q.requires_grad]
    dev = torch.device("cpu")
    rows = p.micro_batch_size
    phases: dict[str, list[float]] = {"data": [], "forward": [], "backward": [], "optimizer": []}
    for i in range(steps + 1):
        t0 = time.perf_counter()
        batch = data.next_batch(rows)
        t1 = time.perf_counter()
        nll, n = forward_nll(model, batch, bf16, dev)
        loss = nll / n
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i:  # first step is warm-up
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                phases[k].append(v)
    return {k: statistics.median(v) for k, v in phases.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per precision (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.core.modeling import load_tokenizer
    from stages.params import load_params
    from stages.train.data import PackedMixture

    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params(ROOT / "params.yaml")
    bm, p = params.base_model, params.pretrain.train
    load0 = os.getloadavg()
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}

    base = ROOT / "data" / "models" / "base"
    text = ROOT / "data" / "generated" / "seed.jsonl"
    if not (base / "tokenizer.json").is_file() or not text.is_file():
        sys.exit("needs data/models/base and data/generated/seed.jsonl: run `python -m flows.data && python -m flows.base_model`")
    tok = load_tokenizer(base)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=bm.hidden_size, intermediate_size=bm.intermediate_size,
                      num_hidden_layers=bm.num_layers, num_attention_heads=bm.num_heads, num_key_value_heads=bm.num_kv_heads,
                      max_position_embeddings=bm.max_position_embeddings, tie_word_embeddings=True)
    flops_tok, n_matmul = model_flops_per_token(cfg, p.seq_len)
    rows: list[dict[str, Any]] = []
    for prec in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).train()
        data = PackedMixture([(text, 1.0)], tok, p.seq_len, 0)
        ph = bench_step(model, data, p, prec == "bf16", args.steps)
        step_s = sum(ph.values())
        tok_s = p.micro_batch_size * p.seq_len / step_s
        achieved = tok_s * flops_tok / 1e12
        rows.append({
            "precision": prec, "tokens_per_s": round(tok_s, 1), "step_s": round(step_s, 4),
            **{f"{k}_s": round(v, 4) for k, v in ph.items()},
            **{f"{k}_share": round(v / step_s, 3) for k, v in ph.items()},
            "model_tflops": round(achieved, 4),
            "mfu_vs_own_peak": round(achieved / peaks[prec]["tflops"], 4),
            "mfu_vs_bf16_peak": round(achieved / peaks["bf16"]["tflops"], 4),
        })
    out = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "amx_tile": bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()),
                    "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                    "torch": torch.__version__},
        "matmul_peak_tflops": {k: round(v["tflops"], 4) for k, v in peaks.items()},
        "matmul_peak_size": {k: v["n"] for k, v in peaks.items()},
        "model": {"params": sum(x.numel() for x in LlamaForCausalLM(cfg).parameters()), "matmul_params": n_matmul,
                  "flops_per_token": flops_tok, "micro_batch_size": p.micro_batch_size, "seq_len": p.seq_len},
        "steps_timed": args.steps,
        "rows": rows,
        "note": "shared 2-core machine: other processes compete for the cores; compare rows measured together",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"matmul peak: fp32 {out['matmul_peak_tflops']['fp32']:.3f} TFLOP/s, bf16 {out['matmul_peak_tflops']['bf16']:.3f} TFLOP/s "
          f"({out['machine']['threads']} threads, load {out['machine']['loadavg_before'][0]})")
    print(f"{'precision':9} {'tok/s':>8} {'step s':>7} {'data':>6} {'fwd':>6} {'bwd':>6} {'opt':>6} {'TFLOP/s':>8} {'MFU':>6}")
    for r in rows:
        print(f"{r['precision']:9} {r['tokens_per_s']:8.0f} {r['step_s']:7.3f} {r['data_share']:6.1%} {r['forward_share']:6.1%} "
              f"{r['backward_share']:6.1%} {r['optimizer_share']:6.1%} {r['model_tflops']:8.4f} {r['mfu_vs_own_peak']:6.1%}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()

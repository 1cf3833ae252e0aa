"""Generation throughput: the hf backend, plain ``model.generate`` and the vllm backend on the tiny model.

The model is the tiny base model as params.yaml's ``base_model`` section sizes it (random weights: throughput
does not depend on them), with a tokenizer trained on synthetic problems; the prompts are chat prompts of
synthetic problems. Every engine gets the same prompts and the same sampling settings, one timed run each
(after a short untimed warm-up). Random weights rarely produce EOS, so nearly every sequence runs to
``max_new_tokens``: the token counts of the engines are comparable; they are reported, not assumed.

vllm runs in the vllm environment (.venv-vllm, see docs/generation.md): when ``vllm`` cannot be
imported here, the script re-runs itself there (``--only vllm``) on the same saved model and merges the row.

    python benchmarks/generation.py                  # all engines; JSON to benchmarks/results/generation.json
    python benchmarks/generation.py --prompts 16 --max-new-tokens 64 --n 2   # a quicker run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "generation.json"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def build_model(out_dir: Path, n_texts: int) -> None:
    """Save the tiny base model (params.yaml sizes, random weights) and its tokenizer to ``out_dir``.

    The tokenizer learns from the data stage's texts when data/generated exists (as the base_model stage
    does, reaching the configured vocabulary size), else from synthetic problems only (a smaller vocabulary).
    """
    from stages.base_model import corpus_texts, init_model, train_tokenizer
    from stages.data.problems import sample_problem
    from stages.params import BaseModelParams, resolve

    raw = resolve(ROOT / "params.yaml")["base_model"]
    p = BaseModelParams(**raw)
    generated = ROOT / "data" / "generated"
    if (generated / "problems" / "sft.jsonl").is_file():
        texts = list(corpus_texts(generated, n_texts))
    else:
        rng = random.Random(0)
        rows = [sample_problem(rng, n_steps=1 + i % 3, max_value=20) for i in range(n_texts)]
        texts = ["\n".join([r["question"], r["cot"], r["pot"], r["tir"]]) for r in rows]
    tok = train_tokenizer(texts, p.vocab_size)
    model = init_model(p, tok)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def make_prompts(k: int) -> list[str]:
    from stages.core.prompts import chat_prompt
    from stages.data.problems import sample_problem

    rng = random.Random(123)
    return [chat_prompt(sample_problem(rng, n_steps=1 + i % 3, max_value=20)["question"]) for i in range(k)]


def count(outs: list[list[Any]]) -> int:
    return sum(len(c.token_ids) for row in outs for c in row)


def run_hf(model_dir: Path, prompts: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from stages.core.generation import HFGenerator, SamplingParams
    from stages.core.modeling import load_model, load_tokenizer

    tok = load_tokenizer(model_dir)
    model = load_model(model_dir).eval()
    sp = SamplingParams(temperature=1.0, n=args.n, max_new_tokens=args.max_new_tokens, seed=0)
    rows = []
    for name, kw in [("hf", {"batch_size": args.batch_size}),
                     ("hf bf16", {"batch_size": args.batch_size, "dtype": "bfloat16"})]:
        gen = HFGenerator(model, tok, **kw)
        gen.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        outs = gen.generate(prompts, sp)
        wall = time.perf_counter() - t0
        rows.append({"engine": name, "tokens": count(outs), "wall_s": round(wall, 2),
                     "tokens_per_s": round(count(outs) / wall, 1), "batch_size": args.batch_size,
                     "dtype": str(gen.model.dtype).removeprefix("torch.")})

    # plain transformers: model.generate on left-padded batches of the same rows (prompt x n)
    batch_rows = [p for p in prompts for _ in range(args.n)]
    model.generate(**tok(prompts[:2], return_tensors="pt", padding=True), max_new_tokens=4, do_sample=True,
                   pad_token_id=tok.pad_token_id)  # warm-up
    torch.manual_seed(0)
    t0 = time.perf_counter()
    n_tokens = 0
    for start in range(0, len(batch_rows), args.batch_size):
        enc = tok(batch_rows[start:start + args.batch_size], return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=True, temperature=1.0,
                                 top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        # count tokens up to and including the first EOS, like the generators do
        for seq in new.tolist():
            n_tokens += next((i + 1 for i, t in enumerate(seq) if t == tok.eos_token_id), len(seq))
    wall = time.perf_counter() - t0
    rows.append({"engine": "transformers model.generate", "tokens": n_tokens, "wall_s": round(wall, 2),
                 "tokens_per_s": round(n_tokens / wall, 1), "batch_size": args.batch_size, "dtype": "float32"})
    return rows


def run_vllm(model_dir: Path, prompts: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    from stages.core.generation import SamplingParams, make_generator

    t0 = time.perf_counter()
    gen = make_generator("vllm", str(model_dir), None)
    startup = time.perf_counter() - t0
    sp = SamplingParams(temperature=1.0, n=args.n, max_new_tokens=args.max_new_tokens, seed=0)
    gen.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=4))  # warm-up
    t0 = time.perf_counter()
    outs = gen.generate(prompts, sp)
    wall = time.perf_counter() - t0
    import vllm

    gen.close()
    return [{"engine": f"vllm {vllm.__version__}", "tokens": count(outs), "wall_s": round(wall, 2),
             "tokens_per_s": round(count(outs) / wall, 1), "batch_size": "engine-scheduled",
             "dtype": "float32", "startup_s": round(startup, 1)}]


def vllm_here() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (GRPO-like rollouts)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=128, help="hf / model.generate rows per forward")
    ap.add_argument("--tokenizer-texts", type=int, default=6000)
    ap.add_argument("--only", choices=["hf", "vllm"], default=None)
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse a saved model (internal)")
    ap.add_argument("--json-out", type=Path, default=RESULTS)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or Path(tmp) / "tiny"
        if args.model_dir is None:
            build_model(model_dir, args.tokenizer_texts)
        prompts = make_prompts(args.prompts)
        rows: list[dict[str, Any]] = []
        vllm_note = None
        if args.only in (None, "hf"):
            rows += run_hf(model_dir, prompts, args)
        if args.only in (None, "vllm"):
            if vllm_here():
                rows += run_vllm(model_dir, prompts, args)
            elif VLLM_PYTHON.exists():
                sub_json = Path(tmp) / "vllm.json"
                cmd = [str(VLLM_PYTHON), __file__, "--only", "vllm", "--model-dir", str(model_dir),
                       "--json-out", str(sub_json), "--prompts", str(args.prompts), "--n", str(args.n),
                       "--max-new-tokens", str(args.max_new_tokens)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode == 0:
                    rows += json.loads(sub_json.read_text())["results"]
                else:
                    vllm_note = "vllm run failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
            else:
                vllm_note = f"vllm not importable here and {VLLM_PYTHON} missing (see docs/generation.md)"

        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model_dir)
        n_params = None
        if args.only != "vllm":
            from stages.core.modeling import load_model

            n_params = sum(t.numel() for t in load_model(model_dir).parameters())
    result = {
        "benchmark": "generation",
        "model": {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size,
                  "n_params": n_params},
        "workload": {"prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
                     "temperature": 1.0},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "note": "shared machine: other jobs were running, timings are noisy"},
        "results": rows,
    }
    if vllm_note:
        result["vllm_note"] = vllm_note
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    if args.only == "vllm":
        return
    print(f"{'engine':32} {'tokens':>8} {'wall_s':>8} {'tokens/s':>10}")
    for r in rows:
        print(f"{r['engine']:32} {r['tokens']:>8} {r['wall_s']:>8} {r['tokens_per_s']:>10}")
    if vllm_note:
        print(vllm_note)
    print(f"-> {args.json_out.relative_to(ROOT) if args.json_out.is_relative_to(ROOT) else args.json_out}")


if __name__ == "__main__":
    main()

"""Peak memory of fresh processes: the RL log-prob and update passes at a real vocabulary (materialised logits
versus the chunked log-probs of stages/core/logprobs.py), and training steps of a model of any shape (the
memory planner's check, stages/plan.py).

    python benchmarks/memory.py passes [--n 8] [--t 512] [--vocab 152064]       # before / after, values compared
    python benchmarks/memory.py train --hidden 512 --layers 4 --vocab 65536 --seq 512 --micro-batch 2 [--zero 2]
                                      [--lora-rank 16]     # a LoRA adapter on every linear map trains instead

Each measurement runs in a fresh subprocess (two ranks under torchrun for ``--zero 2``, gloo, DeepSpeed's CPU
accelerator): after the imports (and joining the process group) the process resets its peak resident set size
(``/proc/self/clear_refs``), builds the model and inputs, runs the pass or the steps, and reports the peak RSS
above that baseline (VmHWM - RSS at the reset). ``passes`` prints the peaks of both paths and the largest
difference of their log-probs, entropies and gradients; results go to benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "memory.json"
sys.path.insert(0, str(ROOT))

from flows._process import free_port  # noqa: E402


def _status(key: str) -> int:
    """A /proc/self/status size in bytes (VmRSS, VmHWM)."""
    m = re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(m.group(1)) * 1024 if m else 0


def reset_peak() -> int:
    """Reset this process's peak RSS to its current RSS; return that RSS (the baseline)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def peak() -> int:
    """This process's peak RSS since the last :func:`reset_peak`, in bytes."""
    return _status("VmHWM")


# ---------------------------------------------------------------------------------------------
# children


def _narrow_model(vocab: int, hidden: int, layers: int) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


def child_passes(c: dict[str, Any], out: Path) -> dict[str, Any]:
    """One log-prob pass (no gradient, as pi_ref / pi_old) or update pass (forward with entropy, backward) of
    stages.rl.rollout.token_logprobs over ``n`` outputs of ``t`` tokens after a ``prompt``-token prompt."""
    import torch

    from stages.rl.rollout import token_logprobs

    torch.set_num_threads(1)
    base = reset_peak()
    model = _narrow_model(c["vocab"], c["hidden"], c["layers"])
    g = torch.Generator().manual_seed(1)
    n, t, p = c["n"], c["t"], c["prompt"]
    ids = torch.randint(0, c["vocab"], (n, p + t), generator=g)
    att = torch.ones_like(ids)
    chunk = c["chunk"]
    t0 = time.perf_counter()
    if c["mode"] == "logprobs":
        model.eval()
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, att, p, c["temperature"], chunk_tokens=chunk)
        ent = None
    else:
        model.train()
        lp, ent = token_logprobs(model, ids, att, p, c["temperature"], entropy=True, chunk_tokens=chunk)
        (lp * torch.linspace(-1.0, 1.0, t)).sum().backward()  # any weighting of the tokens (a policy loss)
    wall = time.perf_counter() - t0
    top = peak()
    saved: dict[str, Any] = {"lp": lp.detach()}
    if ent is not None:
        saved["ent"] = ent
        saved["grads"] = {k: q.grad for k, q in model.named_parameters() if q.grad is not None}
    torch.save(saved, out.with_suffix(".pt"))
    return {"peak_bytes": top - base, "baseline_bytes": base, "wall_s": round(wall, 2)}


def child_train(c: dict[str, Any], out: Path) -> dict[str, Any]:
    """``steps`` optimizer steps of a causal LM of the given shape on random tokens, through the one update path
    (stages.train.update.Updater: plain AdamW, or DeepSpeed ZeRO-``zero`` on the launched ranks) with the stages'
    chunked loss (stages.train.losses.lm_nll_sum), in float32."""
    import torch

    torch.set_num_threads(1)
    ds_cfg = None
    if c["zero"] is not None:
        import importlib

        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        import deepspeed  # noqa: F401

        from stages.core.dist import ensure_process_group, init_distributed_env
        from stages.train.ds_config import build_deepspeed_config

        init_distributed_env()
        ensure_process_group()
        ds_cfg = build_deepspeed_config(zero_stage=c["zero"], offload_optimizer=False,
                                        micro_batch_size=c["micro_batch"], grad_accum=1, max_grad_norm=1.0, bf16=False)
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.core.modeling import enable_checkpointing
    from stages.train.losses import lm_nll_sum
    from stages.train.update import Updater

    base = reset_peak()
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                      max_position_embeddings=max(4096, c["seq"]), tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.config.use_cache = False
    opt = None
    if c.get("lora_rank"):  # the RL policy's LoRA (stages/rl/lora.py): the adapter trains, AdamW holds its states only
        from types import SimpleNamespace

        from stages.rl.lora import attach

        attach(model, SimpleNamespace(enabled=True, rank=c["lora_rank"], alpha=2.0 * c["lora_rank"], dropout=0.0,
                                      target_modules=["all-linear"]), seed=0)
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
    enable_checkpointing(model, c["checkpointing"])
    model.train()
    upd = Updater(model, max_grad_norm=1.0, lr=1e-4, deepspeed=ds_cfg, optimizer=opt)
    g = torch.Generator().manual_seed(upd.rank)
    t0 = time.perf_counter()
    losses = []
    for _ in range(c["steps"]):
        ids = torch.randint(0, c["vocab"], (c["micro_batch"], c["seq"]), generator=g)
        upd.zero_grad()
        nll, n = lm_nll_sum(upd.forward_model, ids, chunk_tokens=c["chunk"], input_ids=ids, use_cache=False)
        upd.backward(nll / n, last=True)
        upd.step(bad=False)
        losses.append(float(nll / n))
    wall = time.perf_counter() - t0
    return {"peak_bytes": peak() - base, "baseline_bytes": base, "wall_s": round(wall, 2), "losses": losses,
            "rank": upd.rank, "world": upd.world, "n_params": sum(q.numel() for q in model.parameters())}


# ---------------------------------------------------------------------------------------------
# the parent side



def run_child(kind: str, cfg: dict[str, Any], ranks: int = 1, timeout: float = 900) -> list[dict[str, Any]]:
    """Run one measurement in a fresh process (``ranks`` > 1: under torchrun); return each rank's result."""
    # a fixed mmap threshold (it also turns off glibc's dynamic one): every tensor above 64 KiB gets its own mapping,
    # returned to the system when freed, so the resident set follows the live tensors instead of heap fragmentation
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "MALLOC_MMAP_THRESHOLD_": "65536"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(cfg), str(out)]
        if ranks > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
                   str(free_port()), *cmd[1:]]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"memory child {kind} {cfg} failed:\n{proc.stderr[-3000:]}")
        res = [json.loads(f.read_text()) for f in sorted(Path(d).glob("result*.json"))]
        for r in res:
            pt = Path(d) / "result.pt"
            if pt.is_file():
                import torch

                r["tensors"] = torch.load(pt, weights_only=False)
        return res


def compare_passes(n: int, t: int, vocab: int, *, hidden: int = 64, layers: int = 1, prompt: int = 16,
                   chunk: int = 256, temperature: float = 1.0) -> dict[str, Any]:
    """Peak memory of the log-prob and update passes with materialised logits (chunk 0) and chunked, in fresh
    processes; the largest differences of their log-probs, entropies and gradients."""
    out: dict[str, Any] = {"n": n, "t": t, "prompt": prompt, "vocab": vocab, "hidden": hidden, "layers": layers,
                           "chunk_tokens": chunk, "temperature": temperature}
    for mode in ("logprobs", "update"):
        runs = {}
        for name, ch in (("before", 0), ("after", chunk)):
            cfg = {"mode": mode, "n": n, "t": t, "prompt": prompt, "vocab": vocab, "hidden": hidden, "layers": layers,
                   "chunk": ch, "temperature": temperature}
            (runs[name],) = run_child("passes", cfg)
        a, b = runs["before"].pop("tensors"), runs["after"].pop("tensors")
        diff = {"logprobs_max_abs_diff": float((a["lp"] - b["lp"]).abs().max())}
        if "ent" in a:
            diff["entropy_max_abs_diff"] = float((a["ent"] - b["ent"]).abs().max())
            diff["grad_max_rel_diff"] = max(float((a["grads"][k] - b["grads"][k]).norm() / a["grads"][k].norm().clamp(min=1e-30))
                                            for k in a["grads"])
        out[mode] = {**runs, **diff,
                     "peak_ratio": round(runs["before"]["peak_bytes"] / max(runs["after"]["peak_bytes"], 1), 2)}
    return out


def measure_train(shape: dict[str, Any]) -> list[dict[str, Any]]:
    """Peak memory above baseline of :func:`child_train` for ``shape`` (``zero`` None: one plain process; 0-2: that
    ZeRO stage on ``ranks`` gloo ranks)."""
    cfg = {"steps": 2, "chunk": 256, "checkpointing": False, "zero": None, "ranks": 1, **shape}
    return run_child("train", cfg, ranks=cfg["ranks"] if cfg["zero"] is not None else 1)


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    a = sub.add_parser("passes")
    a.add_argument("--n", type=int, default=8)
    a.add_argument("--t", type=int, default=512)
    a.add_argument("--vocab", type=int, default=152064)
    a.add_argument("--chunk", type=int, default=256)
    b = sub.add_parser("train")
    for k, v in (("hidden", 512), ("layers", 4), ("vocab", 65536), ("seq", 512), ("micro-batch", 2), ("heads", 8),
                 ("kv-heads", 8), ("intermediate", 0), ("ranks", 2)):
        b.add_argument(f"--{k}", type=int, default=v)
    b.add_argument("--zero", type=int, default=None)
    b.add_argument("--checkpointing", action="store_true")
    b.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank on every linear map")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        argv = ["passes", *argv]  # the default (benchmarks/run_all.py runs it so)
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    if args.cmd == "passes":
        res = compare_passes(args.n, args.t, args.vocab, chunk=args.chunk)
        for mode in ("logprobs", "update"):
            r = res[mode]
            print(f"{mode:>9}: before {_gib(r['before']['peak_bytes'])}, after {_gib(r['after']['peak_bytes'])} "
                  f"({r['peak_ratio']}x); max |diff| log-probs {r['logprobs_max_abs_diff']:.2e}"
                  + (f", entropy {r['entropy_max_abs_diff']:.2e}, grads (rel) {r['grad_max_rel_diff']:.2e}"
                     if "entropy_max_abs_diff" in r else ""))
        res.update(load_avg=round(load, 2), measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        data[f"passes_{args.n}x{args.t}_v{args.vocab}"] = res
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
        return 0
    shape = {"hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "seq": args.seq,
             "micro_batch": args.micro_batch, "heads": args.heads, "kv_heads": args.kv_heads,
             "intermediate": args.intermediate or 4 * args.hidden, "zero": args.zero, "ranks": args.ranks,
             "checkpointing": args.checkpointing, "lora_rank": args.lora_rank}
    for r in measure_train(shape):
        print(f"rank {r['rank']}/{r['world']}: peak {_gib(r['peak_bytes'])} above baseline, {r['wall_s']} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        kind, cfg, out = sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
        res = (child_passes if kind == "passes" else child_train)(cfg, out)
        rank = os.environ.get("RANK")
        Path(f"{out}{'-' + rank if rank else ''}.json").write_text(json.dumps(res))
        raise SystemExit(0)
    raise SystemExit(main())

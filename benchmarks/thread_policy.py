"""Torch CPU thread policy under load (issue 29 item 2): a fixed workload of the tiny default model's size, alone and
beside one busy process (``python3 -c 'while True: pass'``), for several thread counts and OpenMP wait policies.

Torch's CPU kernels run on OpenMP (the wheel's libgomp). Between parallel regions a libgomp thread spins for
``GOMP_SPINCOUNT`` iterations before it sleeps (``OMP_WAIT_POLICY=PASSIVE``: no spin, ``ACTIVE``: spin forever;
unset: 300000 spins). On 2 cores with one other busy process, a spinning thread burns the time slice its partner
needs, so 2 threads run ~3x slower than alone; sleeping at once costs the wake-ups on an idle machine. Each
configuration runs in its own process (libgomp reads the variables when it loads), and the runs are interleaved
(every configuration alone, then every one beside the busy process, then again) so that other load affects all alike.

Workloads (random weights; params.yaml ``base_model`` sizes):

- ``train``: ``--steps`` optimizer steps of the pretrain shapes (micro_batch_size x seq_len), bf16 autocast where
  the CPU has AMX (as the training loop), AdamW;
- ``generate``: the hf generator (stages/core/generation.py) sampling ``--prompts`` x 8 outputs of 64 tokens, as
  a GRPO step's rollout.

``adaptive``: stages/core/threads.py's ThreadPolicy, which picks 1 or 2 threads between steps (the generate
workload runs as 4 calls of 4 prompts, GRPO-like steps). Each run also records a checksum of its result (the trained weights, the sampled token ids), so the table shows
which configurations compute the same bits (the same thread count must; another count may not).

    python benchmarks/thread_policy.py                 # JSON to benchmarks/results/thread_policy.json
    python benchmarks/thread_policy.py --quick         # fewer steps, one repeat
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "thread_policy.json"

CONFIGS: dict[str, dict[str, str]] = {
    "2 threads (libgomp default)": {"threads": "2"},
    "2 threads, OMP_WAIT_POLICY=PASSIVE": {"threads": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    "2 threads, GOMP_SPINCOUNT=10000": {"threads": "2", "GOMP_SPINCOUNT": "10000"},
    "2 threads, GOMP_SPINCOUNT=1000": {"threads": "2", "GOMP_SPINCOUNT": "1000"},
    "1 thread": {"threads": "1"},
    "adaptive, 1-2 threads (stages/core/threads.py)": {"threads": "2", "adaptive": "1"},
}


def _worker(workload: str, threads: int, steps: int, prompts: int, adaptive: bool) -> dict[str, Any]:
    """Run one workload in this process; return its wall / CPU time and a checksum of its result."""
    import torch

    sys.path.insert(0, str(ROOT))
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.core.threads import ThreadPolicy

    policy = ThreadPolicy(threads, adaptive=adaptive)  # not adaptive: set_num_threads(threads) for good
    time.sleep(0.5)  # the sampler's first samples
    from stages.params import resolve
    raw = resolve(ROOT / "params.yaml")
    b = raw["base_model"]
    cfg = LlamaConfig(vocab_size=b["vocab_size"], hidden_size=b["hidden_size"], intermediate_size=b["intermediate_size"],
                      num_hidden_layers=b["num_layers"], num_attention_heads=b["num_heads"],
                      num_key_value_heads=b["num_kv_heads"], max_position_embeddings=b["max_position_embeddings"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    h = hashlib.md5()
    if workload == "train":
        t = raw["pretrain"]["train"]
        bs, sl = t["micro_batch_size"], t["seq_len"]
        bf16 = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, cfg.vocab_size, (bs, sl), generator=g) for _ in range(steps + 1)]

        def step(x: torch.Tensor) -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step(batches[-1])  # warm-up (kernel selection, allocator)
        t0, c0 = time.perf_counter(), time.process_time()
        for x in batches[:steps]:
            policy.step()
            step(x)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        for v in model.state_dict().values():
            h.update(v.float().numpy().tobytes())
    else:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        from stages.core.generation import HFGenerator, SamplingParams

        vocab = {f"w{i}": i for i in range(cfg.vocab_size - 2)} | {"<unk>": cfg.vocab_size - 2, "</s>": cfg.vocab_size - 1}
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="</s>", pad_token="</s>")
        model.eval()
        gen = HFGenerator(model, tok)
        texts = [" ".join(f"w{(7 * i + j) % 500}" for j in range(40)) for i in range(prompts)]
        sp = SamplingParams(temperature=1.0, n=8, max_new_tokens=64, seed=0)
        gen.generate(texts[:2], SamplingParams(temperature=1.0, n=2, max_new_tokens=8, seed=0))  # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        outs = []
        for k in range(0, len(texts), 4):  # GRPO-like steps of 4 questions x 8 outputs, the policy decides between
            policy.step()
            outs += gen.generate(texts[k:k + 4], sp)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        for group in outs:
            for c in group:
                h.update(str(list(c.token_ids)).encode())
    policy.close()
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "checksum": h.hexdigest()[:12],
            "steps_at_threads": policy.stats()["steps_at_threads"]}


def run_one(name: str, workload: str, busy: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update({k: v for k, v in cfg.items() if k not in ("threads", "adaptive")})
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        load0 = os.getloadavg()[0]
        proc = subprocess.run([sys.executable, __file__, "--worker", workload, cfg["threads"], str(args.steps),
                               str(args.prompts), cfg.get("adaptive", "0")], env=env, capture_output=True, text=True,
                              cwd=ROOT)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{name} {workload}: worker failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"config": name, "workload": workload, "busy": busy, "loadavg_before": round(load0, 2), **r}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        workload, threads, steps, prompts = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(_worker(workload, threads, steps, prompts, sys.argv[6] == "1")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="training steps per run (default 12)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per generate run, 8 outputs each (default 16)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=["train", "generate"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), help="names of CONFIGS")
    ap.add_argument("--quick", action="store_true", help="--steps 4 --prompts 8 --repeats 1")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.quick:
        args.steps, args.prompts, args.repeats = 4, 8, 1
    uptime0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = []
    for rep in range(args.repeats):
        for busy in (False, True):
            for workload in args.workloads:
                for name in args.configs:
                    r = run_one(name, workload, busy, args)
                    r["repeat"] = rep
                    rows.append(r)
                    print(f"{workload:9} {'busy' if busy else 'alone':6} {name:46} {r['wall_s']:8.2f} s  cpu "
                          f"{r['cpu_s']:7.2f} s  {r['checksum']}  load {r['loadavg_before']}  "
                          f"threads {r['steps_at_threads']}", flush=True)
    uptime1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    table = []
    for workload in args.workloads:
        for name in args.configs:
            alone = [r["wall_s"] for r in rows if r["workload"] == workload and r["config"] == name and not r["busy"]]
            busy = [r["wall_s"] for r in rows if r["workload"] == workload and r["config"] == name and r["busy"]]
            sums = sorted({r["checksum"] for r in rows if r["workload"] == workload and r["config"] == name})
            a, b = statistics.median(alone), statistics.median(busy)
            table.append({"workload": workload, "config": name, "alone_s": a, "busy_s": b, "busy_over_alone": round(b / a, 2),
                          "checksums": sums})
    base = {w: next(t["alone_s"] for t in table if t["workload"] == w) for w in args.workloads}
    print(f"\n{'workload':9} {'config':46} {'alone s':>8} {'busy s':>8} {'busy/alone':>10} {'alone/default':>13}  checksum")
    for t in table:
        t["alone_over_default"] = round(t["alone_s"] / base[t["workload"]], 2)
        print(f"{t['workload']:9} {t['config']:46} {t['alone_s']:8.2f} {t['busy_s']:8.2f} {t['busy_over_alone']:10.2f} "
              f"{t['alone_over_default']:13.2f}  {','.join(t['checksums'])}")
    result = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "steps": args.steps,
              "prompts": args.prompts, "repeats": args.repeats, "uptime_before": uptime0, "uptime_after": uptime1,
              "table": table, "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"uptime before: {uptime0}\nuptime after:  {uptime1}\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

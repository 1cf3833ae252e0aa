"""TIR-mode GRPO against CoT-mode GRPO on the tiny default (issue 21): the same steps from the same SFT model, several
seeds, interleaved (seed 0 cot, seed 0 tir, seed 1 cot, ...) in one process so that machine load hits both alike.

    nice -n 10 python benchmarks/tir_rl.py --data /path/to/a/pipeline/run/data [--seeds 0 1 2] [--steps 20]
    python benchmarks/tir_rl.py --plot-only          # redraw the figure from benchmarks/results/tir_rl.json
    nice -n 10 python benchmarks/tir_rl.py --data DIR --chunks-ab 4  # TIR rollouts with chunks 1 / 2 / 4

Each run: params.yaml's grpo section (the tiny default: 16 questions x G = 8, rule reward, beta 0.04) with
``rollout.mode`` cot or tir, ``steps`` steps, no baseline, no held-out curve, no checkpoints, then the trained policy
evaluated by the evaluation stage's own loop (stages.evaluate.loop.run_one, params.yaml's evaluate.common settings,
zero-shot) with greedy CoT and greedy TIR on the first ``--eval-limit`` held-out generated test problems. The SFT
model is evaluated the same way once (the start). Per run it records the held-out accuracies, the mean time per step
and its phases, the sandbox's part of the step (``tool_exec_s``: the programs' own wall time, run concurrently with
generation; ``tool_wait_s``: the time the rollout waited for programs, i.e. the sandbox's exposed share), programs per
second inside RL (programs / rollout wall time) and the load average before and after. Writes
benchmarks/results/tir_rl.json after every run (a crash keeps what was measured) and benchmarks/results/tir_rl.png.

``--resume``: keep the start evaluation and the finished runs of an earlier ``--out`` file made with the same data,
steps and evaluation size (a run is identified by seed and mode) and run only the missing ones; the file's command and
machine fields record every invocation. Each run's own load average is kept, so compare timings of resumed runs with
care.

``--data`` is a pipeline run's data directory (models/sft, corpus/problems/rl.jsonl, generated/problems/test.jsonl);
it is read only.

``--chunks-ab N``: the overlap of programs with generation alone. N rounds; each samples one step's TIR rollout
(16 questions x G = 8 from the SFT model, the questions of step ``round``) with ``grpo.rollout.chunks`` 1, 2 and 4 in
a rotated order, and records the rollout's wall time, the time spent waiting for the sandbox and in the generator.
Writes benchmarks/results/tir_rollout_chunks.json. The samples differ between the settings (each chunk's generator
call has its own seed), so compare the wait first and the wall time over several rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "results" / "tir_rl.json"
MODES = ("cot", "tir")
STEP_KEYS = ("step_s", "t_generation", "t_scoring", "t_logprobs", "t_update", "tool_programs", "tool_failed",
             "tool_wait_s", "tool_exec_s", "tool_generate_s", "tool_wall_s", "tir_rounds_mean", "completion_len",
             "reward_mean", "accuracy", "kl")


def grpo_params(seed: int, steps: int, mode: str, threads: int, chunks: int | None) -> Any:
    """params.yaml's grpo section (runtime values merged) for one run."""
    from stages.schema.grpo import GrpoParams

    p = GrpoParams.from_file(ROOT / "params.yaml")
    return p.updated({
        "seed": seed, "steps": steps, "compute.num_threads": threads, "checkpoint_every": 0,
        "log_completions_every": 0, "rollout.mode": mode, **({"rollout.chunks": chunks} if chunks else {}),
        "heldout.every": 0, "baseline.enabled": False, "iterative.iterations": 1})


def evaluate(model: Any, tok: Any, problems: list[Any], workdir: Path) -> dict[str, Any]:
    """Greedy CoT and TIR accuracy of ``model`` with the evaluation stage's loop and settings."""
    from stages.core.generation import make_generator
    from stages.evaluate.loop import LoopSettings, RunSpec, run_one
    from stages.evaluate.stage import resolve_dtype
    from stages.schema.evaluate import EvaluateParams

    c = EvaluateParams.from_file(ROOT / "params.yaml").common
    gen = make_generator("hf", model, tok, dtype=resolve_dtype(c.dtype), batch_size=c.batch_size)
    s = LoopSettings(c.batch_size, c.max_new_tokens, c.temperature, c.top_p, c.seed, c.tir_max_rounds,
                     c.exec_timeout_s, c.exec_workers)
    out: dict[str, Any] = {"n": len(problems), "dtype": resolve_dtype(c.dtype)}
    for mode in MODES:
        t0 = time.perf_counter()
        ck = workdir / f"eval_{mode}_{time.time_ns()}.jsonl"
        recs, _ = run_one(gen, problems, RunSpec("generated", mode, "greedy", 1), s, "zero_shot", None, ck)
        ck.unlink(missing_ok=True)
        comps = [r["completions"][0] for r in recs]
        out[mode] = {"acc": round(sum(c["correct"] for c in comps) / len(comps), 4),
                     "mean_tokens": round(sum(c["n_tokens"] for c in comps) / len(comps), 2),
                     "wall_s": round(time.perf_counter() - t0, 1)}
        if mode == "tir":
            out[mode]["mean_executions"] = round(sum(c["executions"] for c in comps) / len(comps), 3)
    return out


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _sd(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return 0.0 if xs else math.nan
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def run_stats(hist: list[dict[str, Any]]) -> dict[str, Any]:
    """Means per step of the timing and rollout metrics, and the sandbox's share of the step."""
    out = {f"{k}_mean": round(_mean([h.get(k, math.nan) for h in hist]), 4) for k in STEP_KEYS}
    step = sum(h["step_s"] for h in hist)
    wall = sum(h.get("tool_wall_s", 0.0) for h in hist)
    progs = sum(h.get("tool_programs", 0.0) for h in hist)
    out["sandbox_exec_share_of_step"] = round(sum(h.get("tool_exec_s", 0.0) for h in hist) / step, 4)
    out["sandbox_wait_share_of_step"] = round(sum(h.get("tool_wait_s", 0.0) for h in hist) / step, 4)
    out["programs_per_s_of_rollout"] = round(progs / wall, 2) if wall else 0.0
    out["programs_per_s_of_sandbox_time"] = round(progs / sum(h.get("tool_exec_s", 0.0) for h in hist), 2) \
        if progs else 0.0
    out["reward_first5"] = round(_mean([h["reward_mean"] for h in hist[:5]]), 4)
    out["reward_last5"] = round(_mean([h["reward_mean"] for h in hist[-5:]]), 4)
    return out


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Mean and sd over seeds per rollout mode."""
    summ: dict[str, Any] = {}
    for mode in MODES:
        runs = [r for r in res["runs"] if r["mode"] == mode and "eval" in r]
        if not runs:
            continue
        s: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
        for ev in MODES:
            xs = [r["eval"][ev]["acc"] for r in runs]
            s[f"heldout_{ev}_greedy"] = {"mean": round(_mean(xs), 4), "sd": round(_sd(xs), 4), "runs": xs}
        for k in ("step_s_mean", "t_generation_mean", "t_update_mean", "t_logprobs_mean", "tool_wait_s_mean",
                  "tool_exec_s_mean", "tool_programs_mean", "sandbox_exec_share_of_step", "sandbox_wait_share_of_step",
                  "programs_per_s_of_rollout", "programs_per_s_of_sandbox_time", "completion_len_mean",
                  "reward_first5", "reward_last5"):
            xs = [r["stats"][k] for r in runs]
            s[k] = {"mean": round(_mean(xs), 4), "sd": round(_sd(xs), 4)}
        summ[mode] = s
    return summ


def reusable(prev: dict[str, Any], data: str, steps: int, eval_limit: int) -> dict[str, Any] | None:
    """What ``--resume`` may keep of an earlier result file ``prev``: its start evaluation and finished runs, when it
    was made with the same data directory, steps and evaluation size; None otherwise (then nothing is reused)."""
    if (prev.get("benchmark") != "tir_rl" or prev.get("data") != data or prev.get("steps") != steps
            or prev.get("eval_limit") != eval_limit or "start" not in prev):
        return None
    runs = [r for r in prev.get("runs", []) if "eval" in r and "stats" in r]
    return {"start": prev["start"], "runs": runs, "commands": prev.get("commands", [prev.get("command")]),
            "machines": prev.get("machines", [prev.get("machine")]), "loads": [
                x for r in runs for x in (r["loadavg_before"], r["loadavg_after"])]}


def write(res: dict[str, Any], out: Path) -> None:
    from stages.core.io import write_json

    res["summary"] = summarize(res)
    write_json(out, res)


def plot(res: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = res.get("summary") or summarize(res)
    start = res.get("start", {}).get("eval")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    groups = [("SFT (start)", {ev: (start[ev]["acc"], 0.0) for ev in MODES} if start else None)]
    for mode in MODES:
        if mode in summ:
            groups.append((f"{mode.upper()}-mode GRPO", {ev: (summ[mode][f"heldout_{ev}_greedy"]["mean"],
                                                              summ[mode][f"heldout_{ev}_greedy"]["sd"]) for ev in MODES}))
    width = 0.38
    for k, ev in enumerate(MODES):
        xs = [i + (k - 0.5) * width for i, (_, g) in enumerate(groups) if g]
        ys = [g[ev][0] for _, g in groups if g]
        es = [g[ev][1] for _, g in groups if g]
        ax.bar(xs, ys, width, yerr=es, capsize=3, label=f"held-out {ev.upper()} greedy")
    ax.set_xticks(range(len(groups)), [n for n, _ in groups])
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    n_seeds = max((len(v["seeds"]) for v in summ.values()), default=0)
    ax.set_title(f"{res['steps']} steps, {n_seeds} seeds (mean +- sd)", fontsize=9)
    parts = [("t_generation_mean", "generation (incl. sandbox wait)"), ("t_logprobs_mean", "log-probs"),
             ("t_update_mean", "update")]
    names = [m for m in MODES if m in summ]
    bottom = [0.0] * len(names)
    for key, label in parts:
        ys = [summ[m][key]["mean"] for m in names]
        bx.bar(names, ys, 0.5, bottom=bottom, label=label)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    waits = [summ[m]["tool_wait_s_mean"]["mean"] for m in names]
    bx.bar(names, waits, 0.2, color="black", label="of which: waiting for the sandbox")
    bx.set_ylabel("seconds per step")
    bx.set_title(f"time per step (load average ~{res.get('loadavg_mean', '?')})", fontsize=9)
    bx.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def chunks_ab(data: Path, rounds: int, threads: int, out: Path) -> dict[str, Any]:
    """See the module docstring (``--chunks-ab``)."""
    import torch

    from benchmarks._tiny import machine
    from stages.core.generation import make_generator
    from stages.core.io import write_json
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.data import load_prompts, step_questions
    from stages.rl.rollout import sample_outputs

    torch.set_num_threads(threads)
    sft = data / "models" / "sft"
    tok, model = load_tokenizer(sft), load_model(sft)
    rows = load_prompts(data / "corpus" / "problems" / "rl.jsonl")
    gen = make_generator("hf", model, tok, batch_size=128)
    res: dict[str, Any] = {"benchmark": "tir_rollout_chunks", "machine": machine(), "rounds": [],
                           "command": "nice -n 10 python benchmarks/tir_rl.py " + " ".join(sys.argv[1:])}
    settings = (1, 2, 4)
    for r in range(rounds):
        base = grpo_params(0, 1, "tir", threads, None)
        qs = step_questions(len(rows), r, base.questions_per_step, base.seed)
        for chunks in settings[r % 3:] + settings[: r % 3]:
            p = grpo_params(0, 1, "tir", threads, chunks)
            la = os.getloadavg()[0]
            t0 = time.perf_counter()
            _, m = sample_outputs(gen, tok, [rows[q]["question"] for q in qs], ["tir"] * len(qs), p, seed=r)
            res["rounds"].append({"round": r, "chunks": chunks, "wall_s": round(time.perf_counter() - t0, 2),
                                  "loadavg": round(la, 2), **{k: round(v, 3) for k, v in m.items()}})
            print(json.dumps(res["rounds"][-1]), flush=True)
        write_json(out, res)
    res["summary"] = {str(c): {k: round(_mean([x[k] for x in res["rounds"] if x["chunks"] == c]), 3)
                               for k in ("wall_s", "tool_wait_s", "tool_generate_s", "tool_exec_s", "tool_programs",
                                         "tool_programs_per_s")} for c in settings}
    res["machine_after"] = machine()
    write_json(out, res)
    print(json.dumps(res["summary"], indent=1))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "data"), help="a pipeline run's data directory (read only)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-limit", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=None, help="override grpo.rollout.chunks")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--resume", action="store_true", help="reuse the start evaluation and finished runs in --out")
    ap.add_argument("--chunks-ab", type=int, default=0, metavar="N", help="only the chunks A/B, N rounds")
    args = ap.parse_args()
    out = Path(args.out)
    if args.chunks_ab:
        chunks_ab(Path(args.data), args.chunks_ab, args.threads, out.with_name("tir_rollout_chunks.json"))
        return 0
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return 0

    import torch

    from benchmarks._tiny import machine
    from stages.core.modeling import load_model, load_tokenizer
    from stages.core.problems import load_problem_file
    from stages.rl.data import load_prompts
    from stages.rl.loop import fit

    torch.set_num_threads(args.threads)
    data = Path(args.data)
    sft, prompts = data / "models" / "sft", data / "corpus" / "problems" / "rl.jsonl"
    problems = load_problem_file(data / "generated" / "problems" / "test.jsonl", args.eval_limit)
    rows = load_prompts(prompts)
    res: dict[str, Any] = {"benchmark": "tir_rl", "machine": machine(), "data": str(data), "steps": args.steps,
                           "seeds": args.seeds, "eval_limit": len(problems),
                           "command": "nice -n 10 python benchmarks/tir_rl.py " + " ".join(sys.argv[1:]), "runs": []}
    loads: list[float] = []
    kept = None
    if args.resume and out.exists():
        kept = reusable(json.loads(out.read_text()), str(data), args.steps, len(problems))
        if kept is None:
            print(f"--resume: {out} was made with other data/steps/eval-limit; starting afresh", flush=True)
    if kept:
        res.update(start=kept["start"], runs=kept["runs"], commands=kept["commands"] + [res["command"]],
                   machines=kept["machines"] + [res["machine"]])
        loads = kept["loads"]
        print(f"--resume: reusing the start evaluation and {len(kept['runs'])} runs of {out}", flush=True)
    done = {(r["seed"], r["mode"]) for r in res["runs"]}
    with tempfile.TemporaryDirectory(prefix="tir_rl_") as tmp:
        tok = load_tokenizer(sft)
        if "start" not in res:
            t0 = time.perf_counter()
            res["start"] = {"eval": evaluate(load_model(sft), tok, problems, Path(tmp)),
                            "eval_wall_s": round(time.perf_counter() - t0, 1)}
        print("SFT:", res["start"]["eval"], flush=True)
        for seed in args.seeds:
            for mode in MODES:
                if (seed, mode) in done:
                    continue
                p = grpo_params(seed, args.steps, mode, args.threads, args.chunks)
                model = load_model(sft)
                torch.manual_seed(seed)
                la0 = os.getloadavg()[0]
                t0 = time.perf_counter()
                _, _, state = fit(p, model, tok, rows=rows)
                hist = state.history
                train_s = time.perf_counter() - t0
                ev = evaluate(model, tok, problems, Path(tmp))
                la1 = os.getloadavg()[0]
                loads += [la0, la1]
                run = {"seed": seed, "mode": mode, "chunks": p.rollout.chunks,
                       "sandbox_workers": p.rollout.exec_workers, "train_wall_s": round(train_s, 1),
                       "loadavg_before": round(la0, 2), "loadavg_after": round(la1, 2), "eval": ev,
                       "stats": run_stats(hist),
                       "curve": [{k: h.get(k) for k in ("step", "reward_mean", "accuracy", "step_s", "tool_wait_s",
                                                        "tool_exec_s", "tool_programs")} for h in hist]}
                res["runs"].append(run)
                res["loadavg_mean"] = round(sum(loads) / len(loads), 1)
                write(res, out)
                print(f"seed {seed} {mode}: eval {ev['cot']['acc']:.3f} cot / {ev['tir']['acc']:.3f} tir | "
                      f"{run['stats']['step_s_mean']:.1f} s/step, sandbox wait share "
                      f"{run['stats']['sandbox_wait_share_of_step']:.3f} | load {la0:.1f}->{la1:.1f}", flush=True)
    res["machine_after"] = machine()
    write(res, out)
    plot(res, out.with_suffix(".png"))
    print(json.dumps(res["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

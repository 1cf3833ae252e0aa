"""Run every benchmark script, then summarise their results against the goals of the benchmark issue.

    python -m benchmarks.run_all                 # every script with its own defaults
    python -m benchmarks.run_all --quick         # small settings (a smoke run on a busy 2-core CPU)
    python -m benchmarks.run_all --only grpo_vs_trl,scaling --timeout 900
    python -m benchmarks.run_all --summary-only  # re-summarise benchmarks/results/*.json, run nothing

Each script (every ``benchmarks/*.py`` except this one and ``_``-prefixed helpers) runs in its own
subprocess with a timeout; a failure or timeout is recorded and the run goes on. Then every
``benchmarks/results/*.json`` is read and two files are written:

- ``benchmarks/results/SUMMARY.md``: one table of headline figures (ratios where the benchmark compares
  two things) and one table of goals met / missed / not measured;
- ``benchmarks/results/summary.json``: the same, plus per-script return code, wall time, load average
  before and after, and the last lines of its output.

A figure that a script did not produce is shown as "not measured", never guessed. On a shared machine
the load averages recorded next to each script say how noisy its timings are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"

# Run order: cheap and independent first, the long comparisons last. Scripts not listed run after these.
ORDER = ("answers", "sandbox", "generation", "training", "corpus", "grpo_step", "grpo_vs_trl", "scaling",
         "orchestration", "sft_accuracy")

# Small settings for --quick; a flag is passed only if the script's source mentions it (scripts evolve).
QUICK_ARGS: dict[str, list[str]] = {
    "answers": ["--n", "2000", "--symbolic", "20"],
    "sandbox": ["--n", "40", "--fresh-n", "5"],
    "generation": ["--prompts", "8", "--n", "2", "--max-new-tokens", "32"],
    "training": ["--steps", "2", "--threads", "2"],
    "grpo_step": ["--steps", "1", "--threads", "2"],
    "grpo_vs_trl": ["--quick"],
    "scaling": ["--quick"],
    "orchestration": [],
    "sft_accuracy": ["--limit", "50"],
    "corpus": ["--quick"],
    "decontam": ["--quick"],
    "memory": ["--n", "4"],  # the materialised logits of 8 x 512 tokens at 152k peak near 10 GB
    "tir_rl": ["--steps", "2", "--seeds", "0", "--eval-limit", "50"],
    "rm_monitor": ["--steps", "2", "--seeds", "0", "--methods", "grpo_os_rm", "--heldout-every", "2", "--heldout-limit", "8"],
}


# Not part of the CPU suite: gpu_check needs a GPU; paradigm queues hours of `dvc exp` runs;
# sandbox_syscalls is an audit under strace (the evidence for the sandbox's seccomp allow-list), not a timing.
NOT_IN_SUITE = {"run_all", "gpu_check", "paradigm", "sandbox_syscalls", "results_pages"}


def discover() -> list[str]:
    """Benchmark script names (file stems) in run order."""
    names = sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_") and p.stem not in NOT_IN_SUITE)
    return [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]


def quick_args(name: str) -> list[str]:
    """QUICK_ARGS[name] minus the flags (with their values) that the script's source does not define."""
    args = QUICK_ARGS.get(name, [])
    src = (BENCH / f"{name}.py").read_text(encoding="utf-8")
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        val = [args[i + 1]] if i + 1 < len(args) and not args[i + 1].startswith("--") else []
        if f'"{flag}"' in src or f"'{flag}'" in src:
            out += [flag, *val]
        i += 1 + len(val)
    return out


def run_script(name: str, args: list[str], timeout_s: float, nice: int) -> dict[str, Any]:
    """Run one script in a subprocess; return its record (rc, wall, load, output tail)."""
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *args]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    preexec: Callable[[], None] | None = (lambda: os.nice(nice)) if nice else None  # noqa: E731
    status, rc = "ok", None
    # its own session, so that a timeout ends the script's whole process tree (dvc, flows, servers), nothing else
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=preexec, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        status = "timeout"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    tail = out.strip().splitlines()[-15:]
    return {"script": name, "cmd": " ".join(["python", f"benchmarks/{name}.py", *args]), "status": status, "rc": rc,
            "wall_s": round(wall, 1), "timeout_s": timeout_s, "loadavg_before": [round(x, 2) for x in load0],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()], "output_tail": tail}


# ---------------------------------------------------------------------------------------------- summarising

def _load(name: str) -> dict[str, Any] | None:
    f = RESULTS / f"{name}.json"
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(d, dict) and k in d:
            d = d[k]
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


def _fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{nd}g}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{round(v, nd)}"
    return str(v)


Headline = tuple[str, str, Any, str]  # (benchmark, figure, value, note)
Goal = tuple[str, Any, str, bool | None, str]  # (goal, measured, target, met (None: not measured), note)


def headlines_and_goals() -> tuple[list[Headline], list[Goal]]:
    """Headline figures and goal verdicts from whatever results exist."""
    h: list[Headline] = []
    g: list[Goal] = []

    # GRPO versus TRL
    r = _load("grpo_vs_trl")
    if r:
        ratio = _get(r, "ratios", "step_time_ours_over_trl")
        h.append(("grpo_vs_trl", "time per step, ours / TRL", ratio, f"TRL {_get(r, 'trl_version')}"))
        h.append(("grpo_vs_trl", "time per generated token, ours / TRL", _get(r, "ratios", "time_per_token_ours_over_trl"), ""))
        h.append(("grpo_vs_trl", "tokens generated per step, ours / TRL", _get(r, "ratios", "tokens_ours_over_trl"), ""))
        h.append(("grpo_vs_trl", "peak RSS during steps, ours / TRL", _get(r, "ratios", "peak_rss_ours_over_trl"), ""))
        agree = _get(r, "correctness", "agree")
        h.append(("grpo_vs_trl", "loss |ours - TRL|", _get(r, "correctness", "loss_abs_diff"), ""))
        h.append(("grpo_vs_trl", "gradient rel. L2 error", _get(r, "correctness", "grad_rel_l2"), ""))
        fd_o = _get(r, "correctness", "finite_differences", "ours_max_rel_err")
        fd_t = _get(r, "correctness", "finite_differences", "trl_max_rel_err")
        h.append(("grpo_vs_trl", "directional derivative vs finite differences, max rel. err: ours / TRL",
                  f"{_fmt(fd_o)} / {_fmt(fd_t)}", "float64 central differences of the common loss"))
        met = None if ratio is None or agree is None else bool(ratio <= 0.8 and agree)
        g.append(("GRPO step <= 0.8x TRL's time, equal losses and gradients",
                  f"{_fmt(ratio)}x, agree={_fmt(agree)}", "<= 0.8x and agree", met,
                  "load " + _fmt(_get(r, "machine", "loadavg_before"))))
    else:
        g.append(("GRPO step <= 0.8x TRL's time, equal losses and gradients", None, "<= 0.8x and agree", None, ""))

    # Orchestration
    r = _load("orchestration")
    if r:
        frac = _get(r, "repro", "orchestration_fraction")
        noop = _get(r, "noop_repro_s", "median")
        mode = _get(r, "repro", "mode")
        runner = _get(r, "repro", "runner")
        mode = f"{mode}, {runner}" if mode and runner else mode
        h.append(("orchestration", f"repro overhead / repro wall ({mode or 'repro not run'})", frac, ""))
        h.append(("orchestration", "no-op dvc repro (s)", noop, ""))
        h.append(("orchestration", "python start-up / import flows.data (s)",
                  f"{_fmt(_get(r, 'python_startup_s'))} / {_fmt(_get(r, 'import_flows_data_s'))}", ""))
        h.append(("orchestration", "prefect server start until healthy (s)", _get(r, "server_start_s"), ""))
        for k, v in (_get(r, "flow_startup") or {}).items():
            h.append(("orchestration", f"flow start-up to first stage line, {k} (s)", _get(v, "median"), ""))
        full = _load("pipeline_check")  # .ci/check_pipeline.py's run of the full default pipeline, when recorded
        if full and full.get("pipeline_wall_s") and not (mode or "").startswith("full default"):
            ffrac = round(full["orchestration_s"] / full["pipeline_wall_s"], 4)
            h.append(("orchestration", "full default pipeline: orchestration s / pipeline s (.ci/check_pipeline.py)",
                      f"{full['orchestration_s']} / {full['pipeline_wall_s']}", full.get("measured_at", "")))
            g.append(("Orchestration < 10% of a full default dvc repro", ffrac, "< 0.10", ffrac < 0.10,
                      "python -m flows.pipeline (DVC's reproduce in-process), pipeline_check.json"))
        else:
            g.append(("Orchestration < 10% of a full default dvc repro", frac, "< 0.10",
                      None if frac is None else frac < 0.10,
                      "" if mode is None or mode.startswith("full default")
                      else f"measured on the {mode} repro, not the full default"))
        g.append(("No-op dvc repro < 5 s", noop, "< 5 s", None if noop is None else noop < 5.0, ""))
    else:
        g.append(("Orchestration < 10% of a full default dvc repro", None, "< 0.10", None, ""))
        g.append(("No-op dvc repro < 5 s", None, "< 5 s", None, ""))

    # Training MFU
    r = _load("training")
    if r:
        peaks = _get(r, "matmul_peak_tflops") or {}
        rows = {x.get("precision"): x for x in (_get(r, "rows") or []) if isinstance(x, dict)}
        for prec, row in rows.items():
            h.append(("training", f"MFU vs measured {prec} peak ({_fmt(peaks.get(prec))} TFLOP/s)",
                      row.get("mfu_vs_own_peak"), f"{row.get('tokens_per_s')} tok/s"))
        fast = max(rows.values(), key=lambda x: x.get("tokens_per_s") or 0) if rows else None
        measured = bool(rows) and all(p in peaks for p in rows)
        g.append(("Training MFU reported against the measured peak (bf16 where faster)",
                  None if fast is None else f"{fast.get('precision')} fastest, MFU {_fmt(fast.get('mfu_vs_own_peak'))}",
                  "reported", measured if rows else None, ""))
    else:
        g.append(("Training MFU reported against the measured peak (bf16 where faster)", None, "reported", None, ""))

    # Corpus scoring vs bare fastText, linear scaling in pages (scaling.py measures both; corpus.py may too)
    s = _load("scaling")
    c = _load("corpus")
    ft_scaling = _get(s, "corpus", "score_over_bare_fasttext", "median") if s else None
    ft_corpus = _get(c, "score_over_bare_ratio", "prenormalised") if c else None
    ft_ratio, ft_src = (ft_corpus, "corpus.json: score(normalized=True) / bare predict, what the stage runs") \
        if ft_corpus is not None else (ft_scaling, "scaling.json: the stage's score_shard task / bare load + predict")
    if c:
        for k, v in _flat_ratios(c):
            h.append(("corpus", k, v, ""))
    if s:
        h.append(("scaling", "corpus score_shard task / bare fastText load + predict (largest size)", ft_scaling, ""))
        h.append(("scaling", "corpus scoring time ~ pages^k, k =", _get(s, "corpus", "loglog_slope"), ""))
        for axis in ("group_size", "max_new_tokens", "questions_per_step"):
            h.append(("scaling", f"GRPO step time ~ {axis}^k, k =", _get(s, "grpo", axis, "loglog_slope"), ""))
    g.append(("Corpus scoring within 1.2x of bare fastText", ft_ratio, "<= 1.2x",
              None if ft_ratio is None else ft_ratio <= 1.2, ft_src))
    slope = _get(s, "corpus", "loglog_slope") if s else None
    r2 = _get(s, "corpus", "linear_fit", "r2") if s else None
    if s:
        h.append(("scaling", "corpus scoring linear fit: us/page, fixed s, R^2",
                  f"{_fmt(_get(s, 'corpus', 'linear_fit', 'us_per_page'))}, {_fmt(_get(s, 'corpus', 'linear_fit', 'fixed_s'))}, "
                  f"{_fmt(r2, 5)}", ""))
    g.append(("Linear scaling in pages", None if slope is None else f"R^2 {_fmt(r2, 4)}, log-log slope {_fmt(slope)}",
              "R^2 >= 0.98 of t = a + b*pages and log-log slope <= 1.1",
              None if slope is None or r2 is None else bool(r2 >= 0.98 and slope <= 1.1), "scaling.json"))

    # Generation, sandbox, answers, grpo_step: figures without a goal
    r = _load("generation")
    if r:
        rows = {x.get("engine"): x for x in (_get(r, "results") or []) if isinstance(x, dict)}
        plain = next((v for k, v in rows.items() if "model.generate" in str(k)), None)
        for k, v in rows.items():
            if plain is not None and v is not plain and plain.get("tokens_per_s"):
                h.append(("generation", f"{k} tokens/s / model.generate", v.get("tokens_per_s", 0) / plain["tokens_per_s"], ""))
        if plain is not None:
            h.append(("generation", "model.generate tokens/s", plain.get("tokens_per_s"), ""))
    r = _load("grpo_step")
    if r:
        step = _get(r, "grpo", "seconds", "step_s", "median") or _get(r, "seconds", "step_s", "median")  # new, old
        h.append(("grpo_step", "step seconds (median)", step,
                  f"{_get(r, 'questions_per_step')}x{_get(r, 'group_size')}x{_get(r, 'max_new_tokens')} tokens"))
    r = _load("sandbox")
    if r:
        for row in _get(r, "results") or []:
            if isinstance(row, dict) and row.get("programs_per_s") is not None:
                h.append(("sandbox", f"{row.get('program')} {row.get('mode')} programs/s", row.get("programs_per_s"), ""))
    r = _load("answers")
    if r:
        h.append(("answers", "numeric checks/s", _get(r, "numeric_calls_per_s"), ""))
        h.append(("answers", "symbolic checks/s", _get(r, "symbolic_calls_per_s"), ""))
    return h, g


def _flat_ratios(d: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every numeric leaf whose key path mentions a ratio / speed-up (schemas of other scripts may change)."""
    out: list[tuple[str, float]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _flat_ratios(v, f"{prefix}{k}.")
    elif isinstance(d, list):
        for i, v in enumerate(d):
            name = v.get("name") or v.get("engine") or v.get("method") or i if isinstance(v, dict) else i
            out += _flat_ratios(v, f"{prefix}{name}.")
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        key = prefix.rstrip(".")
        if any(w in key.lower() for w in ("ratio", "speedup", "over_", "_vs_", "pages_per_s")):
            out.append((key, float(d)))
    return out


def write_summary(records: list[dict[str, Any]]) -> tuple[Path, Path]:
    """SUMMARY.md and summary.json from the results on disk and this run's script records."""
    heads, goals = headlines_and_goals()
    verdict = {True: "met", False: "MISSED", None: "not measured"}
    md = ["# Benchmark summary", "",
          f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}. Timings on a shared machine are noisy; "
          "each result JSON records its own settings and load.", "",
          "## Goals", "", "| goal | measured | target | verdict | note |", "| --- | --- | --- | --- | --- |"]
    for name, meas, target, met, note in goals:
        md.append(f"| {name} | {_fmt(meas)} | {target} | {verdict[met]} | {note} |")
    md += ["", "## Headline figures", "", "| benchmark | figure | value | note |", "| --- | --- | --- | --- |"]
    for bench, fig, val, note in heads:
        md.append(f"| {bench} | {fig} | {_fmt(val)} | {note} |")
    if records:
        md += ["", "## Scripts run", "", "| script | status | wall s | load before | load after | command |",
               "| --- | --- | --- | --- | --- | --- |"]
        for rec in records:
            md.append(f"| {rec['script']} | {rec['status']} | {rec['wall_s']} | {rec['loadavg_before'][0]} | "
                      f"{rec['loadavg_after'][0]} | `{rec['cmd']}` |")
    results = sorted(p.name for p in RESULTS.glob("*.json") if p.name != "summary.json")
    md += ["", "Result files: " + ", ".join(results), ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    md_path, js_path = RESULTS / "SUMMARY.md", RESULTS / "summary.json"
    md_path.write_text("\n".join(md))
    js = {"generated_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": {"arch": platform.machine(), "cpus": os.cpu_count(),
          "loadavg": list(os.getloadavg())},
          "goals": [{"goal": n, "measured": m, "target": t, "verdict": verdict[v], "note": no} for n, m, t, v, no in goals],
          "headlines": [{"benchmark": b, "figure": f, "value": v, "note": no} for b, f, v, no in heads],
          "scripts": records, "result_files": results}
    js_path.write_text(json.dumps(js, indent=2, default=str) + "\n")
    return md_path, js_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small settings for every script (smoke run)")
    ap.add_argument("--only", default="", help="comma-separated script names to run (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated script names not to run")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per script (default 3600; 900 with --quick)")
    ap.add_argument("--nice", type=int, default=0, help="run the scripts with this niceness increment")
    ap.add_argument("--summary-only", action="store_true", help="only re-summarise the result files")
    args = ap.parse_args(argv)
    names = discover()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names)}", file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted]
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    names = [n for n in names if n not in skip]
    timeout = args.timeout or (900.0 if args.quick else 3600.0)
    records: list[dict[str, Any]] = []
    if not args.summary_only:
        for name in names:
            extra = quick_args(name) if args.quick else []
            print(f"== {name} {' '.join(extra)} (timeout {timeout:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
            rec = run_script(name, extra, timeout, args.nice)
            records.append(rec)
            print(f"   {rec['status']} rc={rec['rc']} in {rec['wall_s']} s", flush=True)
            if rec["status"] != "ok":
                for line in rec["output_tail"][-5:]:
                    print(f"   | {line}")
    md, js = write_summary(records)
    print(md.read_text())
    print(f"wrote {md.relative_to(ROOT)} and {js.relative_to(ROOT)}")
    failed = [r["script"] for r in records if r["status"] != "ok"]
    if failed:
        print(f"{len(failed)} script(s) did not finish cleanly: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

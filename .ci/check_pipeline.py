"""CI check of the full default pipeline, run in a temporary clone of the current commit.

1. `python -m flows.pipeline` (the README's main job) from a clean state (`--runner dvc`: plain `dvc repro`, which
   shares the project's Prefect API server the same way, flows/_servers.py; the stage server is the pipeline's);
2. every metrics file declared in dvc.yaml exists (`dvc metrics show --json` reports none missing);
3. no stage exceeds 1.5x its budget (each stage's own `wall_s` in data/timings/<stage>.json, which every stage writes
   beside its outputs: no DVC output, so the metrics are the same bytes on every run);
4. a second `dvc repro` does nothing, in under 5 s;
(every time budget is scaled by the machine's measured speed on the day: calibrate(), speed_factor())
5. held-out greedy CoT accuracy RL > SFT > pretrained (when the evaluate metrics are there);
6. for the whole pipeline: total within 1.5x its budget, orchestration within 1.5x its budget;
7. the run's report page (data/report/index.html) renders in headless chromium: every image loaded, no console
   errors, nothing fetched (stages/report/browser.py); its screenshot goes beside $CHECK_OUT (*.report.png).
Prints a summary table and writes it as JSON to $CHECK_OUT (default: pipeline-check.json here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Issue 2's budgets, three revised with measured reasons (idle 2-core machine, 2026-11-30):
# - sft 150 -> 180: the copy phase transition needs ~250 steps (100 steps: loss plateau 0.5, held-out
#   greedy 9%; 250 steps: loss 0.14, 40%); 250 steps of 8 x 512 tokens take 162 s at 6.6k tokens/s.
# - evaluate 120 -> 160 (five models): 500 held-out problems per model (300 give +-2.5 points), greedy CoT
#   ~10 s per trained model; PoT + TIR + n = 8 sampling on 100 problems ~45 s each for SFT and RL.
# - orchestration 60 -> 120 -> 70: twelve stage processes, each paying ~4.5 s of torch + transformers + Prefect
#   imports, ~1-2 s of Prefect flow-run bookkeeping and ~2.5 s of DVC hashing and lock update, plus the
#   Prefect API server's start (~15 s with DB migrations on a fresh PREFECT_HOME); measured 134 s in all.
#   Then the stage server (flows/_stage_server.py) paid the imports once per run: reduced pipeline of
#   benchmarks/orchestration.py, 128.1 s -> 45.6 s of overhead; 70 s is 10% of a ~700 s full run.
# - report 30: reads the metrics and curves, draws nine matplotlib figures (measured 2-4 s; 30 s leaves room).
# - testsets 10: the tiny default's one test set (the generated problems, converted as they are: ~0.2 s).
# - reward_model 60 -> 110 (2026-12-03): 9216a8f (12-01) grew the tiny default's RM data from 48 x 4 to 256 x 8
#   samples (2048 labelled samples, 1 epoch of 1536) and left the budget; measured since on the idle AMX machine
#   96-100 s (benchmarks/results/load.json: sampling 33 s + training 63 s at the section's 1 thread), in CI 116 s.
# - pretrain 180 -> 240, sft 180 -> 240, the whole run 900 -> 1100 (2026-12-03): measured on the idle AMX machine
#   pretrain 180-246 s and sft 178-277 s over five versions (benchmarks/results/load.json), whole runs 844-1402 s;
#   the CI run of 44c8a03 took pretrain 295 s, sft 283 s, in all 1306 s. Per token pretraining is 13% slower than
#   7d92130's (5662 vs 6400 tokens/s, 60 steps each, same machine and hour); not from the LM head's chunk size
#   (5696 tokens/s unchunked); the cause is not pinned down.
#   Those 12-03 figures came from a slow day of the machine (see REFERENCE_S below): on 2026-12-04 the same code took
#   pretrain 112 s (11634 tokens/s), sft 125 s, reward_model 63 s. With the speed factor the 12-03 raises are ~2x
#   loose on a fast day; they stay until CI has shown the factor on a slow day (then 180 / 180 / 85 / 900 fit).
BUDGETS_S = {"data": 20, "testsets": 10, "corpus": 90, "base_model": 30, "pretrain": 240, "sft": 240,
             "reward_model": 110, "grpo": 240, "evaluate": 160, "report": 30}
SLACK = 1.5
# Every stage's budget is enforced with 1.5x slack (CI machines are noisy), and so are the whole
# pipeline's budget and orchestration's budget. --no-enforce-learning reports the learning check
# (RL > SFT > pretrained on held-out greedy CoT accuracy) instead of failing on it.
ENFORCED = set(BUDGETS_S)
# The budgets were measured on CPUs with AMX (bf16 matmuls on AMX tiles). On a CPU without AMX the same run is ~2x
# slower: measured 2026-12-02 on an idle 2-core AVX512_BF16 machine without AMX, 1160 s in all (pretrain 212 s, sft
# 239 s, reward_model 111 s, evaluate 308 s; 1286 s before `auto` used bf16 there) against 563 s on the AMX machine.
# There every budget (stages and the whole run, not orchestration) is scaled by NO_AMX_FACTOR, and the table says so.
NO_AMX_FACTOR = 2.0
# The machine's speed on the day. Machines of the same kind (2 cores, AMX) have run the same code ~2x apart on
# different days: pretraining 5662 tokens/s (2026-12-03) against ~12000 (2026-12-04, idle both times), and CI's run
# of 4a39a21 took 126.8 s of orchestration and a 5.3 s no-op `dvc repro` where 12-01's took 44.8 s and 1.8 s. So
# before and after the pipeline the check times a fixed workload (calibrate(): pure Python, and fp32 torch matmuls
# on 2 threads, best of 3 each), and every budget (stages, the whole run, orchestration, the no-op) is multiplied
# by how much slower than REFERENCE_S the slower part ran, never by less than 1: a slow machine is not read as a
# slow pipeline, a slow pipeline on a fast machine still fails, and the table says which factor was used.
# REFERENCE_S: the idle 2-core AMX machine of 2026-12-04 (median of 5 calibrate() runs; their spread 0.259-0.284 s
# and 0.381-0.408 s), the day that machine pretrained at ~12000 tokens/s and ran a no-op `dvc repro` in 1.3 s.
REFERENCE_S = {"python": 0.266, "torch": 0.402}
ORCHESTRATION_BUDGET_S = 70
PIPELINE_BUDGET_S = 1100
NOOP_BUDGET_S = 5.0
REPO = Path(__file__).resolve().parent.parent


def hardware_factor(metrics_dir: Path) -> float:
    """NO_AMX_FACTOR where the run's training stages say they ran on a CPU without AMX (their ``hardware`` record),
    else 1 (an AMX CPU, a GPU, or no record)."""
    try:
        hw = json.loads((metrics_dir / "pretrain.json").read_text()).get("hardware") or {}
    except (OSError, ValueError):
        return 1.0
    device = str(hw.get("device", ""))
    factor = NO_AMX_FACTOR if device.startswith("cpu") and "AMX" not in device else 1.0
    print(f"budgets x {factor:g}: {device or 'no hardware record'}")
    return factor


def calibrate(repeats: int = 3) -> dict[str, float]:
    """Seconds this machine takes now for a fixed workload, best of ``repeats``: ``python``, interpreter-bound work
    (what DVC's checks and the stages' bookkeeping do), and ``torch``, fp32 matmuls of the tiny model's sizes on
    2 threads (fp32, not bf16: the AMX difference is NO_AMX_FACTOR's)."""
    import torch

    def python_work() -> None:
        d: dict[str, int] = {}
        for i in range(800_000):
            d[f"k{i % 5000}"] = d.get(f"k{i % 5000}", 0) + len(str(i * 7))
        json.dumps(sorted(d.items()))

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(64 * 16, 256, generator=g), torch.randn(256, 1024, generator=g)

        def torch_work() -> None:
            for _ in range(120):
                (a @ b).relu_() @ b.T

        out = {}
        for name, work in (("python", python_work), ("torch", torch_work)):
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                work()
                best = min(best, time.perf_counter() - t0)
            out[name] = round(best, 4)
        return out
    finally:
        torch.set_num_threads(threads)


def speed_factor(measured: list[dict[str, float]], reference: dict[str, float] = REFERENCE_S) -> float:
    """How much slower than ``reference`` this machine ran the calibration: the largest ratio over its parts and
    over the runs in ``measured`` (before and after the pipeline), never below 1; 1 without a reference."""
    ratios = [m[k] / reference[k] for m in measured for k in reference if reference.get(k) and k in m]
    return round(max([1.0, *ratios]), 2)


def sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    print(proc.stdout[-6000:], flush=True)
    if proc.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)} (exit {proc.returncode})")
    return wall, proc.stdout


def greedy_accuracy(metrics_dir: Path) -> dict[str, float]:
    """{model: greedy CoT accuracy on the held-out problems} from data/metrics/evaluate_<model>.json."""
    out = {}
    for f in sorted(metrics_dir.glob("evaluate_*.json")):
        m = json.loads(f.read_text())
        acc = m.get("generated", {}).get("cot", {}).get("greedy", {}).get("acc")
        if acc is not None:
            out[f.stem.removeprefix("evaluate_")] = acc
    return out


def check_report(clone: Path, env: dict[str, str]) -> str:
    """Render the clone's data/report/index.html in headless chromium; one line: what it saw, or FAILED: why."""
    shot = Path(os.environ.get("CHECK_OUT", "pipeline-check.json")).resolve().with_suffix(".report.png")
    proc = subprocess.run([sys.executable, "-c", "from stages.report.browser import find_browser as f; "
                           "import selenium; assert f()"], cwd=clone, env=env, capture_output=True)
    if proc.returncode != 0:
        why = "chromium, chromedriver or selenium missing (bash .ci/setup installs them)"
        return f"FAILED: {why}" if os.environ.get("REQUIRE_BROWSER") == "1" else f"skipped: {why}"
    proc = subprocess.run([sys.executable, "-m", "stages.report.browser", "data/report/index.html",
                           "--screenshot", str(shot)], cwd=clone, env=env, capture_output=True, text=True)
    out = " ".join((proc.stdout + proc.stderr).split())
    return out if proc.returncode == 0 else f"FAILED: report page check: {out[-1500:]}"


def main() -> int:
    # stages to run: those named on the command line (CI names the stages whose issues are closed),
    # else every stage of dvc.yaml
    args = sys.argv[1:]
    runner = "pipeline"
    if "--runner" in args:
        i = args.index("--runner")
        runner = args[i + 1]
        del args[i:i + 2]
        if runner not in ("pipeline", "dvc"):
            sys.exit("--runner: pipeline or dvc")
    targets = [a for a in args if not a.startswith("--")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PREFECT_API_URL", "PREFECT_HOME")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the clone imports its own code (cwd first)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pipeline-check-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        cmd = [sys.executable, "-m", "flows.pipeline", *targets] if runner == "pipeline" else ["dvc", "repro", *targets]
        calibration = [calibrate()]
        load_before = [round(x, 2) for x in os.getloadavg()]
        total, _ = sh(cmd, clone, env)
        load_after = [round(x, 2) for x in os.getloadavg()]
        calibration.append(calibrate())
        speed = speed_factor(calibration)
        print(f"machine speed: calibration {calibration} s against {REFERENCE_S} s on the reference machine: "
              f"budgets x {speed:g}")
        _, out = sh(["dvc", "metrics", "show", "--json", *(f"data/metrics/{t}.json" for t in targets)], clone, env)
        shown = json.loads(out[out.index("{"):]) if "{" in out else {}
        for _rev, body in shown.items():
            for path, data in (body.get("data") or {}).items():
                if "error" in data:
                    failures.append(f"metrics file {path} missing or unreadable")
        metrics_dir = clone / "data" / "metrics"
        walls: dict[str, float] = {}
        for f in sorted((clone / "data" / "timings").glob("*.json")):
            stage = f.stem.split("@")[0].split("-")[0]
            stage = next((s for s in ("evaluate", "testsets", "ingest") if stage.startswith(s)), stage)  # foreach
            walls[stage] = walls.get(stage, 0.0) + float(json.loads(f.read_text()).get("wall_s", 0.0))
        factor = hardware_factor(metrics_dir) * speed
        rows = []
        for stage, wall in walls.items():
            budget = BUDGETS_S.get(stage) and BUDGETS_S[stage] * factor
            ok = budget is None or wall <= SLACK * budget
            rows.append({"stage": stage, "wall_s": round(wall, 1), "budget_s": budget, "ok": ok})
            if not ok and stage in ENFORCED:
                failures.append(f"stage {stage} took {wall:.1f} s > {SLACK} x budget {budget} s")
        orchestration = total - sum(walls.values())
        if not targets:  # the whole pipeline: its budget and its orchestration share
            if total > SLACK * PIPELINE_BUDGET_S * factor:
                failures.append(f"pipeline took {total:.1f} s > {SLACK} x budget {PIPELINE_BUDGET_S * factor} s")
            if orchestration > SLACK * ORCHESTRATION_BUDGET_S * speed:
                failures.append(f"orchestration took {orchestration:.1f} s > {SLACK} x budget "
                                f"{ORCHESTRATION_BUDGET_S * speed:g} s")
        # the no-op: best of three, all three recorded. The first run after the pipeline is the slow one
        # (measured on a 2-core non-AMX machine: 3.7 s, then 2.1 s and 2.2 s; CI once saw 5.4 s beside the
        # previous run's exiting processes), so one sample measured the machine's state more than DVC's check.
        noops = []
        for _ in range(3):
            wall, out = sh(["dvc", "repro", *targets], clone, env)
            noops.append(round(wall, 2))
            if "didn't change" not in out and "up to date" not in out.lower():
                failures.append("second dvc repro was not a no-op")
                break
        noop = min(noops)
        if noop > NOOP_BUDGET_S * speed:
            failures.append(f"no-op dvc repro took {noop:.1f} s > {NOOP_BUDGET_S * speed:g} s (best of {noops})")
        report_check = check_report(clone, env) if not targets or "report" in targets else "not run"
        if report_check.startswith("FAILED"):
            failures.append(report_check)
        acc = greedy_accuracy(metrics_dir)
        learning = []
        if {"grpo", "sft", "pretrain"} <= set(acc):
            if not acc["grpo"] > acc["sft"]:
                learning.append(f"RL greedy accuracy {acc['grpo']:.3f} <= SFT {acc['sft']:.3f}")
            if not acc["sft"] > acc["pretrain"]:
                learning.append(f"SFT greedy accuracy {acc['sft']:.3f} <= pretrained {acc['pretrain']:.3f}")
        if "--no-enforce-learning" not in sys.argv:
            failures.extend(learning)
        elif learning:
            print("learning check (reported, not yet enforced): " + "; ".join(learning))
        summary = {"runner": runner, "loadavg_before": load_before, "loadavg_after": load_after,
                   "pipeline_wall_s": round(total, 1), "orchestration_s": round(orchestration, 1),
                   "orchestration_fraction": round(orchestration / total, 4),
                   "orchestration_budget_s": ORCHESTRATION_BUDGET_S, "calibration_s": calibration,
                   "calibration_reference_s": REFERENCE_S, "speed_factor": speed, "budget_factor": factor,
                   "noop_repro_s": round(noop, 2), "noop_repro_runs_s": noops,
                   "stages": rows, "greedy_accuracy": acc, "report_page": report_check, "failures": failures}
    print(f"{'stage':<14}{'wall_s':>8}{'budget':>8}  ok")
    for r in rows:
        print(f"{r['stage']:<14}{r['wall_s']:>8}{r['budget_s'] or '-':>8}  {r['ok']}")
    print(f"{runner}: pipeline {total:.1f} s, orchestration {orchestration:.1f} s ({100 * orchestration / total:.1f}%), "
          f"no-op repro {noop:.2f} s (best of {noops}), accuracy {acc}, load average {load_before} -> {load_after}")
    print(f"report page: {report_check}")
    Path(os.environ.get("CHECK_OUT", "pipeline-check.json")).write_text(json.dumps(summary, indent=2) + "\n")
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    print("pipeline check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CI check of the full default pipeline, run in a temporary clone of the current commit.

1. `python -m flows.pipeline` (the README's main job) from a clean state (`--runner dvc`: plain `dvc repro`);
2. every metrics file declared in dvc.yaml exists (`dvc metrics show --json` reports none missing);
3. a second `dvc repro` does nothing (three times; each one's seconds recorded);
4. held-out greedy CoT accuracy RL > SFT > pretrained (when the evaluate metrics are there);
5. the run's report page (data/report/index.html) renders in headless chromium: every image loaded, no console
   errors, nothing fetched (stages/report/browser.py); its screenshot goes beside $CHECK_OUT (*.report.png).
Pass / fail is on results only. The time of every stage (its own `wall_s` in data/timings/<stage>.json), of the whole
run, of orchestration (the rest) and of the no-ops is measured and recorded with the machine and its load, never
judged against a budget: a slow machine is not a broken change (CI's speed comparison with the previous commit is a
ratio measured in the same run: tests/flows/test_dvc_determinism.py). Prints a summary table and writes it as JSON
to $CHECK_OUT (default: pipeline-check.json here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sh(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    print(proc.stdout[-6000:], flush=True)
    if proc.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)} (exit {proc.returncode})")
    return wall, proc.stdout


def held_out(metrics_dir: Path) -> dict[str, dict[str, float]]:
    """{model: {"cot greedy", "cot pass@8", "cot maj@8", "pot greedy", "tir greedy": accuracy}} on the held-out
    generated problems, from data/metrics/evaluate_<model>.json (the keys a model's evaluation has)."""
    out = {}
    for f in sorted(metrics_dir.glob("evaluate_*.json")):
        gen = json.loads(f.read_text()).get("generated", {})
        got = {f"{mode} greedy": gen[mode]["greedy"]["acc"] for mode in ("cot", "pot", "tir")
               if "acc" in gen.get(mode, {}).get("greedy", {})}
        got |= {f"cot {k}": v for k, v in gen.get("cot", {}).get("sample", {}).items() if k in ("pass@8", "maj@8")}
        if got:
            out[f.stem.removeprefix("evaluate_")] = got
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
        load_before = [round(x, 2) for x in os.getloadavg()]
        total, _ = sh(cmd, clone, env)
        load_after = [round(x, 2) for x in os.getloadavg()]
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
        rows = [{"stage": stage, "wall_s": round(wall, 1)} for stage, wall in walls.items()]
        orchestration = total - sum(walls.values())
        noops = []  # three no-ops, each one's seconds recorded (the first after a run is the slow one)
        for _ in range(3):
            wall, out = sh(["dvc", "repro", *targets], clone, env)
            noops.append(round(wall, 2))
            if "didn't change" not in out and "up to date" not in out.lower():
                failures.append("second dvc repro was not a no-op")
                break
        noop = min(noops)
        report_check = check_report(clone, env) if not targets or "report" in targets else "not run"
        if report_check.startswith("FAILED"):
            failures.append(report_check)
        evaluated = held_out(metrics_dir)
        acc = {m: e["cot greedy"] for m, e in evaluated.items() if "cot greedy" in e}
        hardware = json.loads((metrics_dir / "sft.json").read_text()).get("hardware", {}) \
            if (metrics_dir / "sft.json").is_file() else {}
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
                   "noop_repro_s": round(noop, 2), "noop_repro_runs_s": noops,
                   "stages": rows, "greedy_accuracy": acc, "held_out": evaluated, "report_page": report_check,
                   "failures": failures,
                   "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, text=True,
                                            capture_output=True).stdout.strip(),
                   "measured_at": time.strftime("%Y-%m-%dT%H:%M"), "hardware": hardware}
    print(f"{'stage':<14}{'wall_s':>8}")
    for r in rows:
        print(f"{r['stage']:<14}{r['wall_s']:>8}")
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

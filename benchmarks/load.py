"""The default pipeline idle and beside one busy process, per stage, for two versions of the code; and whether two
runs of the same code give the same bytes (issue 29).

Each run clones a git revision into a temporary directory and runs the README's main job there
(``python -m flows.pipeline``, the committed params.yaml), optionally beside one ``python3 -c 'while True: pass'``.
It records the whole run's wall time, each stage's wall time (the pipeline's summary table), ``uptime`` before and
after, the held-out greedy accuracies (data/metrics/evaluate_*.json) and the md5 of every file under data/ but
data/timings/ (the run's own measurements), and appends the run to the results file, so that runs can be made one
at a time (each under ``flock /work/notes/heavy.lock``) and interleaved (A idle, B idle, A busy, B busy):

    python benchmarks/load.py run A=<rev> idle          # one run; appends to benchmarks/results/load.json
    python benchmarks/load.py run B=<rev> busy
    python benchmarks/load.py run A=HEAD idle --env DSM_THREADS=fixed   # the same code without the thread policy
    python benchmarks/load.py report                    # the wall-time table and the byte-identity table

``report`` prints, per stage, the wall time of every (code, load) pair and busy / idle ratios, the held-out
accuracies, and for every pair of runs of the same revision the outputs that differ (with the JSON keys that
differ, for .json files), stage by stage.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "load.json"
sys.path.insert(0, str(ROOT))

from benchmarks._tiny import machine, pipeline_env  # noqa: E402
from stages.core.io import output_hashes  # noqa: E402


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _json_files(clone: Path) -> dict[str, Any]:
    """The small JSON results (metrics, details, reports, models' pipeline.json), to explain a difference."""
    out = {}
    for pat in ("data/metrics/*.json", "data/details/*.json", "data/models/*/pipeline.json", "data/reports/*/*.json"):
        for f in sorted(clone.glob(pat)):
            try:
                out[f.relative_to(clone).as_posix()] = json.loads(f.read_text())
            except (OSError, ValueError):
                pass
    return out


def _stage_rows(stdout: str) -> dict[str, dict[str, Any]]:
    """{stage: {status, wall_s}} from the pipeline's summary table."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^(\S+)\s+(ran|restored|skipped|failed)\s+([\d.]+)\s*$", line)
        if m:
            rows[m.group(1)] = {"status": m.group(2), "wall_s": float(m.group(3))}
    return rows


def run(code: str, load: str, out: Path, keep: Path | None, extra_env: list[str] | None = None) -> dict[str, Any]:
    label, _, rev = code.partition("=")
    rev = rev or "HEAD"
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="load-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", sha], cwd=clone, check=True)
        env = pipeline_env()
        env.update(dict(kv.split("=", 1) for kv in extra_env or []))  # e.g. DSM_THREADS=fixed: the policy off
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy" else None
        up0 = _uptime()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "flows.pipeline"], cwd=clone, env=env, capture_output=True,
                                  text=True)
        finally:
            wall = time.perf_counter() - t0
            if hog is not None:
                hog.kill()
                hog.wait()
        up1 = _uptime()
        acc = {}
        for f in sorted((clone / "data" / "metrics").glob("evaluate_*.json")):
            g = json.loads(f.read_text()).get("generated", {}).get("cot", {}).get("greedy", {}).get("acc")
            acc[f.stem.removeprefix("evaluate_")] = g
        result = {"code": label, "rev": sha[:10], "env": extra_env or [], "load": load, "machine": machine(),
                  "rc": proc.returncode, "wall_s": round(wall, 1),
                  "uptime_before": up0, "uptime_after": up1, "stages": _stage_rows(proc.stdout),
                  "heldout_greedy_cot": acc, "files": output_hashes(clone) if proc.returncode == 0 else {},
                  "json": _json_files(clone) if proc.returncode == 0 else {},
                  "log_tail": "" if proc.returncode == 0 else (proc.stdout + proc.stderr)[-3000:]}
        if keep is not None:
            subprocess.run(["cp", "-a", str(clone), str(keep)], check=True)
    runs = json.loads(out.read_text())["runs"] if out.is_file() else []
    runs.append(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(f"{label} ({sha[:10]}) {load}: rc {proc.returncode}, {wall:.1f} s; {up0} -> {up1}; accuracy {acc}")
    return result


def stage_of(path: str, known: list[Any]) -> str:
    """The dvc.yaml stage whose output (out, metric or plot of :func:`flows._dvc.stages`, foreach stages expanded
    with this checkout's params) holds ``path``; ``dvc.lock``, or ``other`` for anything else."""
    for st in known:
        if any(path == o or path.startswith(o.rstrip("/") + "/") for o in st.outs):
            return st.name
    return "dvc.lock" if path == "dvc.lock" else "other"


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _diff_keys(x, y, f"{prefix}{i}.")
        return out
    return [] if a == b else [f"{prefix[:-1]}: {a!r} vs {b!r}"[:160]]


def report(out: Path) -> dict[str, Any]:
    runs = [r for r in json.loads(out.read_text())["runs"] if r["rc"] == 0]
    keys = sorted({(r["code"], r["load"]) for r in runs})
    stages = list(dict.fromkeys(s for r in runs for s in r["stages"]))

    def walls(code: str, load: str, stage: str | None) -> list[float]:
        return [r["stages"][stage]["wall_s"] if stage else r["wall_s"] for r in runs
                if r["code"] == code and r["load"] == load and (stage is None or stage in r["stages"])]

    def med(xs: list[float]) -> float | None:
        return sorted(xs)[len(xs) // 2] if xs else None

    head = ["stage"] + [f"{c} {ld}" for c, ld in keys] + [f"{c} busy/idle" for c in sorted({c for c, _ in keys})]
    table = []
    for stage in [*stages, None]:
        row = [stage or "whole run"]
        for c, ld in keys:
            m = med(walls(c, ld, stage))
            row.append("-" if m is None else f"{m:.1f}")
        for c in sorted({c for c, _ in keys}):
            i, b = med(walls(c, "idle", stage)), med(walls(c, "busy", stage))
            row.append(f"{b / i:.2f}" if i and b else "-")
        table.append(row)
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for row in table:
        print("| " + " | ".join(row) + " |")
    print("\nheld-out greedy CoT accuracy:")
    for r in runs:
        print(f"  {r['code']} {r['load']} ({r['rev']}, {r['wall_s']} s; {r['uptime_before'].split('load average:')[-1]}"
              f" -> {r['uptime_after'].split('load average:')[-1]}): {r['heldout_greedy_cot']}")
    identity = []
    from flows._dvc import stages

    known = stages(ROOT)
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if a["rev"] != b["rev"]:
                continue
            paths = sorted(set(a["files"]) | set(b["files"]))
            differ = [p for p in paths if a["files"].get(p) != b["files"].get(p)]
            by_stage: dict[str, list[str]] = {}
            for p in differ:
                top = "/".join(p.split("/")[:3]) if p.startswith("data/") else p
                by_stage.setdefault(top, []).append(p)
            why = {}
            for p in differ:
                if p in a["json"] and p in b["json"]:
                    why[p] = _diff_keys(a["json"][p], b["json"][p])[:5]
            identity.append({"runs": [f"{a['code']} {a['load']}", f"{b['code']} {b['load']}"], "rev": a["rev"],
                             "files": len(paths), "differ": differ, "why": why})
            print(f"\n{a['code']} {a['load']} vs {b['code']} {b['load']} ({a['rev']}): {len(paths)} files, "
                  f"{len(differ)} differ")
            per_stage: dict[str, list[int]] = {}
            for p in paths:
                n = per_stage.setdefault(stage_of(p, known), [0, 0])
                n[0] += 1
                n[1] += p in differ
            print("| stage | files | identical | differ |\n|---|---|---|---|")
            for st, (n, d) in per_stage.items():
                print(f"| {st} | {n} | {n - d} | {d} |")
            identity[-1]["per_stage"] = {st: {"files": n, "differ": d} for st, (n, d) in per_stage.items()}
            for top, ps in by_stage.items():
                print(f"  {top}: {len(ps)} file(s), e.g. {ps[0]}")
            for p, ks in why.items():
                print(f"    {p}: {'; '.join(ks)}")
    return {"columns": head, "table": table, "identity": identity}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one run of the default pipeline")
    r.add_argument("code", help="LABEL=REV (a git revision of this repository)")
    r.add_argument("load", choices=["idle", "busy"])
    r.add_argument("--keep", type=Path, default=None, help="copy the finished clone here")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the run (DSM_THREADS=fixed: the same code, thread count fixed)")
    sub.add_parser("report", help="the tables of the runs recorded so far")
    for p in (r, sub.choices["report"]):
        p.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.cmd == "run":
        res = run(args.code, args.load, args.out, args.keep, args.env)
        return 0 if res["rc"] == 0 else 1
    summary = report(args.out)
    data = json.loads(args.out.read_text())
    data["summary"] = summary
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

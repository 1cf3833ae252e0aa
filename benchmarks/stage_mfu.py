"""Where the default's time goes: per stage, its wall time, the model FLOPs it counted (stages.core.flops, in
data/timings/<stage>.json), the FLOP/s it achieved, and that against this machine's matmul peak in the precision the
stage ran (fp32, or bf16 where the stage's ``hardware`` record says so), with each stage's share of the whole run.

    python benchmarks/stage_mfu.py RUN_DIR                   # a finished run (data/timings, data/metrics)
    python benchmarks/stage_mfu.py RUN_DIR --walls benchmarks/results/load_2026-12-06.json:I   # another run's walls
    python benchmarks/stage_mfu.py RUN_DIR --walls OTHER_RUN_DIR     # the walls of another run of the same work
    python benchmarks/stage_mfu.py RUN_DIR --label after --out benchmarks/results/stage_mfu.json  # append a row set

The peak is measured here and now: one core's best FLOP per CPU-second on square GEMMs (1 thread, process CPU time,
so that other work on a shared machine does not lower it), times the cores; the load is recorded beside it. ``--walls FILE:LABEL`` takes the stage wall times of the run labelled LABEL in a
benchmarks/load.py results file (an idle run of the same bytes: the same work) instead of RUN_DIR's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._tiny import machine  # noqa: E402


def _precision(run: Path, stage: str) -> str:
    """bf16 where the stage's metrics record it trained or generated in bf16, else fp32."""
    f = run / "data" / "metrics" / f"{stage}.json"
    hw = json.loads(f.read_text()).get("hardware", {}) if f.is_file() else {}
    said = f"{hw.get('precision', '')} {hw.get('dtype', '')} {hw.get('resolved', '')}".lower()
    return "bf16" if "bf16" in said or "bfloat16" in said else "fp32"


def core_peak(dtype: Any, sizes: tuple[int, ...] = (1024, 2048), reps: int = 5) -> float:
    """TFLOP per CPU-second of one core on ``a @ b`` (square, the best over sizes and repeats; 1 thread)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best = 0.0
    try:
        for n in sizes:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b
            for _ in range(reps):
                t = time.process_time()
                a @ b
                best = max(best, 2 * n**3 / max(time.process_time() - t, 1e-9) / 1e12)
    finally:
        torch.set_num_threads(threads)
    return best


def stage_rows(run: Path, walls: dict[str, float] | None, peaks: dict[str, float]) -> list[dict[str, Any]]:
    """One row per stage of the run's timings: wall, FLOPs, precision, achieved GFLOP/s, MFU, share of the walls."""
    rows = []
    for f in sorted((run / "data" / "timings").glob("*.json")):
        t = json.loads(f.read_text())
        stage = f.stem.replace("evaluate_", "evaluate@").replace("testsets_", "testsets@")
        wall = (walls or {}).get(stage, t.get("wall_s"))
        counted = (t.get("model_flops") or {}).get("total", 0.0)
        prec = _precision(run, f.stem)
        achieved = counted / wall if wall else 0.0
        rows.append({"stage": stage, "wall_s": round(wall, 1), "gflop": round(counted / 1e9, 1), "precision": prec,
                     "gflop_per_s": round(achieved / 1e9, 2),
                     "mfu": round(achieved / (peaks[prec] * 1e12), 4) if counted else None})
    total = sum(r["wall_s"] for r in rows)
    for r in rows:
        r["share"] = round(r["wall_s"] / total, 3)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished run of the pipeline (its data/timings and data/metrics)")
    ap.add_argument("--walls", default=None, metavar="FILE:LABEL", help="stage walls of run LABEL in a load.py file, or of another run's directory")
    ap.add_argument("--label", default="run")
    ap.add_argument("--out", type=Path, default=None, help="append the table to this JSON file")
    a = ap.parse_args()
    import torch

    load_before = [round(x, 2) for x in os.getloadavg()]
    peaks = {"fp32": core_peak(torch.float32) * (os.cpu_count() or 1),
             "bf16": core_peak(torch.bfloat16) * (os.cpu_count() or 1)}
    walls = None
    if a.walls and Path(a.walls).is_dir():  # another finished run's own data/timings
        walls = {row["stage"]: row["wall_s"] for row in stage_rows(Path(a.walls), None, peaks)}
    elif a.walls:
        path, _, label = a.walls.rpartition(":")
        run = next(r for r in json.loads(Path(path).read_text())["runs"] if r["code"] == label)
        walls = {s: v["wall_s"] for s, v in run["stages"].items()}
    rows = stage_rows(a.run, walls, peaks)
    print(f"peak matmul, {os.cpu_count()} cores x one core's best per CPU-second: fp32 {peaks['fp32'] * 1e3:.0f} GFLOP/s, bf16 "
          f"{peaks['bf16'] * 1e3:.0f} GFLOP/s (load {load_before})")
    print(f"{'stage':<24}{'wall s':>8}{'share':>7}{'GFLOP':>9}{'prec':>6}{'GFLOP/s':>9}{'MFU':>7}")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{r['stage']:<24}{r['wall_s']:>8}{r['share']:>7}{r['gflop']:>9}{r['precision']:>6}"
              f"{r['gflop_per_s']:>9}{mfu:>7}")
    ev = sum(r["wall_s"] for r in rows if r["stage"].startswith("evaluate@"))
    print(f"evaluation: {ev:.0f} s of {sum(r['wall_s'] for r in rows):.0f} s in stages")
    if a.out:
        old = json.loads(a.out.read_text()) if a.out.is_file() else {"runs": []}
        old["runs"].append({"label": a.label, "run": str(a.run), "walls_from": a.walls, "machine": machine(),
                            "measured_at": time.strftime("%Y-%m-%dT%H:%M"),
                            "peak_tflops": peaks, "stages": rows})
        a.out.write_text(json.dumps(old, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

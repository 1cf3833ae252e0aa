"""Bounded answer checking on adversarial inputs (issue 27): the wall time of one check under its deadline, the longest
stall of another thread meanwhile, and maj@64 over 64 distinct adversarial answers.

    flock /work/notes/heavy.lock python benchmarks/checker_adversarial.py [--deadline 2.0] [--json]

For every input (power towers, 1 MiB of digits, nested radicals, a huge matrix, a long list, regex-hostile strings)
and both checker modes: ``check(pred, gold)`` from a fresh cache (each (mode, input) pair once), its outcome and wall
time, and the longest gap of a ticker thread that wakes every millisecond (a stall of the process's other threads:
a C call holding the GIL). Then maj@64: 64 distinct towers as the samples of one problem, checked against the gold
(check_many on the pool's workers) and grouped into classes (answer_key, no pairwise checks): its wall time against
64 deadlines. Also extraction (final_answers) from a 1 MiB output. Prints a table; ``--json`` writes
benchmarks/results/checker_adversarial.json with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import answers  # noqa: E402
from stages.core.answers import answer_key, check, check_many, final_answers  # noqa: E402
from stages.evaluate.metrics import sample_metrics  # noqa: E402
from tests.core.checker_cases import ADVERSARIAL  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "checker_adversarial.json"


_CONTROL = """
import sys, time
last = time.perf_counter(); gap = 0.0
end = last + float(sys.argv[1])
while True:
    time.sleep(0.001)
    now = time.perf_counter(); gap = max(gap, now - last); last = now
    if sys.stdin in __import__("select").select([sys.stdin], [], [], 0)[0] or now > end:
        break
print(gap)
"""


class Ticker:
    """Wakes every millisecond; ``max_gap``: the longest time between two wake-ups of this thread. ``control_gap``:
    the same from a separate process over the same period, the stall the machine's scheduler alone causes (a gap
    the thread sees and the process does not is the GIL's)."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self.control_gap = 0.0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._ctl = None

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            last = now

    def __enter__(self) -> Ticker:
        import subprocess

        self._ctl = subprocess.Popen([sys.executable, "-c", _CONTROL, "3600"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self._th.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()
        out, _ = self._ctl.communicate("stop\n", timeout=60)
        self.control_gap = float(out.strip() or "nan")


def towers(n: int) -> list[str]:
    """``n`` distinct power towers (each makes sympy evaluate a huge power)."""
    out = []
    for b in range(2, 12):
        for e in range(7, 20):
            out.append(f"{b}^{{{b}^{{{b}^{{{e}}}}}}}")
    return out[:n]


def markdown(res: dict) -> str:
    """The result file as the tables of docs/evaluation.md."""
    load = lambda x: ", ".join(f"{v:.2f}" for v in x)  # noqa: E731
    out = [f"Deadline {res['deadline_s']} s of the worker's CPU time per check; {res['cpus']} CPUs; load average "
           f"{load(res['load_before'])} before, {load(res['load_after'])} after "
           "(`flock /work/notes/heavy.lock python benchmarks/checker_adversarial.py --json`). \"stall\": the longest "
           "gap of a thread waking every millisecond in the checking process; \"control\": the same in a separate "
           "process over the same time (what the machine's scheduler alone causes).", "",
           "| input | characters | mode | outcome | wall s | stall ms | control ms |", "|---|---|---|---|---|---|---|"]
    for r in res["checks"]:
        out.append(f"| {r['input'].replace('|', chr(92) + '|')} | {r['chars']:,} | {r['mode']} | {r['outcome']} | "
                   f"{r['wall_s']:.3f} | {r['max_stall_ms']:.1f} | {r.get('control_stall_ms', float('nan')):.1f} |")
    out += ["", "| extraction (both modes) from | wall s | stall ms | control ms |", "|---|---|---|---|"]
    for r in res["extraction"]:
        out.append(f"| {r['input'].replace('|', chr(92) + '|')} | {r['wall_s']:.3f} | {r['max_stall_ms']:.1f} | "
                   f"{r.get('control_stall_ms', float('nan')):.1f} |")
    m = res["maj64"]
    out += ["", f"maj@64 over 64 distinct power towers (strict, {m['workers']} workers): {m['wall_s']} s = "
            f"{m['deadlines']} deadlines (outcomes {m['outcomes']}; {m['distinct_keys']} classes, maj@64 = "
            f"{m['maj@64']}); stall {m['max_stall_ms']} ms, control {m.get('control_stall_ms')} ms. Worst single check "
            f"{res['worst_check_s']} s; worst in-process stall {res['worst_stall_ms']} ms."]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=float, default=2.0, help="deadline of one check, seconds (default 2)")
    ap.add_argument("--json", action="store_true", help=f"write {RESULT.relative_to(ROOT)}")
    ap.add_argument("--markdown", action="store_true", help=f"print {RESULT.relative_to(ROOT)} as markdown tables")
    a = ap.parse_args()
    if a.markdown:
        print(markdown(json.loads(RESULT.read_text(encoding="utf-8"))))
        return
    answers.warm_up(2)
    res: dict = {"deadline_s": a.deadline, "load_before": os.getloadavg(), "cpus": os.cpu_count(), "checks": []}
    print(f"deadline {a.deadline} s; load {res['load_before']}")
    print(f"{'input':<40}{'mode':<14}{'outcome':<10}{'wall s':>8}{'stall ms':>10}{'control':>10}")
    for name, (pred, gold) in ADVERSARIAL.items():
        for mode in ("deepseekmath", "strict"):
            with Ticker() as t:
                t0 = time.perf_counter()
                out = check(pred, gold, mode=mode, timeout_s=a.deadline)
                wall = time.perf_counter() - t0
            row = {"input": name, "chars": len(pred), "mode": mode, "outcome": out, "wall_s": round(wall, 3),
                   "max_stall_ms": round(1000 * t.max_gap, 1), "control_stall_ms": round(1000 * t.control_gap, 1)}
            res["checks"].append(row)
            print(f"{name:<40}{mode:<14}{out:<10}{wall:>8.3f}{1000 * t.max_gap:>10.1f}{1000 * t.control_gap:>10.1f}")
    # extraction from 1 MiB outputs
    for name, text in {"1 MiB output of digits": "7" * (1 << 20),
                       "1 MiB output of unclosed \\boxed{": "\\boxed{" * 150_000,
                       "1 MiB output of 'x ' then 7": "x " * (1 << 19) + "7"}.items():
        with Ticker() as t:
            t0 = time.perf_counter()
            for mode in ("deepseekmath", "strict"):
                final_answers(text, mode=mode)
            wall = time.perf_counter() - t0
        res.setdefault("extraction", []).append({"input": name, "wall_s": round(wall, 3),
                                                 "max_stall_ms": round(1000 * t.max_gap, 1),
                                                 "control_stall_ms": round(1000 * t.control_gap, 1)})
        print(f"extract: {name:<40}{wall:>8.3f} s, stall {1000 * t.max_gap:.1f} ms (control {1000 * t.control_gap:.1f})")
    # maj@64 over 64 distinct towers
    preds = towers(64)
    with Ticker() as t:
        t0 = time.perf_counter()
        outcomes = check_many(preds, ["7"] * 64, mode="strict", timeout_s=a.deadline)
        keys = [answer_key(p, "strict") for p in preds]
        m = sample_metrics(keys, [o == "right" for o in outcomes], [1, 8, 64])
        wall = time.perf_counter() - t0
    res["maj64"] = {"n": 64, "distinct_keys": len(set(keys)), "outcomes": {o: outcomes.count(o) for o in set(outcomes)},
                    "wall_s": round(wall, 2), "deadlines": round(wall / a.deadline, 1), "maj@64": m["maj@64"],
                    "max_stall_ms": round(1000 * t.max_gap, 1), "control_stall_ms": round(1000 * t.control_gap, 1),
                    "workers": answers._answers_pool.max_workers()}
    print(f"maj@64 over 64 towers: {wall:.1f} s = {wall / a.deadline:.1f} deadlines "
          f"({res['maj64']['outcomes']}), stall {1000 * t.max_gap:.1f} ms (control {1000 * t.control_gap:.1f})")
    res["load_after"] = os.getloadavg()
    res["worst_check_s"] = max(r["wall_s"] for r in res["checks"])
    res["worst_stall_ms"] = max([r["max_stall_ms"] for r in res["checks"]] +
                                [r["max_stall_ms"] for r in res["extraction"]] + [res["maj64"]["max_stall_ms"]])
    print(f"worst check {res['worst_check_s']} s (deadline {a.deadline}); worst stall {res['worst_stall_ms']} ms; "
          f"load {res['load_after']}")
    if a.json:
        RESULT.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

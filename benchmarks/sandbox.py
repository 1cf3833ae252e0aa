"""Throughput of the code sandbox (stages/core/sandbox.py): programs per second.

    python benchmarks/sandbox.py [--n 200] [--workers N]

Measures, for a trivial program (``print(1)``), a typical program-of-thought program (PAL / GSM-Hard
``solution()`` programs from ../shared/data when present, else built-in ones) and a TIR-style program that
uses sympy:
- ``serial``: one program at a time through :func:`run_python` / :func:`run_pot` (the zygote pre-forks the
  next sandbox meanwhile);
- ``pooled``: :func:`run_many` / :func:`run_many_pot` over ``--workers`` threads (default: the CPUs);
- ``fresh interpreter``: the naive alternative, a new ``python -I -c`` per program, serial, with no
  isolation at all - the start-up cost the zygote avoids.
Also reports the CPU time the zygote and its sandboxes spent per program (less dependent on other load).
Writes benchmarks/results/sandbox.json (``--out``: another file) and prints a table. Numbers depend on the machine's
load. As root and as an ordinary user (issue 46), run it alternately as each, with the same interpreter and
``SHARED_DATA`` (benchmarks/results/sandbox_users.json: the runs side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import sandbox  # noqa: E402

TRIVIAL = "print(1)"
BUILTIN_POT = [
    "def solution():\n"
    f"    eggs = {16 + i}\n    eaten = 3\n    baked = 4\n    price = 2\n"
    "    remainder = eggs - eaten - baked\n    money = remainder * price\n    result = money\n    return result\n"
    for i in range(50)
]
SYMPY_TIR = (
    "from sympy import symbols, solve, Rational\n"
    "x = symbols('x')\n"
    "roots = solve(x**2 - 5*x + 6, x)\n"
    "print(sum(roots) * Rational(1, 2))\n"
)


def pot_programs(n: int) -> tuple[list[str], str]:
    shared = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data")) / "pot_tir" / "pal_gsmhardv2.jsonl"
    if shared.is_file():
        codes = [json.loads(line)["code"] for line in shared.open()]
        src = "pal_gsmhardv2"
    else:
        codes, src = BUILTIN_POT, "built-in"
    return [codes[i % len(codes)] for i in range(n)], src


def zygote_cpu_s(pid: int) -> float:
    """utime + stime of the zygote and its reaped children (the sandboxes)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], list], zpid: int | None) -> tuple[float, float | None, list]:
    c0 = zygote_cpu_s(zpid) if zpid else None
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    time.sleep(0.3)  # let the last sandboxes be reaped, so their CPU time is counted
    cpu = zygote_cpu_s(zpid) - c0 if zpid else None
    return dt, cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="programs per sandbox measurement")
    ap.add_argument("--fresh-n", type=int, default=20, help="programs for the fresh-interpreter baseline (0: none)")
    ap.add_argument("--workers", type=int, default=None, help="pool size (default: CPUs)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sandbox.json", help="results file")
    args = ap.parse_args()
    workers = args.workers or sandbox.default_workers()
    load_before = os.getloadavg()

    t0 = time.perf_counter()
    rep = sandbox.isolation_report()
    startup_s = time.perf_counter() - t0
    zpid = rep["zygote_pid"]
    pots, pot_src = pot_programs(args.n)
    sandbox.run_python(TRIVIAL)  # warm

    rows = []

    def record(name: str, mode: str, n: int, dt: float, cpu: float | None, ok: int) -> None:
        rows.append({"program": name, "mode": mode, "n": n, "seconds": round(dt, 3),
                     "programs_per_s": round(n / dt, 1), "ms_per_program": round(1000 * dt / n, 1),
                     "cpu_ms_per_program": None if cpu is None else round(1000 * cpu / n, 1), "ok": ok})

    trivial = [TRIVIAL] * args.n
    dt, cpu, out = timed(lambda: [sandbox.run_python(c) for c in trivial], zpid)
    record("trivial", "serial", args.n, dt, cpu, sum(r.ok for r in out))
    dt, cpu, out = timed(lambda: sandbox.run_many(trivial, workers=workers), zpid)
    record("trivial", f"pooled x{workers}", args.n, dt, cpu, sum(r.ok for r in out))

    dt, cpu, out = timed(lambda: [sandbox.run_pot(c) for c in pots], zpid)
    record(f"PoT ({pot_src})", "serial", args.n, dt, cpu, sum(r.ok and v is not None for r, v in out))
    dt, cpu, out = timed(lambda: sandbox.run_many_pot(pots, workers=workers), zpid)
    record(f"PoT ({pot_src})", f"pooled x{workers}", args.n, dt, cpu, sum(r.ok and v is not None for r, v in out))

    n_sym = max(10, args.n // 4)
    dt, cpu, out = timed(lambda: sandbox.run_many([SYMPY_TIR] * n_sym, workers=workers), zpid)
    record("TIR with sympy", f"pooled x{workers}", n_sym, dt, cpu, sum(r.stdout.strip() == "5/2" for r in out))

    env = {"PATH": os.defpath}
    for name, code in (("trivial", TRIVIAL), ("TIR with sympy", SYMPY_TIR)) if args.fresh_n else ():
        n = args.fresh_n if name == "trivial" else max(3, args.fresh_n // 4)

        def fresh(code: str = code, n: int = n) -> list:
            return [subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, env=env, timeout=120)
                    for _ in range(n)]

        dt, _, out = timed(fresh, None)
        record(name, "fresh interpreter (no isolation)", n, dt, None, sum(p.returncode == 0 for p in out))

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()} "
                   f"(Python {platform.python_version()})",
        "uid": os.getuid(),
        "privileges": rep["privileges"],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "note": "shared machine: other jobs were running; cpu_ms_per_program (zygote + sandboxes) depends "
                "less on the load than programs_per_s, but still rises with contention",
        "zygote_startup_s": round(startup_s, 2),
        "preloaded": rep["preloaded"],
        "isolation_active": rep["active"],
        "isolation_inactive": rep["inactive"],
        "workers": workers,
        "results": rows,
    }
    out_path = args.out
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'program':<26}{'mode':<34}{'n':>5}{'prog/s':>9}{'ms/prog':>9}{'cpu ms':>8}{'ok':>6}")
    for r in rows:
        cpu_s = "-" if r["cpu_ms_per_program"] is None else f"{r['cpu_ms_per_program']:.1f}"
        print(f"{r['program']:<26}{r['mode']:<34}{r['n']:>5}{r['programs_per_s']:>9.1f}{r['ms_per_program']:>9.1f}"
              f"{cpu_s:>8}{r['ok']:>6}")
    print(f"zygote start-up {startup_s:.2f}s; load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"wrote {out_path}")


if __name__ == "__main__":
    main()

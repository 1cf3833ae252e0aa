"""Paired A/B throughput of two versions of the code sandbox (this checkout's and another's), in one process.

    git worktree add /tmp/sandbox-main main      # the version to compare against (any checkout)
    python benchmarks/sandbox_ab.py --baseline /tmp/sandbox-main [--rounds 20] [--batch 40] [--bwrap]

Both versions' executors (each with its own zygote) stay alive side by side; every round runs one batch of
each workload through each of them, in random order, so that the other jobs of a shared machine slow both
alike. Workloads as in benchmarks/sandbox.py: ``print(1)`` and PAL / GSM-Hard ``solution()`` programs
(../shared/data when present, else built-in ones), serial and over 2 threads, and a sympy TIR program.
Reports per workload the median programs per second of each version, their ratio and the median of the
per-round ratios, and the cost of each version's seccomp filter in a forked child: installing it, and 1000
calls of an unconditionally allowed syscall (``getppid``) and of an argument-checked one (``fcntl(F_GETFL)``);
writes benchmarks/results/sandbox_ab.json. Not part of benchmarks/run_all.py (it needs a
second checkout). ``--bwrap``: bubblewrap as a third version, set up as benchmarks/sandbox_attacks.py's
``BwrapRunner`` (the same allow-list and seccomp filter; a fresh interpreter per program, which imports what the
program imports), in the same rounds.

Root against an ordinary user (issue 46), as root: ``python benchmarks/sandbox_ab.py --user dsmtest [--python PY]``
runs this checkout's sandbox twice, its zygote started as root ("baseline") and as that user ("this": a user
namespace instead of root), both with interpreter PY (one the user can run; the checkout must be readable by the
user), in the same rounds; writes benchmarks/results/sandbox_ab_users.json. ``--root-pinned``: root's programs pinned to
CPUs as an ordinary user's are, instead of root's cpu cgroup (whose weight, 1024 x CPUs for the sandboxes together,
gives them more of a contended machine than plain processes get); writes sandbox_ab_users_pinned.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.sandbox import SYMPY_TIR, pot_programs  # noqa: E402


def load_sandbox(checkout: Path, name: str) -> ModuleType:
    """stages/core/sandbox.py of ``checkout`` as module ``name`` (its zygote script is the file beside it)."""
    spec = importlib.util.spec_from_file_location(name, checkout / "stages" / "core" / "sandbox.py")
    assert spec and spec.loader, checkout
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_zygote(checkout: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, checkout / "stages" / "core" / "_sandbox_zygote.py")
    assert spec and spec.loader, checkout
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def filter_cost(zygotes: dict[str, ModuleType], reps: int = 200) -> dict[str, dict[str, float]]:
    """Median microseconds to install each version's filter, and nanoseconds per call under it."""
    progs = {k: z.build_seccomp() for k, z in zygotes.items()}
    got: dict[str, list[list[int]]] = {k: [] for k in progs}
    for _ in range(reps):
        for k, (fprog, _arr) in progs.items():
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child installs the filter, times a few calls, reports and exits
                z = zygotes[k]
                z.libc.prctl(z.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
                t0 = time.perf_counter_ns()
                z.install_seccomp(fprog)
                t1 = time.perf_counter_ns()
                for _ in range(1000):
                    os.getppid()
                t2 = time.perf_counter_ns()
                for _ in range(1000):
                    os.get_blocking(w)
                t3 = time.perf_counter_ns()
                os.write(w, f"{t1 - t0} {t2 - t1} {t3 - t2}".encode())
                os._exit(0)
            os.close(w)
            got[k].append([int(x) for x in os.read(r, 100).split()])
            os.close(r)
            os.waitpid(pid, 0)
    return {k: {"instructions": progs[k][0].len,
                "install_us": round(statistics.median(x[0] for x in v) / 1000, 1),
                "getppid_ns": round(statistics.median(x[1] for x in v) / 1000, 1),
                "fcntl_getfl_ns": round(statistics.median(x[2] for x in v) / 1000, 1)} for k, v in got.items()}


class BwrapVersion:
    """bubblewrap behind the executor's ``run(code, call=...) -> (result, value)`` interface."""

    def __init__(self) -> None:
        from benchmarks.sandbox_attacks import BwrapRunner

        self.runner = BwrapRunner()

    def run(self, code: str, call: str | None = None) -> tuple[Any, str | None]:
        # a generous wall clock: a cold sympy import in a fresh interpreter takes seconds on a loaded machine
        out = self.runner.run(code + (f"\nprint({call}())" if call else ""), timeout_s=120.0)
        ok = out.status == "ok"
        return SimpleNamespace(ok=ok), (out.stdout.strip().splitlines() or [None])[-1] if ok and call else None

    def report(self) -> dict:
        return {"active": ["bwrap " + " ".join(self.runner.args[:12]) + " ..."]}

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="root of the checkout to compare against")
    ap.add_argument("--user", help="compare this checkout's sandbox as root (baseline) and as this user (this)")
    ap.add_argument("--python", help="with --user: the interpreter of both (default: this one)")
    ap.add_argument("--root-pinned", action="store_true", help="with --user: root's programs pinned, no cpu cgroup")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=40, help="programs per batch (sympy: a quarter)")
    ap.add_argument("--bwrap", action="store_true", help="bubblewrap as a third version")
    args = ap.parse_args()
    n = args.batch
    if args.user:
        import pwd

        this = load_sandbox(ROOT, "sandbox_this")
        uid = pwd.getpwnam(args.user).pw_uid
        ex: dict[str, Any] = {"baseline": this.SandboxExecutor(python=args.python,
                                                               disable=["cpu_cgroup"] if args.root_pinned else ()),
                              "this": this.SandboxExecutor(python=args.python, user=uid)}
    elif args.baseline:
        ex = {k: m.SandboxExecutor() for k, m in {"baseline": load_sandbox(args.baseline.resolve(), "sandbox_baseline"),
                                                  "this": load_sandbox(ROOT, "sandbox_this")}.items()}
    else:
        ap.error("--baseline or --user is required")
    if args.bwrap:
        ex["bwrap"] = BwrapVersion()
    active = {k: e.report()["active"] for k, e in ex.items()}
    privileges = {k: e.report().get("privileges") for k, e in ex.items() if k != "bwrap"}
    pal, src = pot_programs(n * args.rounds)

    def serial(e, codes: list[str], call: str | None = None) -> list[bool]:
        return [e.run(c, call=call)[0].ok for c in codes]

    def pooled(e, codes: list[str], call: str | None = None) -> list[bool]:
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(lambda c: e.run(c, call=call)[0].ok, codes))

    loads = {
        "trivial serial": lambda e, i: serial(e, ["print(1)"] * n),
        "trivial pooled x2": lambda e, i: pooled(e, ["print(1)"] * n),
        f"PoT ({src}) serial": lambda e, i: serial(e, pal[i * n:(i + 1) * n], "solution"),
        f"PoT ({src}) pooled x2": lambda e, i: pooled(e, pal[i * n:(i + 1) * n], "solution"),
        "TIR with sympy pooled x2": lambda e, i: pooled(e, [SYMPY_TIR] * max(2, n // 4)),
    }
    for e in ex.values():
        serial(e, ["print(1)"] * 5 + [SYMPY_TIR])  # warm (the page cache holds sympy's files for bwrap too)
    rates: dict[str, dict[str, list[float]]] = {k: {v: [] for v in ex} for k in loads}
    load_start = os.getloadavg()
    for i in range(args.rounds):
        for name, fn in loads.items():
            order = list(ex)
            random.shuffle(order)
            for v in order:
                t0 = time.perf_counter()
                oks = fn(ex[v], i)
                dt = time.perf_counter() - t0
                if not all(oks):
                    sys.exit(f"{name}: a program failed in the {v} sandbox")
                rates[name][v].append(len(oks) / dt)
    load_end = os.getloadavg()
    for e in ex.values():
        e.close()
    cost = {} if args.user else filter_cost({"baseline": load_zygote(args.baseline.resolve(), "zygote_baseline"),
                                             "this": load_zygote(ROOT, "zygote_this")})
    for k, c in cost.items():
        print(f"seccomp filter, {k}: {c}")
    results = {}
    for name, d in rates.items():
        b, t = statistics.median(d["baseline"]), statistics.median(d["this"])
        per_round = statistics.median(y / x for x, y in zip(d["baseline"], d["this"], strict=True))
        results[name] = {"baseline_programs_per_s": round(b, 1), "this_programs_per_s": round(t, 1),
                         "ratio_of_medians": round(t / b, 3), "median_of_round_ratios": round(per_round, 3)}
        line = f"{name:34} baseline {b:6.1f}/s  this {t:6.1f}/s  ratio {t / b:.3f}  per-round median {per_round:.3f}"
        if "bwrap" in d:
            w = statistics.median(d["bwrap"])
            results[name].update(bwrap_programs_per_s=round(w, 1), bwrap_over_this=round(w / t, 3))
            line += f"  bwrap {w:6.1f}/s ({w / t:.2f}x this)"
        print(line)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    out = {"baseline": f"this checkout as root{' (pinned, no cpu cgroup)' if args.root_pinned else ''}; this: as "
                       f"{args.user}" if args.user else str(args.baseline),
           "python": args.python or sys.executable, "cpu": f"{os.cpu_count()} x {cpu}", "privileges": privileges,
           "rounds": args.rounds, "batch": n,
           "load_average_start": [round(x, 2) for x in load_start], "load_average_end": [round(x, 2) for x in load_end],
           "active_mechanisms": active, "results": results, "seccomp_filter_cost": cost}
    name = ("sandbox_ab_users_pinned" if args.root_pinned else "sandbox_ab_users") if args.user else "sandbox_ab"
    path = ROOT / "benchmarks" / "results" / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average {load_start[0]:.1f} -> {load_end[0]:.1f}; wrote {path}")


if __name__ == "__main__":
    main()

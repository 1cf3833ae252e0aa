"""Throughput of answer checking (stages/core/answers.py): calls per second.

    python benchmarks/answers.py [--n 20000] [--symbolic 200]

Measures, on one thread:
- ``numeric``: ``is_equivalent(pred, gold)`` on numeric answers (the fast path; GRPO rewards on GSM8K-like
  problems), half right and half wrong, with and without thousands separators;
- ``reward``: ``extract_answer(completion)`` + ``is_equivalent`` on a ~300-character completion;
- ``symbolic``: MATH answers that need the worker (``\\sqrt``, tuples, expressions), each pair new
  (no cache hits), with one warm worker.
Writes benchmarks/results/answers.json and prints a table. Numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import answers  # noqa: E402
from stages.core.answers import extract_answer, is_equivalent, strip_string  # noqa: E402

SYMBOLIC_FORMS = [
    ("{a}\\sqrt{{{b}}}", "\\sqrt{{{c}}}"),
    ("({a}, {b})", "\\left( {a}, {b} \\right)"),
    ("{a}x+{b}", "{b}+{a}x"),
    ("\\frac{{{a}}}{{{b}}}\\pi", "\\frac{{{a}\\pi}}{{{b}}}"),
]


def _rate(fn, items) -> tuple[float, float]:
    t0 = time.perf_counter()
    for it in items:
        fn(*it)
    dt = time.perf_counter() - t0
    return len(items) / dt, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="numeric checks to time")
    ap.add_argument("--symbolic", type=int, default=200, help="symbolic checks to time")
    args = ap.parse_args()
    rng = random.Random(0)

    golds = [str(rng.randint(1, 200000)) for _ in range(args.n)]
    preds = []
    for g in golds:
        v = int(g) if rng.random() < 0.5 else int(g) + rng.randint(1, 50)
        preds.append(f"{v:,}" if rng.random() < 0.3 else str(v))
    numeric_rate, numeric_s = _rate(is_equivalent, list(zip(preds, golds, strict=True)))

    body = "Let me think. She has 16 eggs, eats 3 and bakes 4, so 16 - 3 - 4 = 9 remain. " * 3
    comps = [
        (body + f"Each sells for $2, so 9 * 2 = {p}.\nThe answer is \\boxed{{{p}}}.", g)
        for p, g in zip(preds, golds, strict=True)
    ]
    reward_rate, reward_s = _rate(lambda c, g: is_equivalent(extract_answer(c, "gsm8k"), g), comps)

    answers.warm_up(1)
    sym = []
    for i in range(args.symbolic):
        a, b = rng.randint(2, 9) + i, rng.randint(2, 50)
        pf, gf = SYMBOLIC_FORMS[i % len(SYMBOLIC_FORMS)]
        sym.append((pf.format(a=a, b=b), gf.format(a=a, b=b, c=a * a * b)))
    before = answers.stats.copy()
    symbolic_rate, symbolic_s = _rate(lambda p, g: is_equivalent(p, g, timeout_s=10.0), sym)
    used_worker = answers.stats["symbolic"] - before["symbolic"]

    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.python_version()})",
        "numeric_calls_per_s": round(numeric_rate),
        "numeric_n": args.n,
        "reward_extract_plus_check_per_s": round(reward_rate),
        "symbolic_calls_per_s": round(symbolic_rate, 1),
        "symbolic_n": args.symbolic,
        "symbolic_went_to_worker": used_worker,
        "strip_string_example": strip_string("\\left( 3, \\dfrac{\\pi}{2} \\right)"),
    }
    out = ROOT / "benchmarks" / "results" / "answers.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'path':<34}{'calls/s':>12}{'n':>8}{'seconds':>10}")
    print(f"{'numeric is_equivalent (fast)':<34}{numeric_rate:>12.0f}{args.n:>8}{numeric_s:>10.2f}")
    print(f"{'extract_answer + is_equivalent':<34}{reward_rate:>12.0f}{args.n:>8}{reward_s:>10.2f}")
    print(f"{'symbolic (worker, uncached)':<34}{symbolic_rate:>12.1f}{args.symbolic:>8}{symbolic_s:>10.2f}")
    print(f"wrote {out.relative_to(ROOT)}")
    answers.shutdown()


if __name__ == "__main__":
    main()

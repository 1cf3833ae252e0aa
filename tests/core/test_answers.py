"""Answer extraction, normalisation and equivalence (stages/core/answers.py)."""

from __future__ import annotations

import threading
import time

import pytest

from stages.core import _answers_pool, answers
from stages.core.answers import (
    are_equivalent,
    extract_answer,
    extract_answers,
    gsm8k_gold,
    is_equivalent,
    strip_string,
)

# ------------------------------------------------------------------------------------------------
# Extraction
# ------------------------------------------------------------------------------------------------

EXTRACTION = [
    # Minerva format wins over everything else
    ("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct. \\boxed{3}", "\\frac{1}{2}"),
    ("so the final answer is $\\$15,\\!000$. I hope it is correct.", "15,000"),
    # last \boxed{}, nested braces
    ("First \\boxed{1}, then $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("The answer is \\boxed{\\dfrac{3}{4}}.", "\\frac{3}{4}"),
    ("\\boxed{50}\\% of them", "50%"),
    ("\\boxed 7 is it", "7"),
    ("\\boxed{x \\in [-2,7]}", "[-2,7]"),
    # "he answer is": the text after the last occurrence, first line
    ("The answer is 42.\nMore text 7", "42"),
    ("the answer is 3. No wait, the answer is: $\\left( 3, \\frac{\\pi}{2} \\right)$.", "(3,\\frac{\\pi}{2})"),
    ("The answer is 18 dollars.", "18dollars"),
    ("The answer is $5\\text{ cm}$.", "5"),
    # last ```output block
    ("```python\nprint(1)\n```\n```output\n1\n```\n```python\nprint(2/3)\n```\n```output\n0.6666\n```", "0.6666"),
    ("```output\n[1, 2]\n```\nThat's it", "[1,2]"),
    # last number (commas removed first)
    ("We have 3 apples and 1,250 pears", "1250"),
    ("It is -4.5 degrees", "-4.5"),
    ("no numbers at all", None),
    ("", None),
    # an empty \boxed{} falls through to the next rule
    ("\\boxed{} so the answer is 4", "4"),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTION)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_extract_answer_gsm8k_reduces_to_a_number() -> None:
    assert extract_answer("The answer is 1,800 dollars.", "gsm8k") == "1800"
    assert extract_answer("so $\\boxed{\\$1,234.5}$", "gsm8k") == "1234.5"
    assert extract_answer("The answer is 18 dollars.", "gsm8k") == "18"
    assert extract_answer("The answer is $\\frac{3}{4}$.", "gsm8k") == "\\frac{3}{4}"
    with pytest.raises(ValueError, match="unknown benchmark"):
        extract_answer("1", "mmlu")


def test_extract_answers_returns_every_boxed_answer() -> None:
    assert extract_answers("\\boxed{1} and \\boxed{ 2 } and \\boxed{\\{3\\}}") == ["1", "2", "\\{3\\}"]


def test_gsm8k_gold() -> None:
    assert gsm8k_gold("She pays 2,000 + 125.\n#### 2,125") == "2125"
    assert gsm8k_gold("#### -3") == "-3"
    with pytest.raises(ValueError):
        gsm8k_gold("no gold here")


# ------------------------------------------------------------------------------------------------
# strip_string
# ------------------------------------------------------------------------------------------------

STRIP = [
    ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("\\tfrac12", "\\frac{1}{2}"),
    ("\\frac1{72}", "\\frac{1}{72}"),
    ("3/4", "\\frac{3}{4}"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("10\\text{ cm}", "10"),
    ("\\text{Friday}", "Friday"),
    ("45^\\circ", "45"),
    ("90^{\\circ}", "90"),
    ("\\$18.90", "18.90"),
    ("2.000", "2"),
    (".5", "0.5"),
    ("50\\%", "50%"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("x \\in [-2, 7]", "[-2,7]"),
    ("15,\\!000", "15,000"),
    ("8{,}880", "8,880"),
    ("0.25\\,\\text{ cm}", "0.25"),
    ("\\sin x", "\\sin x"),
    ("2\\cdot 9", "2\\cdot9"),
    ("5.", "5"),
    ("3j", "3i"),
    ("infinity", "\\infty"),
    ("$x+1$", "x+1"),
]


@pytest.mark.parametrize(("raw", "expected"), STRIP)
def test_strip_string(raw: str, expected: str) -> None:
    assert strip_string(raw) == expected
    assert strip_string(expected) == expected  # idempotent


# ------------------------------------------------------------------------------------------------
# Equivalence table: (pred, gold, expected)
# ------------------------------------------------------------------------------------------------

EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac12", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("\\frac{6}{8}", "\\frac{3}{4}"),
    ("0.75", "\\dfrac{3}{4}"),
    ("0.3333", "\\frac{1}{3}"),
    ("50\\%", "0.5"),
    ("0.5", "50\\%"),
    ("50", "50\\%"),
    ("10%", "0.1"),
    ("x=3", "3"),
    ("3", "x=3"),
    ("y = -\\frac{1}{4}", "-\\frac{1}{4}"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\sqrt{27}", "3\\sqrt{3}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("\\frac{1}{2}+\\frac{\\sqrt{2}}{2}", "\\frac{1 + \\sqrt{2}}{2}"),
    ("1.414", "\\sqrt{2}"),
    ("3.1416", "\\pi"),
    ("\\frac{1}{3}\\pi", "\\frac{\\pi}{3}"),
    ("(x+1)^2", "x^2+2x+1"),
    ("15i-12", "-12 + 15i"),
    ("2j", "2i"),
    ("2^{10}", "1024"),
    ("\\binom{5}{2}", "10"),
    ("[0, 1)", "[0,1)"),
    ("(-\\infty,2]", "(-\\infty, 2]"),
    ("(1,2)\\cup(-\\infty,-7)", "(-\\infty,-7) \\cup (1,2)"),
    ("[-2,7]", "x \\in [-2,7]"),
    ("(1, 2)", "(1,2)"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("(-1/6, 0.5)", "\\left( -\\frac{1}{6}, \\frac{1}{2} \\right)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\begin{pmatrix}0.5&1\\\\2&3\\end{pmatrix}", "\\begin{pmatrix} \\frac{1}{2} & 1 \\\\ 2 & 3 \\end{pmatrix}"),
    ("\\begin{bmatrix} 7 \\\\ -2 \\end{bmatrix}", "\\begin{pmatrix} 7 \\\\ -2 \\end{pmatrix}"),
    ("2, 1", "1,2"),
    ("\\frac12, -3, \\frac{1}{3}, -2", "-3, -2, \\frac{1}{3}, \\frac{1}{2}"),
    ("3, 2", "2\\text{ and }3"),
    ("\\{2,1\\}", "\\{1,2\\}"),
    ("-10x+4y+5z+20=0", "10x - 4y - 5z - 20 = 0"),
    ("y-2x-1=0", "y=2x+1"),
    ("Friday", "\\text{Friday}"),
    ("friday", "\\text{Friday}"),
    ("\\text{(C)}", "\\text{(C)}"),
    ("C", "\\text{(C)}"),
    ("C, A", "\\text{A, C}"),
    ("Saturday", "\\mbox{Saturday}"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    ("15000", "\\$15,\\!000"),
    ("14,400", "14,\\!400"),
    ("18.9", "\\$18.90"),
    ("18.90", "18.9"),
    ("5", "5\\text{ cm}"),
    ("45", "45^\\circ"),
    ("90", "90\\text{ square\nunits}"),
    ("137.5", "137 \\frac{1}{2}"),
    ("2.000", "2"),
    (".5", "0.5"),
    ("\\infty", "infinity"),
    ("6.72\\times10^{-5}", ".0000672"),
    ("\\frac{12}{5525}", "\\frac{12}{5,\\!525}"),
    ("1800", "18"),  # the reference's percent rule: gold*100 counts (see the percent_variants test)
]

NOT_EQUIVALENT = [
    ("(2,1)", "(1,2)"),
    ("[1,2]", "(1,2)"),
    ("(0,1]", "[0,1)"),
    ("(-\\infty,2)", "(-\\infty,2]"),
    ("(1,2)", "(1,2,3)"),
    ("0.6", "0.5"),
    ("\\frac{1}{3}", "\\frac{1}{2}"),
    ("-5", "5"),
    ("19", "18"),
    ("14,401", "14,\\!400"),
    ("1,000", "1"),
    ("2\\sqrt{3}", "\\sqrt{8}"),
    ("2.83", "2\\sqrt{2}"),
    ("5\\sqrt{3}", "5 \\sqrt{2}"),
    ("3\\pi", "3"),
    ("\\frac{\\pi}{3}", "\\frac{\\pi}{2}"),
    ("-2i", "2i"),
    ("x^3", "x^2"),
    ("y+1", "x+1"),
    ("x=4", "3"),
    ("4", "x=3"),
    ("y=2x-1", "y=2x+1"),
    ("10x+4y=0", "10x-4y=0"),
    ("1,2,3", "1,2"),
    ("1", "1,2"),
    ("\\{1,3\\}", "\\{1,2\\}"),
    ("\\begin{pmatrix}2\\\\1\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\begin{pmatrix}1&2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("Fyirda", "\\text{Friday}"),
    ("Monday", "\\text{Friday}"),
    ("B", "\\text{(C)}"),
    ("A", "\\text{A, C}"),
    ("\\text{odd}", "\\text{even}"),
    ("3", "3:1"),
    ("68.5", "137 \\frac{1}{2}"),
    ("", "5"),
    (None, "5"),
    ("\\frac{1}{0}", "1"),
]

TABLE = [(p, g, True) for p, g in EQUIVALENT] + [(p, g, False) for p, g in NOT_EQUIVALENT]


def test_table_is_large_enough() -> None:
    assert len(TABLE) >= 80
    assert len(EQUIVALENT) >= 40 and len(NOT_EQUIVALENT) >= 30


def test_equivalence_table() -> None:
    """All pairs in one batch call (the symbolic ones share warm workers); every verdict right."""
    got = are_equivalent([p for p, _, _ in TABLE], [g for _, g, _ in TABLE], timeout_s=20.0)
    wrong = [(p, g, want) for (p, g, want), ok in zip(TABLE, got, strict=True) if ok != want]
    assert not wrong, f"{len(wrong)} wrong verdicts (pred, gold, expected): {wrong}"


@pytest.mark.parametrize(("pred", "gold", "want"), TABLE[::9])
def test_is_equivalent_matches_the_batch_helper(pred: str | None, gold: str, want: bool) -> None:
    assert is_equivalent(pred, gold, timeout_s=20.0) is want


def test_percent_variants_can_be_turned_off() -> None:
    """deepseekmath mode: ``percent_variants`` is the reference's ``include_percentage``. On, gold x 100 and gold / 100
    count when both sides are plain decimals; off, a written % is read as / 100 on either side and nothing else (the
    earlier rule let ``18\\%`` match both 18 and 0.18: a free hedge, issue 27)."""
    assert is_equivalent("1800", "18") and is_equivalent("0.18", "18") and is_equivalent("50", "50\\%")
    assert not is_equivalent("1800", "18", percent_variants=False)
    assert not is_equivalent("0.18", "18", percent_variants=False)
    assert is_equivalent("0.5", "50\\%", percent_variants=False)
    assert not is_equivalent("50", "50\\%", percent_variants=False)
    assert is_equivalent("18\\%", "0.18", percent_variants=False)
    assert not is_equivalent("18\\%", "18", percent_variants=False)
    assert not is_equivalent("5000", "50\\%", percent_variants=False)


def test_numbers_use_the_fast_path_without_a_worker() -> None:
    before = answers.stats.copy()
    assert is_equivalent("1,234", "1234") and not is_equivalent("7", "8") and is_equivalent("\\frac{3}{4}", "0.75")
    after = answers.stats
    assert after["fast"] - before["fast"] == 3
    assert after["symbolic"] == before["symbolic"] and after["cached"] == before["cached"]


# ------------------------------------------------------------------------------------------------
# Timeouts off the main thread
# ------------------------------------------------------------------------------------------------

PATHOLOGICAL = "9^{9^{9^{9}}}"  # sympy tries to evaluate a 10^(3.7e8)-digit power: hangs in C code


def test_pathological_check_from_a_thread_times_out() -> None:
    """From a worker thread (where math-verify's signal alarms cannot work) a hanging check returns
    False (its worker killed at the CPU-time limit), and the checker keeps working afterwards."""
    answers.warm_up()
    timeout_s = 2.0
    result: dict[str, object] = {}

    def run() -> None:
        t0 = time.monotonic()
        result["ok"] = is_equivalent(PATHOLOGICAL, "1", timeout_s=timeout_s)
        result["elapsed"] = time.monotonic() - t0

    before = answers.stats["timeout"]
    th = threading.Thread(target=run)
    th.start()
    th.join(timeout_s + 30)
    assert not th.is_alive(), "the check did not return"
    assert result["ok"] is False
    # it returned because the worker's CPU-time limit killed it (counted), not by finishing: no wall-clock bound,
    # which a loaded machine stretches (the worker's CPU time is what the limit counts)
    assert answers.stats["timeout"] == before + 1
    # the killed worker was replaced: a symbolic check still works (and is not cached as False)
    assert is_equivalent("2\\sqrt{2}", "\\sqrt{8}", timeout_s=60.0)


def test_concurrent_checks_from_threads() -> None:
    pairs = [("\\sqrt{12}", "2\\sqrt{3}", True), ("x^2-1", "(x-1)(x+1)", True), ("\\sqrt{12}", "3\\sqrt{2}", False)]
    out: list[tuple[bool, bool]] = []
    lock = threading.Lock()

    def run(p: str, g: str, want: bool) -> None:
        ok = is_equivalent(p, g, timeout_s=60.0)
        with lock:
            out.append((ok, want))

    threads = [threading.Thread(target=run, args=t) for t in pairs * 2]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(out) == 6 and all(ok == want for ok, want in out)


def test_are_equivalent_checks_lengths() -> None:
    with pytest.raises(ValueError):
        are_equivalent(["1"], ["1", "2"])
    assert are_equivalent([], []) == []


def test_the_checker_imports_nothing_of_the_problem_files_module() -> None:
    """No import circle: stages/core/problems.py imports the checker (extract_answer, gsm8k_gold); the checker's
    modules import nothing of it, at module level or inside functions (issue 30)."""
    import ast
    from pathlib import Path

    core = Path(answers.__file__).parent
    for f in [core / "answers.py", *sorted(core.glob("_answers_*.py"))]:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n == "stages.core.problems" for n in names), f"{f.name} imports stages.core.problems"


def test_the_time_limit_is_cpu_time_not_wall_time() -> None:
    """Issue 29: whether a check times out must not depend on the machine's load. A worker that needs 0.3 s of CPU
    time but gets none for 1.5 s (SIGSTOP: what a starved process sees) still answers within a 1 s limit; one that
    spins for good is given up after 1 s of its CPU time."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time\nfor line in sys.stdin:\n    t = time.process_time()\n"
            "    while time.process_time() - t < float(line): pass\n    print('done', flush=True)")
    w = object.__new__(_answers_pool.Worker)
    w.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    w._buf, w._ready, w._next_id = b"", True, 0
    try:
        if w.cpu_s() is None:
            pytest.skip("no /proc: the limit is wall time on this system")
        w.proc.stdin.write(b"0.3\n")
        w.proc.stdin.flush()
        time.sleep(0.05)
        w.proc.send_signal(signal.SIGSTOP)
        threading.Timer(1.5, w.proc.send_signal, (signal.SIGCONT,)).start()
        t0 = time.monotonic()
        assert w._reply(1.0) == b"done"
        assert time.monotonic() - t0 >= 1.4  # it answered after more wall time than the limit
        w.proc.stdin.write(b"1000\n")
        w.proc.stdin.flush()
        t0, c0 = time.monotonic(), w.cpu_s()
        assert w._reply(1.0) is None
        assert 0.95 <= w.cpu_s() - c0 <= 1.5 and time.monotonic() - t0 < 30
    finally:
        w.kill()


@pytest.mark.parametrize("cap", [1, 3])
def test_answers_max_workers_caps_the_checking_pool(cap: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ANSWERS_MAX_WORKERS`` (docs/pipeline.md's table) bounds the workers the pool starts, read when used: warming
    the pool for 8 checks starts ``cap`` workers (counted by a stand-in for the worker process)."""
    started: list[object] = []

    class Fake:
        def __init__(self) -> None:
            started.append(self)

        alive = ready_now = lambda self: True  # noqa: E731
        ensure_ready = kill = lambda self: None  # noqa: E731

    monkeypatch.setattr(_answers_pool, "Worker", Fake)
    monkeypatch.setenv("ANSWERS_MAX_WORKERS", str(cap))
    pool = _answers_pool.Pool()
    pool.warm(8)
    assert len(started) == cap == len(pool._idle)
    pool.close()

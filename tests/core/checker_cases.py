"""The answer checker's case tables (docs/evaluation.md shows them; tests/core/test_answers_modes.py holds every
verdict): the cases issue 27 lists, and the 20 hardest equivalence cases found in public evaluation suites' own tests.

Each case: ``kind`` "answer" (``pred`` is an extracted answer, checked as it is) or "output" (``pred`` is a whole model
output, read by each mode's :func:`~stages.core.answers.final_answers`), ``gold``, ``pv`` (deepseekmath's percent rule,
on for the MATH / GSM8K benchmarks, off for the generated problems and RL rewards) and the verdict of each mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    kind: str
    pred: str
    gold: str
    deepseekmath: str
    strict: str
    pv: bool = True
    source: str = ""
    source_verdict: str | None = None
    """Hard cases: the verdict the source's test expects (math-verify: its expected value; Qwen2.5-Math's grader
    examples carry none: the mathematical truth)."""
    extra: dict = field(default_factory=dict)


R, W, T, F = "right", "wrong", "timeout", "refused"

ISSUE_CASES = [
    Case("A1", "percent variants on a fraction gold", "answer", "0", "\\frac{1}{16}", W, W),
    Case("A2", "percent variants on a fraction gold", "answer", "0", "-\\frac{1}{14}", W, W),
    Case("A3", "percent variants on a fraction gold", "answer", "50", "\\frac12", W, W),
    Case("A4", "the reference's percent rule on plain decimals (kept in deepseekmath)", "answer", "50", "0.5", R, W),
    Case("B1", "absolute tolerance 1e-3 (reference) vs relative", "answer", "\\frac{3}{57}", "\\frac{3}{56}", R, W),
    Case("B2", "0 for a gold below 1e-3 (a MATH test gold)", "answer", "0", "\\frac{1}{5120}", R, W),
    Case("B3", "0 for a gold below 1e-3 (a MATH test gold)", "answer", "0", ".0000672", R, W),
    Case("B4", "RL reward: \\boxed{0} for a gold below 1e-3", "output", "so the answer is \\boxed{0}",
         "\\frac{1}{5120}", R, W, pv=False),
    Case("B5", "18% against 18 (RL rewards, generated problems)", "answer", "18\\%", "18", W, R, pv=False),
    Case("B6", "18% against 0.18 (RL rewards, generated problems)", "answer", "18\\%", "0.18", R, W, pv=False),
    Case("B7", "18% against 18 (MATH: the reference's percent rule on)", "answer", "18\\%", "18", R, R),
    Case("B8", "a gold written with %: its number", "answer", "18", "18\\%", W, R, pv=False),
    Case("C1", "a list of degrees read as one number 45135", "answer", "135, 45", "45^\\circ, 135^\\circ", R, R),
    Case("C2", "the same list, boxed with degrees", "output", "\\boxed{135^\\circ, 45^\\circ}",
         "45^\\circ, 135^\\circ", R, R),
    Case("C3", "the list in the gold's order", "output", "\\boxed{45^\\circ, 135^\\circ}", "45^\\circ, 135^\\circ",
         R, R),
    Case("C4", "different units", "answer", "5\\text{ m}", "5\\text{ cm}", R, W),
    Case("C5", "a unit on one side only", "answer", "5\\text{ cm}", "5", R, R),
    Case("C6", "an interval is not a list", "answer", "(1, 2)", "1, 2", R, W),
    Case("C7", "an interval's brackets", "answer", "[1, 2)", "[1, 2]", W, W),
    Case("E1", "several different final answers in one output", "output",
         "It is \\boxed{3}. No wait, \\boxed{5}.", "5", R, W),
    Case("E2", "the same answer boxed twice, written two ways", "output",
         "So \\boxed{\\frac{1}{2}}, i.e. \\boxed{0.5}.", "\\frac12", R, R),
    Case("E3", "a list gold answered one box per element", "output", "\\boxed{2} and \\boxed{3}", "2, 3", W, R),
    Case("E4", "no answer stated: the last number", "output", "We add 12 and 30 to get 42", "42", R, W),
    Case("D1", "a power tower (sympy evaluates it: hangs)", "answer", "9^{9^{9^9}}", "1", T, T),
    Case("D2", "a PoT program's 20,000-digit answer", "answer", "1234567890" * 2000, "5", F, F),
]
"""Issue 27's cases (what the checker said before, commit 939e700, and the timings: docs/evaluation.md)."""

MV = "huggingface/Math-Verify"
QWEN = "QwenLM/Qwen2.5-Math"
SE = "openai/simple-evals"
PRM = "openai/prm800k"

HARD_CASES = [
    Case("H1", "unordered list of tuples with a repeat", "output",
         "$\\boxed{(3, 37, 3, 13), (3, 17, 3, 7), (3, 3, 2, 3), (3,17,3,7), (17,3,3,7), (37,3,3,13)}$",
         "(37,3,3,13),(17,3,3,7),(3,37,3,13),(3,17,3,7),(3,3,2,3)", R, R, source=f"{MV} tests/test_numina_cases.py",
         source_verdict=R),
    Case("H2", "a named tuple against the tuple", "output", "$(3,2)$", "(p,q)=(3,2)", W, R,
         source=f"{MV} tests/test_numina_cases.py", source_verdict=R),
    Case("H3", "an inequality against its interval", "output", "$x \\in [-2,7]$", "-2 \\le x \\le 7", W, R,
         source=f"{MV} tests/test_all.py", source_verdict=R),
    Case("H4", "plus-minus against the set", "output", "${-2021, 2021}$", "\\pm 2021", W, R,
         source=f"{MV} tests/test_yujianll.py", source_verdict=R),
    Case("H5", "clock times", "output", "$1:00$", "12:00", W, W, source=f"{MV} tests/test_yujianll.py",
         source_verdict=W),
    Case("H6", "a list with 'and'", "output", "$19, 46, \\text{ and } 82$", "19, 46, and 82", W, R,
         source=f"{MV} tests/test_yujianll.py", source_verdict=R),
    Case("H7", "percent written as a word", "output", "$\\boxed{28 percentage}", "28\\%", W, R,
         source=f"{MV} tests/test_all.py", source_verdict=R),
    Case("H8", "nested radicals, denominator reordered", "answer",
         "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{2\\sqrt{33}+15}", "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{15+2\\sqrt{33}}",
         R, R, source=f"{QWEN} evaluation/grader.py (_test_math_equal); {MV} tests/test_all.py", source_verdict=R),
    Case("H9", "an interval with rounded decimals", "output", "$(0.6,2.6667]$", "(\\frac{3}{5},\\frac{8}{3}]", W, W,
         source=f"{MV} tests/test_all.py (precision); {QWEN} evaluation/grader.py", source_verdict=R),
    Case("H10", "|z| bounds against a union of intervals", "output",
         "$z \\in \\left[-\\frac{3}{2}, -1\\right] \\cup \\left[1, \\frac{3}{2}\\right]$", "1\\leq|z|\\leq \\frac{3}{2}",
         W, W, source=f"{MV} tests/test_numina_cases.py", source_verdict=R),
    Case("H11", "a matrix as an array in brackets", "output",
         "Special matrix: $ \\left[\\begin{array}{cc}1 & 2 \\\\3 & 4\\end{array}\\right] $",
         "\\begin{pmatrix}1 & 2 \\\\3 & 4\\end{pmatrix}", W, R, source=f"{MV} tests/test_all.py", source_verdict=R),
    Case("H12", "thousands with LaTeX thin spaces", "output", "is $\\boxed{11,\\! 111,\\! 111,\\! 100}$",
         "11111111100", R, R, source=f"{MV} tests/test_all.py", source_verdict=R),
    Case("H13", "a float printout against a fraction", "answer", "0.0833333333333333", "\\frac{1}{12}", R, R,
         source=f"{QWEN} evaluation/grader.py (_test_math_equal)", source_verdict=R),
    Case("H14", "a tuple with a decimal", "answer", "(1,4.5)", "(1,\\frac{9}{2})", R, R,
         source=f"{QWEN} evaluation/grader.py (_test_math_equal)", source_verdict=R),
    Case("H15", "a trigonometric identity", "answer", "\\sec^2(y)", "\\tan^2(y)+1", R, R,
         source=f"{QWEN} evaluation/grader.py (_test_math_equal)", source_verdict=R),
    Case("H16", "a plane equation times -1", "answer", "-34x-45y+20z-100=0", "34x+45y-20z+100=0", R, R,
         source=f"{QWEN} evaluation/grader.py (_test_math_equal)", source_verdict=R),
    Case("H17", "an exact fraction against a rounded gold", "answer", "\\frac{100}{3}", "33.3", W, W,
         source=f"{QWEN} evaluation/grader.py (_test_math_equal)", source_verdict=R),
    Case("H18", "the golden ratio against 2", "answer", "\\frac{1+\\sqrt{5}}{2}", "2", W, W,
         source=f"{QWEN} evaluation/grader.py (_test_math_equal)", source_verdict=W),
    Case("H19", "degrees as a word", "answer", "72 degrees", "72", R, R,
         source=f"{SE} common.py (EQUALITY_TEMPLATE)", source_verdict=R),
    Case("H20", "a unit on the prediction", "answer", "64 square feet", "64", W, R,
         source=f"{SE} common.py (EQUALITY_TEMPLATE)", source_verdict=R),
    Case("H21", "an unreduced fraction", "answer", "\\frac{2}{4}", "\\frac{1}{2}", R, R,
         source=f"{PRM} prm800k/grading/grader.py (grade_answer: unreduced fractions are wrong)", source_verdict=W),
]
"""The hardest cases we found in public suites' own tests, with the verdict each source expects."""


# Adversarial inputs for the bounded checker (issue 27): {name: (prediction, gold)}. benchmarks/checker_adversarial.py
# times every one in both modes; tests/core/test_answers_modes.py checks the refused ones and the towers.


def nested_radical(depth: int) -> str:
    s = "2"
    for _ in range(depth):
        s = f"\\sqrt{{{s}+\\sqrt{{3}}}}"
    return s


def latex_matrix(n: int, cell: str) -> str:
    return "\\begin{pmatrix}" + "\\\\".join("&".join(cell for _ in range(n)) for _ in range(n)) + "\\end{pmatrix}"


ADVERSARIAL: dict[str, tuple[str, str]] = {
    "tower 9^{9^{9^9}}": ("9^{9^{9^9}}", "1"),
    "tower 2^{2^{2^{2^{2^{2}}}}}": ("2^{2^{2^{2^{2^{2}}}}}", "2"),
    "1 MiB of digits": ("7" * (1 << 20), "7"),
    "20,000 digits (PoT answer)": ("1234567890" * 2000, "5"),
    "nested radical, depth 12": (nested_radical(12), "3"),
    "nested radical, depth 40": (nested_radical(40), "3"),
    "matrix 20x20 of digits": (latex_matrix(20, "1"), latex_matrix(20, "2")),
    "matrix 8x8 of \\frac{1}{3}": (latex_matrix(8, "\\frac{1}{3}"), latex_matrix(8, "\\frac{2}{6}")),
    "matrix 60x60 of 1 (over the limit)": (latex_matrix(60, "1"), latex_matrix(60, "1")),
    "list of 200 numbers": (", ".join(str(i) for i in range(200)), ", ".join(str(i) for i in range(199, -1, -1))),
    "'1.' x 499 + 'x' (regex backtracking)": ("1." * 499 + "x", "1"),
    "999 digits then '.0x'": ("9" * 996 + ".0x", "1"),
    "factorial 10^6!": ("(10^{6})!", "1"),
    "symbolic 100-term sum": ("+".join(f"x^{{{i}}}" for i in range(100)), "+".join(f"x^{{{i}}}" for i in range(99, -1, -1))),
}

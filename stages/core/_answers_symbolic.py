"""The symbolic leaf of the equivalence rules: math-verify, then the reference's sympy fallback.

Imported only inside the checking worker process (:mod:`stages.core._answers_worker`), which is
killed when a check runs past its time limit, so nothing here needs its own timeout: math-verify's
signal-based timeouts are switched off (``timeout_seconds=None``).
"""

from __future__ import annotations

import logging
import math

import sympy
from latex2sympy2_extended import latex2sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from stages.core._answers_rules import compare

logging.getLogger("math_verify").setLevel(logging.ERROR)
logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)

_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


def _as_latex(s: str) -> str:
    """A normalised answer back to LaTeX math-verify reads (``%`` is a LaTeX comment otherwise)."""
    return "$" + s.replace("\\%", "%").replace("%", "\\%") + "$"


def _mv_parse(s: str) -> list:
    return parse(_as_latex(s), extraction_config=_CONFIG, parsing_timeout=None)


def _math_verify(pred: str, gold: str) -> bool:
    try:
        g, p = _mv_parse(gold), _mv_parse(pred)
        if not g or not p:
            return False
        return bool(verify(g, p, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - any parser/sympy failure means "not shown equal"
        return False


def _to_sympy(s: str):
    return latex2sympy(s.replace("%", "/100"))


def _sympy_equal(a_s: str, b_s: str) -> bool:
    """Reference ``symbolic_equal``: ``simplify(a - b) == 0``, or numeric values within 1e-3."""
    try:
        a, b = _to_sympy(a_s), _to_sympy(b_s)
    except Exception:  # noqa: BLE001
        return False
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False
    try:
        if sympy.simplify(a - b) == 0:
            return True
    except Exception:  # noqa: BLE001
        pass
    try:
        va, vb = complex(sympy.N(a)), complex(sympy.N(b))
        return math.isclose(va.real, vb.real, abs_tol=1e-3) and math.isclose(va.imag, vb.imag, abs_tol=1e-3)
    except Exception:  # noqa: BLE001
        return False


def _equations_equal(pred: str, gold: str) -> bool:
    """Reference rule for ``a=b`` vs ``c=d``: ``a-(b)`` equals ``c-(d)`` or its negation."""
    pa, pb = pred.split("=")
    ga, gb = gold.split("=")
    p = f"{pa}-({pb})"
    g = f"{ga}-({gb})"
    return _sympy_equal(p, g) or _sympy_equal(f"-({p})", g)


def symbolic_leaf(pred: str, gold: str) -> bool:
    """True when math-verify or the reference's sympy rules show the two answers equal.

    A ratio or clock time (``3:1``, ``4:30``) is never equal to an answer without ``:`` (math-verify
    reads ``3:1`` as ``3``)."""
    if (":" in pred) != (":" in gold):
        return False
    if _math_verify(pred, gold):
        return True
    if pred.count("=") == 1 and gold.count("=") == 1:
        return _equations_equal(pred, gold)
    if "=" in pred or "=" in gold:
        return False
    return _sympy_equal(pred, gold)


def full_check(pred: str, gold: str, percent_variants: bool = True) -> bool:
    """All rules with the symbolic leaf (what the worker runs for one request)."""
    return compare(pred, gold, symbolic_leaf, percent_variants=percent_variants) is True

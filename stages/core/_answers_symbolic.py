"""The symbolic leaves of the equivalence rules, the full check of each mode, and math-verify's own verdict.

- ``deepseekmath``: math-verify, then the reference's sympy fallback (``simplify(a - b) == 0`` or numeric values
  within 1e-3), under :func:`stages.core._answers_rules.compare`;
- ``strict``: constants compared by value with a relative tolerance (:data:`stages.core._answers_strict.REL_TOL`:
  zero matches only zero), expressions by ``simplify(a - b) == 0``, then math-verify for what sympy cannot read
  (sets, intervals written its way), under :func:`stages.core._answers_strict.compare`;
- :func:`math_verify_verdict`: math-verify alone, with its own extraction from the whole output (the verdict the
  evaluation records beside ours).

Imported only inside the checking worker process (:mod:`stages.core._answers_worker`), which is killed when a check
runs past its deadline, so nothing here needs its own timeout: math-verify's signal-based timeouts are switched off
(``timeout_seconds=None``).
"""

from __future__ import annotations

import logging
import math

import sympy
from latex2sympy2_extended import latex2sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from stages.core import _answers_strict
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


def _const_close(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Two constant expressions equal within the strict relative tolerance (zero matches only zero), by their values
    to 30 digits (no ``simplify``: nested radicals make it slow, and the values decide at this tolerance)."""
    try:
        va, vb = complex(sympy.N(a, 30)), complex(sympy.N(b, 30))
    except Exception:  # noqa: BLE001
        return False
    if not all(math.isfinite(x) for x in (va.real, va.imag, vb.real, vb.imag)):
        return False
    return abs(va - vb) <= _answers_strict.REL_TOL * max(abs(va), abs(vb))


_RELATION = ("<", ">", "\\le", "\\ge", "\\lt", "\\gt", "\\ne", "!=")


def strict_leaf(pred: str, gold: str) -> bool:
    """The strict mode's symbolic question on two normalised values (units and percent signs already removed)."""
    if (":" in pred) != (":" in gold):
        return False
    if any(r in pred or r in gold for r in _RELATION):
        return _math_verify(pred, gold)  # inequalities: math-verify compares relations
    if pred.count("=") == 1 and gold.count("=") == 1:
        return _equations_equal(pred, gold)
    if "=" in pred or "=" in gold:
        return False
    try:
        a, b = _to_sympy(pred), _to_sympy(gold)
    except Exception:  # noqa: BLE001
        a = b = None
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        if not a.free_symbols and not b.free_symbols:
            return _const_close(a, b)
        try:
            if sympy.simplify(a - b) == 0:
                return True
        except Exception:  # noqa: BLE001
            pass
    return _math_verify(pred, gold)


def full_check(pred: str, gold: str, percent_variants: bool = True, mode: str = "deepseekmath") -> bool:
    """All rules of ``mode`` with its symbolic leaf (what the worker runs for one check request)."""
    if mode == "strict":
        return _answers_strict.compare(pred, gold, strict_leaf) is True
    return compare(pred, gold, symbolic_leaf, percent_variants=percent_variants) is True


_MV_TEXT_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


def math_verify_verdict(text: str, gold: str) -> bool | None:
    """math-verify's verdict on a whole output: its own extraction (``parse`` with the LaTeX and expression
    configurations, boxed answers first) against the gold read as LaTeX (``$...$`` unless it carries its own
    delimiters or a ``\\boxed{}``), then ``verify``; None when the gold parses to nothing."""
    try:
        g_text = gold if ("$" in gold or "\\boxed" in gold) else "$" + gold + "$"
        g = parse(g_text, extraction_config=_MV_TEXT_CONFIG, parsing_timeout=None)
        if not g:
            return None
        p = parse(text, extraction_config=_MV_TEXT_CONFIG, parsing_timeout=None)
        return bool(p) and bool(verify(g, p, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a failure inside math-verify is "not shown equal", as math-verify does
        return False

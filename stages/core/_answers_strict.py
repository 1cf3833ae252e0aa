"""The ``strict`` checker mode: answers parsed into structures (lists, sets, tuples, intervals, units, percents)
before they are compared. Pure functions, no sympy: the worker adds the symbolic leaf.

What strict means (the default for RL rewards and the evaluation headline; ``deepseekmath`` keeps the reference's
rules, :mod:`stages.core._answers_rules`):

- **Numbers** compare exactly as rationals (decimals, ``\\frac{a}{b}``, mixed numbers, thousands separators), or within
  a *relative* tolerance ``|p - g| <= REL_TOL * max(|p|, |g|)`` with ``REL_TOL = 1e-6``. Why relative: an absolute
  tolerance (the reference's 1e-3) accepts ``0`` for every gold below 1e-3 in size (``\\frac{1}{5120}``, ``.0000672``)
  and ``\\frac{3}{57}`` for ``\\frac{3}{56}``; a relative one scales with the gold, so it can never turn a non-zero
  gold into zero (``|g| <= 1e-6 |g|`` is false for g != 0: zero matches only zero) and never accepts a different
  small fraction. Why 1e-6: it accepts the float noise of program outputs (``0.30000000000000004``, ``str(1/3)``)
  and decimals written to at least 7 significant digits; a coarser decimal for an exact gold (``0.333`` for
  ``\\frac13``, ``3.14`` for ``\\pi``) is a different answer here.
- **Percent** forms only where the text says percent: a gold written with ``%`` (``18\\%``) accepts ``18``, ``18\\%``
  and ``0.18``; a prediction's ``%`` against a gold without one is a label (``18\\%`` matches ``18``, not ``0.18``:
  no free hedge); without any ``%`` there are no x100 / /100 variants (``1800`` is not ``18``).
- **Lists** at top level (``45^\\circ, 135^\\circ``, ``2\\text{ and }3``) are unordered sets of answers matched one to
  one (after removing repeats); ``\\{1, 2\\}`` is a set; ``(a, b]`` / ``[a, b]`` are ordered tuples or intervals whose
  brackets must agree; ``A \\cup B`` is an unordered union of intervals; matrices compare cell by cell. A thousands
  number (``1,234``, ``1{,}234``) is one number; ``45, 135`` (a space after the comma) is a list.
- **Units and degrees** are parsed off each item (``^\\circ``, ``\\text{ cm}``, ``5 dollars``, ``\\$18``): two
  different units never match (``5\\text{ cm}`` is not ``5\\text{ m}``); a unit on one side only is a label.
- Equations: ``x = 5`` against ``5`` when the left side is a variable of at most two characters (as the reference);
  ``a = b`` against ``c = d`` symbolically (the worker).

Several different final answers in one output (``\\boxed{3} ... \\boxed{5}``) are decided in
:func:`stages.core.answers.check`: right only when every one is right.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from stages.core._answers_norm import bracketed, dedupe, matrix_cells, split_top_level, strip_string

Leaf = Callable[[str, str], "bool | None"]

REL_TOL = 1e-6
"""Relative tolerance of strict number comparison (see the module docstring for why relative and why 1e-6)."""
MAX_ITEMS = 64
"""Most list items / matrix cells the in-process pass compares (the table of an unordered match is quadratic);
longer structures go to the worker, under its deadline."""

# ----------------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------------

_THIN_COMMA = re.compile(r",\\!\s*")
_LATEX_SPACE = re.compile(r"\\(?:[,;:> ]|quad|qquad)")
_LATEX_THOUSANDS = re.compile(r"(?<=\d)\{,\}(?=\d{3})")
_AND = re.compile(r"\s*,?\s*\\(?:text|mbox|textrm)\s*\{\s*(?:and|or)\s*\}\s*|\s+(?:and|or)\s+")
_VAR_IN = re.compile(r"^[a-zA-Z]\s*\\in\s*")
_DEGREE = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree)\s*$")
_TEXT_UNIT = re.compile(r"\s*\\(?:text|mbox|mathrm|textrm)\s*\{\s*([A-Za-z][A-Za-z .]*?)\s*\}\s*(\^\s*\{?[23]\}?)?\s*$")
_WORD_UNIT = re.compile(r"\s+([A-Za-z][A-Za-z]*(?:\s+[A-Za-z]+)?)\s*(\^\s*\{?[23]\}?)?\s*$")
_DOLLAR = re.compile(r"^(-?)\s*\\\$\s*")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")

_UNIT_NAMES = {
    "deg": ("degree", "deg", "circ"),
    "dollar": ("dollar", "usd", "buck"),
    "cent": ("cent",),
    "percent": ("percent", "percentage", "pct"),
    "cm": ("cm", "centimeter", "centimetre"),
    "mm": ("mm", "millimeter", "millimetre"),
    "m": ("m", "meter", "metre"),
    "km": ("km", "kilometer", "kilometre"),
    "inch": ("inch", "in"),
    "foot": ("foot", "feet", "ft"),
    "yard": ("yard", "yd"),
    "mile": ("mile", "mi"),
    "hour": ("hour", "hr", "h"),
    "minute": ("minute", "min"),
    "second": ("second", "sec"),
    "day": ("day",),
    "week": ("week",),
    "year": ("year", "yr"),
    "kg": ("kg", "kilogram"),
    "g": ("gram",),
    "pound": ("pound", "lb"),
    "ounce": ("ounce", "oz"),
    "liter": ("liter", "litre"),
    "mph": ("mph",),
    "unit": ("unit",),
    "squareunit": ("squareunit",),
    "squarefoot": ("squarefoot", "squarefeet", "sqft"),
    "squareinch": ("squareinch",),
    "squaremeter": ("squaremeter",),
    "squarecm": ("squarecentimeter",),
}
_CANON = {alias: name for name, aliases in _UNIT_NAMES.items() for alias in aliases}
_NOT_BARE_WORDS = frozenset({"m", "h", "g", "in", "mi", "s", "deg", "circ", "min", "sec", "unit"})
"""Aliases that are not read as a unit when written after a number without ``\\text{}`` (``2 m`` may be 2m, a
product); inside ``\\text{}`` every word is a unit."""


def _singular(word: str) -> str:
    u = re.sub(r"[\s.\\]", "", word.lower())
    for cand in (u, u[:-2] if u.endswith("es") else u, u[:-1] if u.endswith("s") else u):
        if cand in _CANON:
            return cand
    return u[:-1] if u.endswith("s") and len(u) > 2 else u


def unit_name(text: str) -> str:
    """A unit's canonical name: lower case, no spaces, singular, synonyms merged (``Feet`` -> ``foot``)."""
    w = _singular(text)
    return _CANON.get(w, w)


def _bare_unit(word: str) -> str | None:
    """The canonical unit of a word written after a number (``dollars``, ``cm``), or None when it is no known unit."""
    w = _singular(word)
    return _CANON[w] if w in _CANON and w not in _NOT_BARE_WORDS else None


@dataclass(frozen=True)
class Item:
    """One answer: its value (normalised by ``strip_string``, unit and percent sign removed), unit, percent flag."""

    value: str
    unit: str | None = None
    percent: bool = False


@dataclass(frozen=True)
class Parsed:
    """A parsed answer. ``kind``: ``single`` (one item), ``list`` (top-level commas / "and": unordered), ``set``
    (``\\{..\\}``: unordered), ``tuple`` (brackets ``open``/``close``: ordered), ``union`` (``\\cup``: unordered
    pieces, each a Parsed)."""

    kind: str
    items: tuple
    open: str = ""
    close: str = ""


def prenormalise(raw: str) -> str:
    """The whitespace-preserving clean-up before structure is read: ``$`` wrappers, ``\\left``/``\\right``,
    ``\\dfrac``, LaTeX spacing and ``{,}`` thousands separators, a trailing period, an ``x \\in`` prefix."""
    s = str(raw).strip()
    while len(s) > 1 and s[0] == "$" and s[-1] == "$" and not s.endswith("\\$"):
        s = s[1:-1].strip()
    s = _THIN_COMMA.sub(",", s).replace("\\!", "").replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    for frac in ("\\tfrac", "\\dfrac", "\\cfrac"):
        s = s.replace(frac, "\\frac")
    s = _LATEX_THOUSANDS.sub("", s)
    s = _LATEX_SPACE.sub(" ", s).replace("\n", " ").strip()
    s = s.rstrip(".").strip()
    return _VAR_IN.sub("", s)


def _power(m: re.Match[str], group: int) -> str:
    return re.sub(r"[\s{}]", "", m.group(group) or "")


def parse_item(text: str) -> Item:
    """One item: ``name =`` dropped, percent sign, unit (degrees, ``\\text{..}``, a unit word, a leading ``\\$``)
    and the value."""
    s = strip_name(text.strip())
    unit: str | None = None
    percent = False
    for _ in range(2):  # ``5\\%`` and ``5\\text{ cm}``, each at most once, in either order
        if s.endswith("%") and not percent:
            s, percent = s[: -2 if s.endswith("\\%") else -1].rstrip(), True
            continue
        if unit is not None:
            break
        m = _DEGREE.search(s)
        if m is not None and m.start() > 0:
            s, unit = s[: m.start()], "deg"
            continue
        m = _TEXT_UNIT.search(s)
        if m is not None and m.start() > 0:
            s, unit = s[: m.start()], unit_name(m.group(1)) + _power(m, 2)
            continue
        m = _WORD_UNIT.search(s)
        name = _bare_unit(m.group(1)) if m is not None and m.start() > 0 else None
        if m is not None and name is not None:
            s, unit = s[: m.start()], name + _power(m, 2)
            continue
        break
    m = _DOLLAR.match(s)
    if m is not None and unit is None:
        s, unit = m.group(1) + s[m.end() :], "dollar"
    if unit == "percent":
        unit, percent = None, True
    return Item(strip_string(s), unit, percent)


def _split_list(s: str) -> list[str]:
    parts: list[str] = []
    for piece in _AND.split(s):
        parts.extend(p.strip() for p in split_top_level(piece, ","))
    return [p for p in parts if p]


_SUBSCRIPT = re.compile(r"_(?:\{[^{}]*\}|\w)")
_NOT_A_NAME = re.compile(r"[\d+\-*/^<>=!]|\\(?:[lg]eq?|neq|ne|lt|gt|pm|mp|times|cdot)(?![A-Za-z])")


def is_name(lhs: str) -> bool:
    """The left side of ``L = value`` names what the value is (``x``, ``(p, q)``, ``f(x)``, ``|AB|``,
    ``\\frac{NO}{BO}``, ``V_1 : V_2``): no digits outside subscripts, no arithmetic or relation signs."""
    t = _SUBSCRIPT.sub("", lhs.strip())
    return bool(t) and _NOT_A_NAME.search(t) is None


def strip_name(s: str) -> str:
    """``L = v`` -> ``v`` when L is a name (:func:`is_name`) and there is one ``=``; anything else unchanged."""
    if s.count("=") == 1 and not any(r in s for r in ("<=", ">=", "!=", "\\le", "\\ge", "\\ne")):
        lhs, _, rhs = s.partition("=")
        if rhs.strip() and is_name(lhs):
            return rhs.strip()
    return s


_LT = r"(<=|<|\\leq?(?![a-z])|\\lt(?![a-z]))"
_GT = r"(>=|>|\\geq?(?![a-z])|\\gt(?![a-z]))"
_CHAIN = re.compile(r"^(.+?)\s*" + _LT + r"\s*([^<>=]+?)\s*" + _LT + r"\s*(.+)$")
_ONE = re.compile(r"^([^<>=]+?)\s*(?:" + _LT + "|" + _GT + r")\s*([^<>=]+)$")


_VARIABLE = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?(?:\([A-Za-z]\))?")


def _closed(rel: str) -> bool:
    return "=" in rel or "e" in rel  # <=, >=, \le, \leq, \ge, \geq


def interval_of(s: str) -> str | None:
    """An inequality on one variable (``x``, ``a_1``, ``f(x)``; not ``|z|``) as the interval it describes: ``-2 \\le x < 7`` -> ``[-2, 7)``, ``x \\ge 5`` ->
    ``[5, \\infty)``, ``x < 3`` -> ``(-\\infty, 3)``; None for anything else."""
    m = _CHAIN.match(s)
    if m is not None and _VARIABLE.fullmatch(m.group(3)) and not is_name(m.group(1)) and not is_name(m.group(5)):
        return ("[" if _closed(m.group(2)) else "(") + f"{m.group(1)}, {m.group(5)}" + (
            "]" if _closed(m.group(4)) else ")")
    m = _ONE.match(s)
    if m is None or not _VARIABLE.fullmatch(m.group(1).strip()) or is_name(m.group(4)):
        return None
    lt, gt, b = m.group(2), m.group(3), m.group(4)
    if lt is not None:
        return f"(-\\infty, {b}" + ("]" if _closed(lt) else ")")
    return ("[" if _closed(gt) else "(") + f"{b}, \\infty)"


def parse(raw: str) -> Parsed:
    """The structure of one answer (see :class:`Parsed`); an inequality on one name is read as its interval, and
    ``\\pm a`` as the set ``{-a, a}``."""
    s = strip_name(prenormalise(raw))
    s = interval_of(s) or s
    if s.startswith("\\pm") and "," not in s:
        v = s[3:].strip()
        return Parsed("set", (parse_item("-" + v), parse_item(v)))
    if "," in s and ", " not in s:
        whole = parse_item(s)  # one number with thousands separators, maybe with a unit: ``\\$15,000``
        if _THOUSANDS.fullmatch(whole.value):
            return Parsed("single", (Item(whole.value.replace(",", ""), whole.unit, whole.percent),))
    if "\\cup" in s:
        pieces = [p.strip() for p in s.split("\\cup")]
        if len(pieces) > 1 and all(pieces):
            return Parsed("union", tuple(parse(p) for p in pieces))
    if s.startswith("\\{") and s.endswith("\\}") or s.startswith("{") and s.endswith("}") and "," in s:
        inner = s[2:-2] if s.startswith("\\{") else s[1:-1]
        if s.startswith("\\{") or len(split_top_level(inner, ",")) > 1:
            return Parsed("set", tuple(parse_item(x) for x in _split_list(inner)))
    b = bracketed(s)
    if b is not None:
        return Parsed("tuple", tuple(parse_item(x) for x in split_top_level(b[1], ",")), b[0], b[2])
    parts = _split_list(s)
    if len(parts) > 1:
        return Parsed("list", tuple(parse_item(x) for x in parts))
    return Parsed("single", (parse_item(s),))


# ----------------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------------

_NUM = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?")
_FRAC = re.compile(r"([+-]?)\\frac\{([+-]?(?:\d+\.?\d*|\.\d+))\}\{([+-]?(?:\d+\.?\d*|\.\d+))\}")
_MIXED = re.compile(r"([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")


def exact_number(value: str) -> Fraction | None:
    """A normalised value as an exact rational (decimals, ``1e-5``, thousands separators, ``\\frac{a}{b}`` with
    numeric a and b, mixed numbers), or None. Exponents are at most three digits (no 10^(10^9) in-process)."""
    s = value.strip()
    if not s or len(s) > 64:
        return None
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    try:
        if _NUM.fullmatch(s):
            return Fraction(s)
        m = _FRAC.fullmatch(s)
        if m is not None:
            den = Fraction(m.group(3))
            if den == 0:
                return None
            v = Fraction(m.group(2)) / den
            return -v if m.group(1) == "-" else v
        m = _MIXED.fullmatch(s)
        if m is not None and int(m.group(4)) != 0:
            v = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
            return -v if m.group(1) == "-" else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


def close(p: Fraction, g: Fraction) -> bool:
    """Equal, or within :data:`REL_TOL` of each other relative to the larger magnitude (zero matches only zero)."""
    return p == g or abs(p - g) <= Fraction(REL_TOL) * max(abs(p), abs(g))


# ----------------------------------------------------------------------------------------------
# Rules (three-valued: True, False, or None = the symbolic leaf must decide)
# ----------------------------------------------------------------------------------------------


def _all3(results: list[bool | None]) -> bool | None:
    if any(r is False for r in results):
        return False
    return None if any(r is None for r in results) else True


def _any3(results: list[bool | None]) -> bool | None:
    if any(r is True for r in results):
        return True
    return None if any(r is None for r in results) else False


def _eq_value(p: str, g: str, leaf: Leaf, fast: bool) -> bool | None:
    """Two unit-free, percent-free normalised values."""
    if p == g:
        return True
    if not p or not g:
        return False
    pn, gn = exact_number(p), exact_number(g)
    if pn is not None and gn is not None:
        return close(pn, gn)
    mp, mg = matrix_cells(p), matrix_cells(g)
    if mp is not None or mg is not None:
        if mp is None or mg is None:
            return leaf(p, g) if not fast else None
        if len(mp) != len(mg) or any(len(a) != len(b) for a, b in zip(mp, mg, strict=True)):
            return False
        cells = [(a, b) for ra, rb in zip(mp, mg, strict=True) for a, b in zip(ra, rb, strict=True)]
        if fast and len(cells) > MAX_ITEMS:
            return None
        out: list[bool | None] = []
        for a, b in cells:
            r = _eq_value(strip_string(a), strip_string(b), leaf, fast)
            if r is False:
                return False
            out.append(r)
        return _all3(out)
    # ``x = 5`` against ``5`` (a name on the left: :func:`is_name`), either way round; normalised values have no spaces
    if p.count("=") == 1 and "=" not in g and is_name(p.split("=")[0]):
        return _eq_value(p.split("=")[1].strip(), g, leaf, fast)
    if g.count("=") == 1 and "=" not in p and is_name(g.split("=")[0]):
        return _eq_value(p, g.split("=")[1].strip(), leaf, fast)
    return leaf(p, g)


def eq_item(p: Item, g: Item, leaf: Leaf, fast: bool = False) -> bool | None:
    """Two items: units, percent, then the values."""
    if p.unit is not None and g.unit is not None and p.unit != g.unit:
        return False
    pn, gn = exact_number(p.value), exact_number(g.value)
    if pn is not None and gn is not None:
        if g.percent:
            return close(pn, gn) or (not p.percent and close(pn * 100, gn))
        return close(pn, gn)
    return _eq_value(p.value, g.value, leaf, fast)


def _match_unordered(ps: list, gs: list, eq: Callable, fast: bool) -> bool | None:
    """One-to-one: every prediction matches a gold and every gold a prediction (repeats removed first)."""
    ps, gs = dedupe(list(ps)), dedupe(list(gs))
    if len(ps) != len(gs):
        return False
    if fast and len(ps) > MAX_ITEMS:
        return None
    table = [[eq(p, g) for g in gs] for p in ps]
    rows = [_any3(row) for row in table]
    cols = [_any3([table[i][j] for i in range(len(ps))]) for j in range(len(gs))]
    return _all3(rows + cols)


def compare_parsed(p: Parsed, g: Parsed, leaf: Leaf, fast: bool = False) -> bool | None:
    """Two parsed answers (three-valued)."""

    def eq(a: Item, b: Item) -> bool | None:
        return eq_item(a, b, leaf, fast)

    if p.kind == "single" and g.kind == "single":
        return eq(p.items[0], g.items[0])
    unordered = ("list", "set")
    if p.kind in unordered and g.kind in unordered:
        return _match_unordered(list(p.items), list(g.items), eq, fast)
    if p.kind == "tuple" and g.kind == "tuple":
        if (p.open, p.close) != (g.open, g.close) or len(p.items) != len(g.items):
            return False
        if fast and len(p.items) > MAX_ITEMS:
            return None
        out: list[bool | None] = []
        for a, b in zip(p.items, g.items, strict=True):
            r = eq(a, b)
            if r is False:
                return False
            out.append(r)
        return _all3(out)
    if p.kind == "union" and g.kind == "union":
        return _match_unordered(list(p.items), list(g.items), lambda a, b: compare_parsed(a, b, leaf, fast), fast)
    return False  # different structures: a list is not a tuple, an interval is not a number


def compare(pred: str, gold: str, leaf: Leaf, fast: bool = False) -> bool | None:
    """Strict equivalence of two raw (un-normalised) answers; ``fast``: bounded in-process pass (a leaf that cannot
    decide cheaply returns None, long structures return None)."""
    if not pred.strip() or not gold.strip():
        return False
    return compare_parsed(parse(pred), parse(gold), leaf, fast)


def key(pred: str) -> str:
    """A canonical text of a raw answer for grouping votes (maj@k): numbers by exact value, lists and sets sorted,
    tuples in order with their brackets, units kept; two answers with the same key are strictly equivalent."""
    return _key_parsed(parse(pred))


def _key_item(it: Item) -> str:
    n = exact_number(it.value)
    v = f"#{n}" if n is not None else it.value
    return v + ("%" if it.percent else "") + (f"[{it.unit}]" if it.unit else "")


def _key_parsed(p: Parsed) -> str:
    if p.kind == "single":
        return _key_item(p.items[0])
    if p.kind in ("list", "set"):
        return "{" + ",".join(sorted(set(_key_item(i) for i in p.items))) + "}"
    if p.kind == "tuple":
        return p.open + ",".join(_key_item(i) for i in p.items) + p.close
    return "U(" + ";".join(sorted(set(_key_parsed(x) for x in p.items))) + ")"

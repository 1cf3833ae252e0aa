"""String-level answer normalisation shared by the main process and the checking worker.

Pure functions, no sympy: importing this module is cheap. The public entry points live in
:mod:`stages.core.answers`; this module holds ``strip_string`` (the DeepSeekMath normalisation) and
the small parsers the equivalence rules use (plain numbers, top-level splitting, brackets, matrices).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# ----------------------------------------------------------------------------------------------
# strip_string: the DeepSeekMath answer normalisation (evaluation/data_processing/answer_extraction.py)
# ----------------------------------------------------------------------------------------------

_TEXT_UNIT_AT_END = re.compile(r"\\(?:text|mbox|mathrm)\s*\{([^{}]*)\}(?:\^\{?[23]\}?)?\s*$")
_CM_UNITS = re.compile(r"\{(?:c|m)?m\}(?:\^(?:2|3))?")
_PM_AT_END = re.compile(r"p\.m\.$")
_DIGIT_T_AT_END = re.compile(r"(\d)\s*t$")
_VAR_IN_PREFIX = re.compile(r"^[a-zA-Z]\s*\\in\s*")
_TRAILING_ZEROS_MID = re.compile(r"(?<!\d)(\d+)\.0+(?=\D)")  # lookbehind: one attempt per digit run (linear)
_TRAILING_ZEROS_END = re.compile(r"(?<!\d)(\d+)\.0+$")
_SQRT_BARE = re.compile(r"\\sqrt(-?[0-9.a-zA-Z]+)")
_SQRT_SPACE = re.compile(r"\\sqrt\s+(\w+)")
_TAN_BARE = re.compile(r"\\tan(-?[0-9.a-zA-Z]+)")
_TAN_SPACE = re.compile(r"\\tan\s+(\w+)")
_MBOX = re.compile(r"\\mbox\{[^{}]*\}")
_LATEX_SPACES = re.compile(r"(?<!\\)\\(?:[,;:> ]|quad|qquad)")
# A space is dropped unless it separates a LaTeX command from a following letter (``\sin x``).
_SPACES = re.compile(r"\s+")
_CMD_SPACE_LETTER = re.compile(r"(\\[a-zA-Z]+) (?=[a-zA-Z])")
# ``45, 135`` (two answers) must not become ``45,135`` (one number with a thousands separator): a comma followed by
# a space and exactly three digits keeps its space
_THIN_COMMA = re.compile(r",\\!\s*")
_LIST_COMMA = re.compile(r"(?<=\d),\s+(?=\d{3}(?!\d))")


def _matching_brace(s: str, open_idx: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_idx``, or -1 when unbalanced."""
    depth = 0
    for i in range(open_idx, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _unwrap_text(s: str) -> str:
    """``\\text{abc}`` (one group spanning the whole string) -> ``abc``; anything else unchanged."""
    for cmd in ("\\text{", "\\textbf{", "\\mbox{"):
        if s.startswith(cmd) and _matching_brace(s, len(cmd) - 1) == len(s) - 1:
            return s[len(cmd) : -1]
    return s


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``, ``\\frac{a}b`` -> ``\\frac{a}{b}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{"):
            close = _matching_brace(part, 0)
            rest = part[close + 1 :] if close >= 0 else ""
            if close >= 0 and rest and rest[0] not in "{\\" and rest[0].isalnum():
                part = part[: close + 1] + "{" + rest[0] + "}" + rest[1:]
            out += part
            continue
        if len(part) < 2:
            return s  # malformed (``\frac1``): leave the string alone
        a, b, rest = part[0], part[1], part[2:]
        if b == "{":
            out += "{" + a + "}" + b + rest
        else:
            out += "{" + a + "}{" + b + "}" + rest
    return out


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are integers (or contain ``sqrt``)."""
    pieces = s.split("/")
    if len(pieces) != 2:
        return s
    a, b = pieces
    int_re = re.compile(r"-?\d+")
    ok_a = "sqrt" in a or (int_re.fullmatch(a) is not None and str(int(a)) == a)
    ok_b = "sqrt" in b or (int_re.fullmatch(b) is not None and str(int(b)) == b)
    if ok_a and ok_b and a and b:
        return "\\frac{" + a + "}{" + b + "}"
    return s


def strip_string(s: object) -> str:
    """Normalise an answer string the way DeepSeekMath's ``strip_string`` does.

    Steps, in the reference order: drop line breaks, a trailing ``.`` and ``\\!``; unwrap a whole
    ``\\text{...}``; map ``\\tfrac``/``\\dfrac``/``\\cfrac`` to ``\\frac``; drop ``\\left``/``\\right``;
    drop a trailing ``\\text{unit}`` (when something remains), degrees (``^\\circ``), ``{cm}``-style
    units, ``p.m.``, ``$`` and ``\\$``, an ``x \\in`` prefix; ``\\%`` -> ``%``; ``.5`` -> ``0.5``;
    ``infinity``/``inf`` -> ``\\infty``; drop ``\\mathbf``/``\\mathrm``/``\\mbox{..}``; ``j`` -> ``i``
    when there is no ``i``; ``2.000`` -> ``2``; ``\\sqrt2`` -> ``\\sqrt{2}``; remove spaces;
    ``\\frac12`` -> ``\\frac{1}{2}``; ``3/4`` -> ``\\frac{3}{4}``; drop trailing ``\\``, ``,``, ``.``.

    Departures from the reference (each makes equal answers compare equal more often, never less):
    ``\\cdot`` is kept (the reference deletes it, turning ``2\\cdot 9`` into ``29``); LaTeX spacing
    commands (``\\,``, ``\\;``, ``\\quad``) and ``{,}`` thousands separators are normalised; a space
    between a command and a letter is kept (``\\sin x`` stays parseable); the ``x \\in`` prefix is
    recognised with spaces; a whole ``\\text{..}`` is unwrapped only when it is one balanced group;
    a trailing unit may carry ``^2``/``^3`` (``440\\text{ cm}^2``); ``\\sqrt 2`` is fixed anywhere,
    not only at the end; a whole ``$...$`` is unwrapped first; a comma followed by a space and three digits keeps
    its space (``45^\\circ, 135^\\circ`` is the list ``45, 135``, not the number 45135 the reference reads).
    Every regex here runs in linear time (no nested quantifier can backtrack over a long digit run), and callers
    refuse answers longer than ``answers.MAX_ANSWER_CHARS`` before calling it.
    The function is idempotent on the MATH test answers (a test).
    """
    s = _strip_markup(str(s))
    s = _strip_units(s)
    s = _TRAILING_ZEROS_MID.sub(r"\1", s)
    s = _TRAILING_ZEROS_END.sub(r"\1", s)
    s = s.strip()
    if not s:
        return s
    return _canonical_form(s)


def _strip_markup(s: str) -> str:
    """strip_string's first steps: line breaks, a trailing ``.``, a whole ``$...$``, LaTeX spacing and thousands
    separators, ``\\displaystyle``, a whole ``\\text{..}``, the ``\\frac`` variants, ``\\left`` / ``\\right``."""
    s = s.strip()
    s = s.replace("\n", "").replace("\r", "")
    s = s.rstrip(".")
    if len(s) > 1 and s[0] == "$" and s[-1] == "$" and not s.endswith("\\$"):
        s = s.strip("$").strip()  # a whole ``$...$`` (``The answer is $x$.``)
    s = _THIN_COMMA.sub(",", s)  # ``11,\\! 111`` (LaTeX's thousands separator, then source spacing)
    s = s.replace("\\!", "")
    s = s.replace("{,}", ",")
    s = _LATEX_SPACES.sub(" ", s).strip()
    s = s.replace("\\displaystyle", "")
    s = _unwrap_text(s.strip())
    for frac in ("tfrac", "dfrac", "cfrac"):
        s = s.replace(frac, "frac")
    return s.replace("\\left", "").replace("\\right", "")


def _strip_units(s: str) -> str:
    """strip_string's next steps: a trailing unit, degrees, ``{cm}``-style units, ``p.m.``, dollars, an ``x \\in``
    prefix; ``\\%``, ``.5``, infinity, ``\\mathbf`` / ``\\mathrm`` / ``\\mbox``, ``j`` for ``i``."""
    m = _TEXT_UNIT_AT_END.search(s)
    if m is not None:
        rest = s[: m.start()].strip()
        if rest:
            s = rest
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "").strip()
    s = _CM_UNITS.sub("", s).strip()
    s = _PM_AT_END.sub("", s).strip()
    s = _DIGIT_T_AT_END.sub(r"\1", s).strip()
    s = s.replace("\\$", "").replace("$", "")
    s = _VAR_IN_PREFIX.sub("", s.strip())
    s = s.replace("\\%", "%")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.replace("infinity", "\\infty")
    if "\\infty" not in s:
        s = s.replace("inf", "\\infty")
    s = s.replace("\\mathbf", "").replace("\\mathrm", "")
    s = _MBOX.sub("", s)
    if "j" in s and "i" not in s:
        s = s.replace("j", "i")
    return s


def _canonical_form(s: str) -> str:
    """strip_string's last steps on a non-empty string: a leading ``.``, ``\\sqrt2`` / ``\\tan2`` braced, spaces
    removed (but between a command and a letter, and in a list's ``, ddd``), fractions braced, ``a/b`` as
    ``\\frac``, trailing ``\\``, ``,``, ``.`` dropped."""
    if s[0] == ".":
        s = "0" + s
    s = _SQRT_BARE.sub(r"\\sqrt{\1}", s)
    s = _SQRT_SPACE.sub(r"\\sqrt{\1}", s)
    s = _TAN_BARE.sub(r"\\tan{\1}", s)
    s = _TAN_SPACE.sub(r"\\tan{\1}", s)
    s = _SPACES.sub(" ", s)
    s = _CMD_SPACE_LETTER.sub(r"\1\0", s)  # protect ``\cmd x`` with a NUL while spaces are removed
    s = _LIST_COMMA.sub(",\0", s)
    s = s.replace(" ", "").replace("\0", " ")
    s = _fix_fracs(s)
    s = _fix_a_slash_b(s)
    return s.rstrip("\\,.")


# ----------------------------------------------------------------------------------------------
# Plain numbers (the fast path)
# ----------------------------------------------------------------------------------------------

_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_SIMPLE = r"[+-]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.?\d*|\.\d+)"
_FRAC = re.compile(r"([+-]?)\\frac\{(" + _SIMPLE + r")\}\{(" + _SIMPLE + r")\}")
_MIXED = re.compile(r"([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")


def is_thousands_number(s: str) -> bool:
    """True for ``1,000`` / ``-12,345.5`` style numbers (commas every three digits)."""
    return _THOUSANDS.fullmatch(s) is not None


def parse_number(s: str) -> float | None:
    """Value of a plain number in a *normalised* answer, or None.

    Accepts integers, decimals, ``1e5``, thousands separators (``1,000``, only in groups of three),
    a trailing ``%`` (value / 100, as the reference's ``parse_digits``), ``\\frac{a}{b}`` with numeric
    a and b, and mixed numbers ``2\\frac{1}{3}`` (= 2 + 1/3). Non-finite values give None.
    """
    s = s.strip()
    if not s or len(s) > 64:
        return None
    pct = s.endswith("%")
    if pct:
        s = s[:-1]
        if s.endswith("\\"):
            s = s[:-1]
    if is_thousands_number(s):
        s = s.replace(",", "")
    value: float | None = None
    if _DECIMAL.fullmatch(s):
        try:
            value = float(s)
        except ValueError:
            return None
    else:
        m = _FRAC.fullmatch(s)
        if m is not None:
            den = float(m.group(3).replace(",", ""))
            if den == 0:
                return None
            value = float(m.group(2).replace(",", "")) / den * (-1.0 if m.group(1) == "-" else 1.0)
        else:
            m = _MIXED.fullmatch(s)
            if m is not None and int(m.group(4)) != 0:
                v = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
                value = float(-v if m.group(1) == "-" else v)
    if value is None or not math.isfinite(value):
        return None
    return value / 100.0 if pct else value


_DIGITS = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\\?%?")


def is_digits(s: str) -> bool:
    """The reference's ``is_digit``: a plain decimal once commas are removed, with an optional trailing ``%`` (not
    ``\\frac{a}{b}``, not a mixed number)."""
    return len(s) <= 64 and _DIGITS.fullmatch(s.replace(",", "")) is not None


def numbers_close(pred: str, gold: str, *, percent_variants: bool = True, abs_tol: float = 1e-3) -> bool | None:
    """Numeric rule for two normalised answers; None when either is not a plain number.

    The reference's ``math_equal``: ``isclose(pred, ref, abs_tol=1e-3)`` with a written ``%`` read as /100 on
    either side; ``percent_variants=True`` (``include_percentage``) also tries gold/100 and gold*100, only when both
    sides are plain decimals as in the reference (``is_digit``): a ``\\frac`` gold has no percent forms (tried on
    it, they would let ``0`` match ``\\frac{1}{16}`` and ``50`` match ``\\frac12``). ``False``
    (``include_percentage=False``): the gold only (``18\\%`` is 0.18, which matches 0.18 and not 18: the earlier
    "a written % may be dropped" rule let ``18\\%`` match both, a free hedge).
    """
    pv, gv = parse_number(pred), parse_number(gold)
    if pv is None or gv is None:
        return None
    refs = [gv / 100.0, gv, gv * 100.0] if percent_variants and is_digits(pred) and is_digits(gold) else [gv]
    return any(math.isclose(pv, r, rel_tol=1e-9, abs_tol=abs_tol) for r in refs)


# ----------------------------------------------------------------------------------------------
# Structure: top-level splitting, brackets, matrices
# ----------------------------------------------------------------------------------------------

_OPEN = "([{"
_CLOSE = ")]}"


def split_top_level(s: str, sep: str) -> list[str]:
    """Split on ``sep`` where it is not nested inside ``()[]{}``."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def bracketed(s: str) -> tuple[str, str, str] | None:
    """``(a,b]`` -> ``("(", "a,b", "]")`` when the outer brackets enclose the whole string and the
    inside has a top-level comma; otherwise None. ``\\{..\\}`` sets are not tuples (None)."""
    if len(s) < 3 or s[0] not in "([" or s[-1] not in ")]":
        return None
    inner = s[1:-1]
    depth = 0
    for c in inner:  # the first bracket must close at the very end
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
    if depth != 0 or len(split_top_level(inner, ",")) < 2:
        return None
    return s[0], inner, s[-1]


_MATRIX = re.compile(r"\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}", re.S)


def matrix_cells(s: str) -> list[list[str]] | None:
    """Cells of a ``pmatrix``/``bmatrix`` (rows split on ``\\\\``, cells on ``&``), or None."""
    m = _MATRIX.fullmatch(s.strip())
    if m is None:
        return None
    rows = [r.strip() for r in m.group(2).split("\\\\") if r.strip()]
    return [[c.strip() for c in r.split("&")] for r in rows]


_AND_SEP = re.compile(r",?\\text\{\s*(?:and|or)\s*\}")


def split_answers(s: str) -> list[str]:
    """Multiple answers in one normalised string: top-level commas (unless it is one thousands
    number) and ``\\text{and}``; a single answer gives a one-element list."""
    s = s.strip()
    if is_thousands_number(s) or bracketed(s) is not None:
        return [s]
    parts: list[str] = []
    for piece in _AND_SEP.split(s):
        parts.extend(p.strip() for p in split_top_level(piece, ","))
    parts = [p for p in parts if p]
    return parts or [s]


def dedupe(items: list[str]) -> list[str]:
    """Remove repeats, keeping the first occurrence (the reference de-duplicates answer lists)."""
    out: list[str] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out

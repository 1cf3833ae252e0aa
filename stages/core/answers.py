"""Answer extraction and equivalence: the one answer checker (evaluation, RL rewards, SFT data checks, the report).

Public API (other stages code against these names):

- :func:`extract_answer` ``(text, benchmark="math") -> str | None``: the reference extraction order
  (Minerva ``final answer is $...$. I hope``, the last ``\\boxed{}`` with nested braces,
  ``he answer is``, the last ```` ```output ```` block, the last number), then :func:`strip_string`.
- :func:`extract_answers`: every candidate of the first rule that matches (all boxed answers, say).
- :func:`final_answers` ``(text, benchmark, mode) -> list[str]``: what a checker mode reads as the prediction of a
  whole output (``deepseekmath``: the one answer above; ``strict``: every distinct final answer, no last-number
  fallback).
- :func:`check` ``(pred, gold, *, mode, timeout_s) -> Outcome``: ``right``, ``wrong``, ``timeout`` (the deadline
  passed: never right, counted on its own) or ``refused`` (a prediction over :data:`MAX_ANSWER_CHARS`, refused
  before any normalisation). :func:`check_many` for many pairs at once.
- :func:`is_equivalent` / :func:`are_equivalent`: the same as booleans (``right`` or not).
- :func:`math_verify_many`: math-verify's own verdict on whole outputs (its extraction and ``verify``), under
  the same deadlines: the verdict the evaluation records beside ours.
- :func:`answer_key`: a canonical text per prediction for grouping maj@k votes (no pairwise checks).
- :func:`gsm8k_gold` ``(answer_field) -> str``: the gold after ``#### ``, commas removed (the GSM8K file
  readers in :mod:`stages.core.problems` use it; this module imports nothing of that one).
- :func:`strip_string`: the DeepSeekMath normalisation (see :mod:`stages.core._answers_norm`).
- :func:`warm_up` / :func:`shutdown`: start / stop the worker processes explicitly (optional).

Checker modes (:data:`MODES`, chosen per use in params.yaml: ``grpo.reward.checker``,
``evaluate.common.checker``): ``deepseekmath`` is the reference evaluator's rules (to compare with the paper's
tables), with the bugs that docs/evaluation.md lists fixed; ``strict`` (:mod:`stages.core._answers_strict`) is
the default for RL rewards and the evaluation headline. docs/evaluation.md has the table of cases in both modes.

Bounded checking: a prediction longer than :data:`MAX_ANSWER_CHARS` is refused before it is normalised; what the
calling process does itself is bounded (linear-time regexes on at most that many characters, at most
:data:`~stages.core._answers_rules.MAX_ITEMS` list items); everything else runs in a worker process under a
deadline (:mod:`stages.core._answers_pool`). Outcomes are cached per (mode, prediction, gold), timeouts too (with
the deadline they had: a longer deadline tries again).
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from stages.core import _answers_pool, _answers_strict
from stages.core._answers_norm import _matching_brace, is_thousands_number, parse_number
from stages.core._answers_norm import strip_string as _strip_string
from stages.core._answers_rules import compare, never

__all__ = [
    "CHECKER_VERSION",
    "MAX_ANSWER_CHARS",
    "MODES",
    "OUTCOMES",
    "answer_key",
    "are_equivalent",
    "check",
    "check_many",
    "extract_answer",
    "extract_answers",
    "final_answers",
    "gsm8k_gold",
    "is_equivalent",
    "math_verify_many",
    "shutdown",
    "strip_string",
    "warm_up",
]

BENCHMARKS = ("math", "gsm8k")
Mode = Literal["deepseekmath", "strict"]
MODES: tuple[str, ...] = ("deepseekmath", "strict")
Outcome = Literal["right", "wrong", "timeout", "refused"]
RIGHT, WRONG, TIMEOUT, REFUSED = "right", "wrong", "timeout", "refused"
NO_GOLD = "no_gold"
"""math_verify_many only: math-verify could not read the gold."""
OUTCOMES: tuple[str, ...] = (RIGHT, WRONG, TIMEOUT, REFUSED)
CHECKER_VERSION = "2"
"""Bumped whenever a verdict of either mode changes (recorded in every evaluation result)."""
MAX_ANSWER_CHARS = 1000
"""A prediction longer than this is refused before normalisation (the longest MATH test gold is 81 characters)."""
MAX_CANDIDATES = 8
"""strict: an output with more distinct final answers than this is wrong without checking them."""
MAX_TEXT_CHARS = 200_000
"""math-verify's own verdict: an output longer than this is refused."""


def strip_string(s: object) -> str:
    """DeepSeekMath answer normalisation (``answer_extraction.strip_string``); see ``_answers_norm``."""
    return _strip_string(s)


def gsm8k_gold(answer_field: str) -> str:
    """The GSM8K gold answer: the text after ``#### `` with commas removed (``2,125`` -> ``2125``)."""
    s = str(answer_field)
    if "####" not in s:
        raise ValueError("GSM8K answer field has no '####' line")
    return s.split("####")[-1].strip().replace(",", "")


# ----------------------------------------------------------------------------------------------
# Extraction (linear time in the output's length: no regex that can backtrack over it)
# ----------------------------------------------------------------------------------------------

_MINERVA_OPEN = "final answer is $"
_MINERVA_CLOSE = "$. I hope"
_ANSWER_IS = "he answer is"
_LAST_NUMBER = re.compile(r"-?\d*\.?\d+")
_BOXED_BARE = re.compile(r"boxed[ \t]+([^\s${}]+)")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each ``{`` -> its matching ``}`` (one pass with a stack; unmatched braces are left out)."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (nested braces matched), in order; a ``%`` right after the
    closing brace is kept (``\\boxed{50}\\%`` -> ``50%``). ``\\boxed 5`` is read as ``5``."""
    found: list[str] = []
    pairs: dict[int, int] | None = None
    many = len(text) > 4096 and text.count("boxed") > 8
    start = 0
    while True:
        i = text.find("boxed", start)
        if i < 0:
            break
        start = i + 5
        j = i + 5
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            if pairs is None and many:
                pairs = _brace_pairs(text)  # one pass for all of them: each scan could run to the end (quadratic)
            k = pairs.get(j, -1) if pairs is not None else _matching_brace(text, j)
            if k >= 0:
                content = text[j + 1 : k]
                after = text[k + 1 : k + 3]
                if after.startswith("%") or after.startswith("\\%"):
                    content += "%"
                found.append(content)
                start = k + 1
        else:
            m = _BOXED_BARE.match(text, i)
            if m is not None:
                found.append(m.group(1))
    return found


def _program_output(text: str) -> str:
    """Text of the last ```` ```output ```` block (to its closing fence or the end)."""
    if "```output" not in text:
        return ""
    return text.rpartition("```output")[2].partition("```")[0].strip()


def _last_number(text: str) -> list[str]:
    """The last number of the text (commas removed first), as the reference; linear time."""
    ends = [text.rfind(d) for d in "0123456789"]
    end = max(ends)
    if end < 0:
        return []
    window = text[max(0, end - 2 * MAX_ANSWER_CHARS) : end + 1].replace(",", "")
    last = None
    for last in _LAST_NUMBER.finditer(window):  # noqa: B007 - the last match is wanted
        pass
    return [last.group(0)] if last is not None else []


def _first_line(ans: str) -> str:
    """First line of an answer; continued over line breaks while ``{``/``(``/``[`` are unbalanced."""
    lines = ans.strip().split("\n", 6)
    out = lines[0]
    for nxt in lines[1:6]:
        if out.count("{") <= out.count("}") and out.count("(") + out.count("[") <= out.count(")") + out.count("]"):
            break
        out += "\n" + nxt
    return out


def _trim(ans: str) -> str:
    """The reference's post-processing of one extracted answer before ``strip_string``: its first line, ``:`` /
    ``.`` / ``/`` stripped at the ends."""
    return _first_line(ans).lstrip(":").rstrip(".").rstrip("/").strip()


def _clean(ans: str) -> str:
    ans = _trim(ans)
    return strip_string(ans) if len(ans) <= MAX_ANSWER_CHARS else ans  # too long: kept raw, refused when checked


def _raw_candidates(text: str, *, last_number: bool) -> list[str]:
    """The raw answers of the first matching reference rule (see :func:`extract_answers`)."""
    rules = []
    if _MINERVA_OPEN in text and _MINERVA_CLOSE in text:
        rules.append(lambda: [text.partition(_MINERVA_OPEN)[2].partition(_MINERVA_CLOSE)[0].strip()])
    if "boxed" in text:
        rules.append(lambda: _boxed_contents(text))
    if _ANSWER_IS in text:
        rules.append(lambda: [text.rpartition(_ANSWER_IS)[2].strip()])
    rules.append(lambda: [_program_output(text)])
    if last_number:
        rules.append(lambda: _last_number(text))
    for rule in rules:
        answers = [a for a in (_trim(x) for x in rule()) if a]
        if answers:
            return answers
    return []


def extract_answers(text: str) -> list[str]:
    """All answers the first matching reference rule finds, normalised (empty list when none).

    Rules, first match wins (``answer_extraction.extract_answer``): 1. ``final answer is $X$. I hope``
    (Minerva); 2. every ``\\boxed{}``; 3. the text after the last ``he answer is``; 4. the last
    ```` ```output ```` block; 5. the last number (commas removed). Departure: a rule that finds only
    empty answers (``\\boxed{}``, an empty output block) falls through to the next rule instead of
    giving an empty answer. Each answer is cut to its first line (kept whole while braces are open),
    stripped of ``:`` / ``.`` / ``/`` at the ends and passed through :func:`strip_string` (an answer longer than
    :data:`MAX_ANSWER_CHARS` is kept as it is: :func:`check` refuses it).
    """
    text = str(text)
    out = []
    for a in _raw_candidates(text, last_number=True):
        a = strip_string(a) if len(a) <= MAX_ANSWER_CHARS else a
        if a:
            out.append(a)
    return out


def _gsm8k_number(ans: str) -> str:
    """A GSM8K answer reduced to a number: thousands separators removed; an answer that is not a
    number (``18dollars``) gives its last number; anything without a number is returned as is."""
    if len(ans) > MAX_ANSWER_CHARS:
        return ans
    if is_thousands_number(ans.rstrip("%")):
        return ans.replace(",", "")
    if parse_number(ans) is not None:
        return ans
    nums = re.findall(r"-?\d+(?:,\d{3})+(?:\.\d+)?|-?\d*\.?\d+", ans)
    return nums[-1].replace(",", "") if nums else ans


def extract_answer(text: str, benchmark: str = "math") -> str | None:
    """The predicted answer in a completion, normalised, or None when there is none.

    ``benchmark="math"``: the last answer of :func:`extract_answers` (the reference
    ``extract_answer``). ``benchmark="gsm8k"``: the same, then reduced to a plain number (thousands
    separators removed, units dropped: ``The answer is 1,800 dollars.`` -> ``1800``).
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {BENCHMARKS}")
    answers = extract_answers(text)
    if not answers:
        return None
    ans = answers[-1]
    if benchmark == "gsm8k":
        ans = _gsm8k_number(ans)
    return ans or None


_MATH_SPAN = re.compile(r"\$\$([^$]+?)\$\$|\\\[(.+?)\\\]|\\\(([^\n]+?)\\\)|(?<!\\)\$([^$\n]+?)(?<!\\)\$", re.S)


def _whole_answer(text: str) -> list[str]:
    """strict's last resort, for an output that is nothing but a short answer (at most 100 characters): the content
    of its last math span (``Answer $ 9 $``, ``$$\\text{...}$$``), else the whole text when it is at most 64
    characters with at most one word of three or more letters (``18 dollars``)."""
    t = text.strip()
    if not t or len(t) > 100:
        return []
    spans = [next(g for g in m.groups() if g is not None) for m in _MATH_SPAN.finditer(t)]
    if spans:
        return [_trim(spans[-1])] if spans[-1].strip() else []
    if len(t) > 64 or "\n" in t or len(_WORD.findall(t)) > 1:
        return []
    return [_trim(t)]


def final_answers(text: str, benchmark: str = "math", *, mode: str = "deepseekmath") -> list[str]:
    """What ``mode`` reads as the prediction of a whole output ([] when there is none).

    ``deepseekmath``: ``[extract_answer(text, benchmark)]`` (the reference: the last boxed answer, the last number
    when nothing else matches). ``strict``: every distinct answer of the first matching rule among Minerva's
    ``final answer is``, ``\\boxed{}``, ``he answer is`` and the last ```` ```output ```` block, raw (strict
    normalises while it parses units and lists), at most ``MAX_CANDIDATES + 1``; no last-number fallback (an output
    that states no answer has none), except an output that is only a short answer. Several distinct answers are
    judged together by :func:`check` (wrong unless each is right).
    """
    _check_mode(mode)
    if mode == "deepseekmath":
        a = extract_answer(text, benchmark)
        return [] if a is None else [a]
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {BENCHMARKS}")
    text = str(text)
    cands = _raw_candidates(text, last_number=False) or _whole_answer(text)
    out: list[str] = []
    for c in cands:
        if c not in out:
            out.append(c)
            if len(out) > MAX_CANDIDATES:
                break
    return out


# ----------------------------------------------------------------------------------------------
# Text answers (names, days, multiple-choice letters): compared as text, never symbolically
# ----------------------------------------------------------------------------------------------

_TEXT_CMD = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}")
_WORDY = re.compile(r"[A-Za-z(][A-Za-z ,.'()-]*")


def _text_key(s: str) -> str:
    s = _TEXT_CMD.sub(r"\1", str(s)).replace("$", "").lower()
    s = re.sub(r"[\s()]", "", s).rstrip(".")
    return ",".join(sorted(p for p in s.split(",") if p))


def _is_text_answer(gold: str) -> bool:
    """A gold written as ``\\text{...}`` whose content is words or option letters (no digits, no
    LaTeX): ``\\text{Friday}``, ``\\text{(C)}``, ``\\text{A, C, F}``. Math-verify would read these as
    products of symbols (``Friday`` = ``Fyirda``), so they are compared as text."""
    if "\\text" not in gold and "\\mbox" not in gold:
        return False
    inner = _TEXT_CMD.sub(r"\1", gold).replace("$", "").strip()
    return bool(inner) and "\\" not in inner and _WORDY.fullmatch(inner) is not None


# ----------------------------------------------------------------------------------------------
# Checking
# ----------------------------------------------------------------------------------------------

_CACHE_MAX = 200_000
_cache: collections.OrderedDict[tuple, tuple[str, float]] = collections.OrderedDict()
_cache_lock = threading.Lock()
stats = collections.Counter()  # "fast", "symbolic", "cached", "timeout", "refused": how checks were decided


def warm_up(n: int = 1) -> None:
    """Start ``n`` checking workers now and wait until they are ready (otherwise the first symbolic
    check waits for the start, which is not counted against its timeout)."""
    _answers_pool.pool().warm(n)


def shutdown() -> None:
    """Stop the idle checking workers (they also stop at interpreter exit); nothing to do before the first check."""
    if _answers_pool._POOL is not None:
        _answers_pool.pool().close()


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown checker mode {mode!r}; expected one of {MODES}")


def _cached(key: tuple, timeout_s: float) -> str | None:
    with _cache_lock:
        hit = _cache.get(key)
        if hit is None:
            return None
        outcome, t = hit
        if outcome == TIMEOUT and t < timeout_s:
            return None  # timed out under a shorter deadline: try again with this one
        _cache.move_to_end(key)
        stats["cached"] += 1
        return outcome


def _store(key: tuple, outcome: str, timeout_s: float) -> None:
    with _cache_lock:
        _cache[key] = (outcome, timeout_s)
        if len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)


def _run_worker(key: tuple, req: dict, timeout_s: float) -> str:
    """A worker's outcome for ``req`` (cached by ``key``, timeouts included)."""
    got = _cached(key, timeout_s)
    if got is not None:
        return got
    reply = _answers_pool.run(req, timeout_s)
    if reply is None:
        stats["timeout"] += 1
        outcome = TIMEOUT
    else:
        stats["symbolic"] += 1
        outcome = NO_GOLD if reply["ok"] is None else RIGHT if reply["ok"] else WRONG
    _store(key, outcome, timeout_s)
    return outcome


def _prepare(pred: str | None, gold: str, mode: str, pv: bool) -> tuple[str | None, tuple, dict]:
    """(outcome, or None when the worker must decide; cache key; worker request) for one (prediction, gold) pair:
    refusal by length first, then the bounded in-process pass."""
    if pred is None or not str(pred).strip():
        return WRONG, (), {}
    pred, gold = str(pred), str(gold)
    if len(pred) > MAX_ANSWER_CHARS:
        stats["refused"] += 1
        return REFUSED, (), {}
    if _is_text_answer(gold):
        return (RIGHT if _text_key(pred) == _text_key(gold) else WRONG), (), {}
    if mode == "strict":
        verdict = _answers_strict.compare(pred, gold, never, fast=True)
        p, g = pred, gold
    else:
        p, g = strip_string(pred), strip_string(gold)
        if not p or not g:
            return WRONG, (), {}
        verdict = compare(p, g, never, percent_variants=pv)
    if verdict is not None:
        stats["fast"] += 1
        return (RIGHT if verdict else WRONG), (), {}
    key = ("check", mode, p, g, pv if mode == "deepseekmath" else None)
    return None, key, {"op": "check", "mode": mode, "pred": p, "gold": g, "pv": pv}


def _decide(pairs: list[tuple[str | None, str]], mode: str, pv: bool, timeout_s: float, workers: int | None) -> list[str]:
    out: list[str | None] = []
    todo: list[tuple[int, tuple, dict]] = []
    for i, (p, g) in enumerate(pairs):
        outcome, key, req = _prepare(p, g, mode, pv)
        out.append(outcome)
        if outcome is None:
            todo.append((i, key, req))
    n = max(1, min(workers or _answers_pool.max_workers(), _answers_pool.max_workers(), len(todo)))
    if n == 1:
        for i, key, req in todo:
            out[i] = _run_worker(key, req, timeout_s)
    elif todo:
        with ThreadPoolExecutor(max_workers=n) as ex:
            for (i, _, _), r in zip(todo, ex.map(lambda t: _run_worker(t[1], t[2], timeout_s), todo), strict=True):
                out[i] = r
    return [str(o) for o in out]


def _candidates(pred: str | Sequence[str] | None, mode: str) -> list[str]:
    if pred is None:
        return []
    cands = [pred] if isinstance(pred, str) else [str(x) for x in pred]
    if mode == "deepseekmath":
        return cands[-1:]  # the reference reads the last answer
    return list(dict.fromkeys(cands))


def _combine(outcomes: list[str]) -> str:
    """Several distinct answers (strict): right only if every one is right; a wrong or refused one makes it wrong;
    otherwise a timeout stays a timeout."""
    if all(o == RIGHT for o in outcomes):
        return RIGHT
    if any(o in (WRONG, REFUSED) for o in outcomes):
        return WRONG
    return TIMEOUT


def check_many(
    preds: Sequence[str | Sequence[str] | None],
    golds: Sequence[str],
    *,
    mode: str = "deepseekmath",
    timeout_s: float = 5.0,
    percent_variants: bool = True,
    workers: int | None = None,
) -> list[str]:
    """:func:`check` for each pair (order kept); the worker checks run on up to ``workers`` processes at once."""
    _check_mode(mode)
    if len(preds) != len(golds):
        raise ValueError(f"check_many: {len(preds)} predictions but {len(golds)} golds")
    pairs: list[tuple[str | None, str]] = []
    spans: list[tuple[int, int]] = []
    early: dict[int, str] = {}
    for i, (pred, gold) in enumerate(zip(preds, golds, strict=True)):
        cands = _candidates(pred, mode)
        if not cands:
            early[i] = WRONG
        elif len(cands) > MAX_CANDIDATES:
            early[i] = WRONG
        spans.append((len(pairs), len(pairs) + (0 if i in early else len(cands))))
        if i not in early:
            pairs.extend((c, str(gold)) for c in cands)
    flat = _decide(pairs, mode, percent_variants, timeout_s, workers)
    out: list[str] = []
    joined: list[tuple[int, str, str]] = []
    for i, (a, b) in enumerate(spans):
        if i in early:
            out.append(early[i])
            continue
        o = flat[a] if b - a == 1 else _combine(flat[a:b])
        out.append(o)
        if b - a > 1 and o != RIGHT and _answers_strict.parse(str(golds[i])).kind in ("list", "set"):
            joined.append((i, ", ".join(p for p, _ in pairs[a:b]), str(golds[i])))  # \boxed{2} and \boxed{3} for "2, 3"
    if joined:
        for (i, _, _), o in zip(joined, _decide([(p, g) for _, p, g in joined], mode, percent_variants, timeout_s,
                                               workers), strict=True):
            if o == RIGHT:
                out[i] = RIGHT
    return out


def check(
    pred: str | Sequence[str] | None,
    gold: str,
    *,
    mode: str = "deepseekmath",
    timeout_s: float = 5.0,
    percent_variants: bool = True,
) -> str:
    """The outcome of a prediction against the gold answer under checker ``mode``: ``right``, ``wrong``,
    ``timeout`` or ``refused``.

    ``pred``: one answer, or (strict) the distinct final answers of one output (:func:`final_answers`): right only
    when each is right, or, for a list gold, when together they are the list; more than ``MAX_CANDIDATES`` is
    wrong. ``deepseekmath`` reads the last one. None or empty: wrong (no answer).

    ``deepseekmath`` (the reference's ``eval_script.is_correct`` / ``eval_utils.math_equal`` on
    :func:`strip_string`'d answers): exact match; numbers within 1e-3 of gold, and with ``percent_variants`` gold/100
    and gold*100 when both sides are plain decimals; ``\\cup`` pieces, comma-separated multiple answers
    (unordered) and ``\\text{and}`` lists; tuples and intervals element-wise with the same brackets; matrices
    cell-wise; ``x=v`` against ``v`` when the left side has at most 2 characters; equations ``a=b``/``c=d`` as
    ``a-(b)`` = ±``(c-(d))``; and, symbolically, math-verify or sympy ``simplify(a-b)==0`` / numeric values within
    1e-3. ``strict``: :mod:`stages.core._answers_strict` (``percent_variants`` unused: percent forms only where a
    ``%`` is written). In both, text golds (``\\text{Friday}``, ``\\text{(C)}``) compare as case-insensitive text.

    A prediction over :data:`MAX_ANSWER_CHARS` characters is ``refused`` before normalisation. What the bounded
    in-process pass cannot decide runs in a worker process with a deadline of ``timeout_s`` seconds; past it the
    worker is killed and replaced and the outcome is ``timeout``. Safe to call from any thread. Outcomes of the
    worker (timeouts included) are cached.
    """
    return check_many([pred], [gold], mode=mode, timeout_s=timeout_s, percent_variants=percent_variants, workers=1)[0]


def is_equivalent(
    pred: str | Sequence[str] | None,
    gold: str,
    *,
    timeout_s: float = 5.0,
    percent_variants: bool = True,
    mode: str = "deepseekmath",
) -> bool:
    """Whether :func:`check` says ``right`` (a timeout or a refusal is not equivalent)."""
    return check(pred, gold, mode=mode, timeout_s=timeout_s, percent_variants=percent_variants) == RIGHT


def are_equivalent(
    preds: Sequence[str | Sequence[str] | None],
    golds: Sequence[str],
    *,
    timeout_s: float = 5.0,
    percent_variants: bool = True,
    workers: int | None = None,
    mode: str = "deepseekmath",
) -> list[bool]:
    """:func:`is_equivalent` for each pair (order kept); the worker checks run on up to ``workers`` processes."""
    if len(preds) != len(golds):
        raise ValueError(f"are_equivalent: {len(preds)} predictions but {len(golds)} golds")
    return [o == RIGHT for o in check_many(preds, golds, mode=mode, timeout_s=timeout_s,
                                           percent_variants=percent_variants, workers=workers)]


def math_verify_many(texts: Sequence[str | None], golds: Sequence[str], *, timeout_s: float = 5.0,
                     workers: int | None = None) -> list[str]:
    """math-verify's own verdict on each whole output (its extraction, then ``verify`` against the gold read as
    LaTeX): ``right`` / ``wrong`` / ``timeout`` / ``refused`` (an output over :data:`MAX_TEXT_CHARS`) / ``no_gold``
    (math-verify reads nothing in the gold), each under the deadline ``timeout_s`` in a worker, cached."""
    if len(texts) != len(golds):
        raise ValueError(f"math_verify_many: {len(texts)} outputs but {len(golds)} golds")
    out: list[str | None] = []
    todo: list[tuple[int, tuple, dict]] = []
    for i, (t, g) in enumerate(zip(texts, golds, strict=True)):
        if t is None or not str(t).strip():
            out.append(WRONG)
        elif len(str(t)) > MAX_TEXT_CHARS:
            stats["refused"] += 1
            out.append(REFUSED)
        else:
            out.append(None)
            todo.append((i, ("mv", str(t), str(g)), {"op": "mv", "text": str(t), "gold": str(g)}))
    n = max(1, min(workers or _answers_pool.max_workers(), _answers_pool.max_workers(), len(todo)))
    with ThreadPoolExecutor(max_workers=n) as ex:
        for (i, _, _), r in zip(todo, ex.map(lambda t: _run_worker(t[1], t[2], timeout_s), todo), strict=True):
            out[i] = r
    return [str(o) for o in out]


def answer_key(pred: str | Sequence[str] | None, mode: str = "deepseekmath") -> str | None:
    """A canonical text of a prediction for grouping maj@k votes, computed in-process without any pairwise check:
    numbers by value, lists and sets sorted, units kept (strict), several final answers as one sorted group; None
    for no answer. Equal keys mean equivalent answers; equivalent answers written differently (``2\\sqrt{2}``,
    ``\\sqrt{8}``) may get different keys (the maj@k grouping merges every answer judged right into one class)."""
    _check_mode(mode)
    cands = _candidates(pred, mode)
    if not cands:
        return None
    keys = []
    for c in cands:
        if len(c) > MAX_ANSWER_CHARS:
            keys.append("refused:" + str(hash(c)))
        elif mode == "strict":
            keys.append(_answers_strict.key(c))
        else:
            s = strip_string(c)
            n = parse_number(s)
            keys.append(f"#{n:.12g}" if n is not None else s)
    return keys[0] if len(keys) == 1 else "multi:" + "|".join(sorted(keys))

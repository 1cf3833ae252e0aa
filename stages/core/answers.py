"""Answer extraction and equivalence, following the DeepSeekMath reference evaluation.

Public API (other stages code against these names):

- :func:`extract_answer` ``(text, benchmark="math") -> str | None``: the reference extraction order
  (Minerva ``final answer is $...$. I hope``, the last ``\\boxed{}`` with nested braces,
  ``he answer is``, the last ```` ```output ```` block, the last number), then :func:`strip_string`.
- :func:`extract_answers`: every candidate of the first rule that matches (all boxed answers, say).
- :func:`gsm8k_gold` ``(answer_field) -> str``: the gold after ``#### ``, commas removed (the GSM8K file
  readers in :mod:`stages.core.problems` use it; this module imports nothing of that one).
- :func:`strip_string`: the DeepSeekMath normalisation (see :mod:`stages.core._answers_norm`).
- :func:`is_equivalent` ``(pred, gold, *, timeout_s=5.0) -> bool``: the DeepSeekMath rules plus
  math-verify. Safe from any thread: the symbolic part runs in a persistent worker process that is
  killed (and replaced) when a check runs past ``timeout_s`` seconds of the worker's CPU time (not wall time:
  the verdict does not depend on the machine's load); a timeout counts as "not equivalent".
  Plain numbers, exact matches and structures whose parts all match are decided in-process without
  the worker (the fast path GRPO rewards rely on).
- :func:`are_equivalent`: the same for many pairs, symbolic checks spread over a few workers.
- :func:`warm_up` / :func:`shutdown`: start / stop the worker processes explicitly (optional).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stages.core._answers_norm import _matching_brace, is_thousands_number, parse_number
from stages.core._answers_norm import strip_string as _strip_string
from stages.core._answers_rules import compare, never

__all__ = [
    "are_equivalent",
    "extract_answer",
    "extract_answers",
    "gsm8k_gold",
    "is_equivalent",
    "shutdown",
    "strip_string",
    "warm_up",
]

BENCHMARKS = ("math", "gsm8k")


def strip_string(s: object) -> str:
    """DeepSeekMath answer normalisation (``answer_extraction.strip_string``); see ``_answers_norm``."""
    return _strip_string(s)


# ----------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------

_MINERVA_OPEN = "final answer is $"
_MINERVA_CLOSE = "$. I hope"
_ANSWER_IS = "he answer is"
_LAST_NUMBER = re.compile(r"-?\d*\.?\d+")
_BOXED_BARE = re.compile(r"boxed[ \t]+([^\s${}]+)")


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (nested braces matched), in order; a ``%`` right after the
    closing brace is kept (``\\boxed{50}\\%`` -> ``50%``). ``\\boxed 5`` is read as ``5``."""
    found: list[tuple[int, str]] = []
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
            k = _matching_brace(text, j)
            if k >= 0:
                content = text[j + 1 : k]
                after = text[k + 1 : k + 3]
                if after.startswith("%") or after.startswith("\\%"):
                    content += "%"
                found.append((i, content))
                start = k + 1
        else:
            m = _BOXED_BARE.match(text, i)
            if m is not None:
                found.append((i, m.group(1)))
    return [c for _, c in found]


def _program_output(text: str) -> str:
    """Text of the last ```` ```output ```` block (to its closing fence or the end)."""
    if "```output" not in text:
        return ""
    return text.split("```output")[-1].split("```")[0].strip()


def _first_line(ans: str) -> str:
    """First line of an answer; continued over line breaks while ``{``/``(``/``[`` are unbalanced."""
    lines = ans.strip().split("\n")
    out = lines[0]
    for nxt in lines[1:6]:
        if out.count("{") <= out.count("}") and out.count("(") + out.count("[") <= out.count(")") + out.count("]"):
            break
        out += "\n" + nxt
    return out


def _clean(ans: str) -> str:
    ans = _first_line(ans)
    ans = ans.lstrip(":").rstrip(".").rstrip("/")
    return strip_string(ans)


def extract_answers(text: str) -> list[str]:
    """All answers the first matching reference rule finds, normalised (empty list when none).

    Rules, first match wins (``answer_extraction.extract_answer``): 1. ``final answer is $X$. I hope``
    (Minerva); 2. every ``\\boxed{}``; 3. the text after the last ``he answer is``; 4. the last
    ```` ```output ```` block; 5. the last number (commas removed). Departure: a rule that finds only
    empty answers (``\\boxed{}``, an empty output block) falls through to the next rule instead of
    giving an empty answer. Each answer is cut to its first line (kept whole while braces are open),
    stripped of ``:`` / ``.`` / ``/`` at the ends and passed through :func:`strip_string`.
    """
    text = str(text)
    rules = []
    if _MINERVA_OPEN in text and _MINERVA_CLOSE in text:
        rules.append(lambda: [text.split(_MINERVA_OPEN, 1)[1].split(_MINERVA_CLOSE, 1)[0].strip()])
    if "boxed" in text:
        rules.append(lambda: _boxed_contents(text))
    if _ANSWER_IS in text:
        rules.append(lambda: [text.split(_ANSWER_IS)[-1].strip()])
    rules.append(lambda: [_program_output(text)])
    rules.append(lambda: _LAST_NUMBER.findall(text.replace(",", ""))[-1:])
    for rule in rules:
        answers = [a for a in (_clean(x) for x in rule()) if a]
        if answers:
            return answers
    return []


def gsm8k_gold(answer_field: str) -> str:
    """The GSM8K gold answer: the text after ``#### `` with commas removed (``2,125`` -> ``2125``)."""
    s = str(answer_field)
    if "####" not in s:
        raise ValueError("GSM8K answer field has no '####' line")
    return s.split("####")[-1].strip().replace(",", "")


def _gsm8k_number(ans: str) -> str:
    """A GSM8K answer reduced to a number: thousands separators removed; an answer that is not a
    number (``18dollars``) gives its last number; anything without a number is returned as is."""
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
# The checking workers
# ----------------------------------------------------------------------------------------------

_ROOT = Path(__file__).resolve().parents[2]


def startup_timeout_s() -> float:
    """Seconds a checking worker may take to start (``ANSWERS_WORKER_STARTUP_S``, default 180; read when used)."""
    return float(os.environ.get("ANSWERS_WORKER_STARTUP_S", "180"))


def max_workers() -> int:
    """Checking workers at most (``ANSWERS_MAX_WORKERS``, default the CPU count within [2, 8]; read when used)."""
    return int(os.environ.get("ANSWERS_MAX_WORKERS", str(max(2, min(8, os.cpu_count() or 2)))))


WALL_CAP = 20.0
"""A symbolic check's time limit is CPU time of its worker; a worker that gets no CPU for ``WALL_CAP`` x the limit (a
stopped or starved process) is given up on all the same."""
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _Worker:
    """One ``stages.core._answers_worker`` process and its line-buffered stdout."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stages.core._answers_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(_ROOT),
        )
        self._buf = b""
        self._ready = False
        self._next_id = 0

    def _readline(self, deadline: float) -> bytes | None:
        """One line from the worker, or None on timeout or end of output."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            poller = select.poll()  # not select.select: no FD_SETSIZE limit in processes with many files
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(max(1, int(left * 1000))):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def ensure_ready(self) -> None:
        if self._ready:
            return
        line = self._readline(time.monotonic() + startup_timeout_s())
        if line is None or not json.loads(line).get("ready"):
            self.kill()
            raise RuntimeError(
                f"answer-checking worker did not start within {startup_timeout_s():.0f}s "
                f"(python -m stages.core._answers_worker; exit code {self.proc.returncode})"
            )
        self._ready = True

    def cpu_s(self) -> float | None:
        """CPU seconds the worker process has used (Linux /proc; None elsewhere)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
        except (OSError, IndexError, ValueError):
            return None

    def _reply(self, timeout_s: float) -> bytes | None:
        """The worker's next line, or None once it has spent ``timeout_s`` seconds of CPU time on the check (its own
        CPU time, so the verdict does not depend on what else loads the machine: a check that takes 1 s alone
        is not a timeout beside busy processes), or ``WALL_CAP`` x ``timeout_s`` of wall time (a worker that makes
        no progress), or when it died. Without /proc, ``timeout_s`` of wall time."""
        cpu0 = self.cpu_s()
        now = time.monotonic()
        if cpu0 is None:
            return self._readline(now + timeout_s)
        cap = now + WALL_CAP * timeout_s
        while True:
            used = (self.cpu_s() or cpu0) - cpu0
            left = timeout_s - used
            if left <= 0 or now >= cap:
                return None
            # the worker is one thread: it cannot use more than `left` CPU seconds in `left` wall seconds
            line = self._readline(min(now + max(left, 0.05), cap))
            if line is not None or not self.alive():
                return line
            now = time.monotonic()

    def check(self, pred: str, gold: str, percent_variants: bool, timeout_s: float) -> bool | None:
        """The worker's verdict, or None when it ran past ``timeout_s`` of CPU time (:meth:`_reply`) or died (then
        it is dead)."""
        self.ensure_ready()
        self._next_id += 1
        req = {"id": self._next_id, "pred": pred, "gold": gold, "pv": percent_variants}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        line = self._reply(timeout_s)
        if line is None:
            self.kill()
            return None
        reply = json.loads(line)
        if reply.get("id") != self._next_id:
            self.kill()
            return None
        return bool(reply["ok"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class _Pool:
    """Idle workers handed out one per check; grows to :func:`max_workers` (callers wait beyond)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._live = 0

    def acquire(self) -> _Worker:
        with self._cond:
            while True:
                while self._idle:
                    w = self._idle.pop()
                    if w.alive():
                        return w
                    self._live -= 1
                    w.kill()
                if self._live < max_workers():
                    self._live += 1
                    break
                self._cond.wait()
        try:
            return _Worker()
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def release(self, w: _Worker) -> None:
        """Return a worker; a dead one (timed out and killed) is replaced at once, so the next
        check does not wait for a fresh start."""
        replacement = None
        if not w.alive():
            try:
                replacement = _Worker()
            except OSError:
                replacement = None
        with self._cond:
            if w.alive():
                self._idle.append(w)
            elif replacement is not None:
                self._idle.append(replacement)
            else:
                self._live -= 1
            self._cond.notify()

    def warm(self, n: int) -> None:
        ws = [self.acquire() for _ in range(max(1, min(n, max_workers())))]
        try:
            for w in ws:
                w.ensure_ready()
        finally:
            for w in ws:
                self.release(w)

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for w in idle:
            w.kill()


_POOL: _Pool | None = None  # created by the first check (importing this module starts nothing)
_POOL_PID = 0


def _pool() -> _Pool:
    """This process's pool; a forked child gets a fresh one (it must not share its parent's pipes)."""
    global _POOL, _POOL_PID
    if _POOL is None or os.getpid() != _POOL_PID:
        first = _POOL is None
        _POOL, _POOL_PID = _Pool(), os.getpid()
        if first:  # its workers stop at interpreter exit (a forked child's pool is its own: it checks the pid)
            atexit.register(lambda: _POOL.close() if _POOL is not None and os.getpid() == _POOL_PID else None)
    return _POOL


_CACHE_MAX = 200_000
_cache: collections.OrderedDict[tuple[str, str, bool], bool] = collections.OrderedDict()
_cache_lock = threading.Lock()
stats = collections.Counter()  # "fast", "symbolic", "cached", "timeout": how checks were decided


def warm_up(n: int = 1) -> None:
    """Start ``n`` checking workers now and wait until they are ready (otherwise the first symbolic
    check waits for the start, which is not counted against its timeout)."""
    _pool().warm(n)


def shutdown() -> None:
    """Stop the idle checking workers (they also stop at interpreter exit)."""
    _pool().close()


def _symbolic(p: str, g: str, percent_variants: bool, timeout_s: float) -> bool:
    key = (p, g, percent_variants)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            stats["cached"] += 1
            return _cache[key]
    pool = _pool()
    w = pool.acquire()
    try:
        verdict = w.check(p, g, percent_variants, timeout_s)
    finally:
        pool.release(w)
    if verdict is None:
        stats["timeout"] += 1
        return False
    stats["symbolic"] += 1
    with _cache_lock:
        _cache[key] = verdict
        if len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return verdict


def _prepare(pred: str | None, gold: str, percent_variants: bool) -> tuple[bool | None, str, str]:
    """(verdict or None when the worker must decide, normalised pred, normalised gold)."""
    if pred is None:
        return False, "", ""
    gold = str(gold)
    if _is_text_answer(gold):
        return _text_key(pred) == _text_key(gold), "", ""
    p, g = strip_string(pred), strip_string(gold)
    if not p or not g:
        return False, p, g
    return compare(p, g, never, percent_variants=percent_variants), p, g


def is_equivalent(pred: str | None, gold: str, *, timeout_s: float = 5.0, percent_variants: bool = True) -> bool:
    """Whether a predicted answer is mathematically equivalent to the gold answer.

    Both are normalised with :func:`strip_string`, then compared with the DeepSeekMath rules
    (``eval_script.is_correct`` / ``eval_utils.math_equal``): exact match; numbers within 1e-3 of
    gold, gold/100 or gold*100 (the reference's percent rule; with ``percent_variants=False`` only a
    written ``%`` may be dropped: ``50\\%`` matches ``0.5`` and ``50``, ``1800`` no longer matches ``18``); ``\\cup`` pieces, comma-separated multiple answers (unordered) and
    ``\\text{and}`` lists; tuples and intervals element-wise with the same brackets; matrices
    cell-wise; ``x=v`` against ``v`` when the left side has at most 2 characters; equations
    ``a=b``/``c=d`` as ``a-(b)`` = ±``(c-(d))``; and, symbolically, math-verify or sympy
    ``simplify(a-b)==0`` / numeric values within 1e-3. Text golds (``\\text{Friday}``, ``\\text{(C)}``)
    compare as case-insensitive text.

    Decided in-process when possible (plain numbers, exact or structurally exact matches); the rest
    runs in a worker process with a budget of ``timeout_s`` seconds of its CPU time (whatever else loads the
    machine), after which the worker is killed and replaced and the answer is False. Safe to call from any thread. The first symbolic
    check of a process also waits for a worker to start (about a second; not counted in
    ``timeout_s``; :func:`warm_up` does it ahead). Verdicts of the worker are cached per (pred, gold).
    ``pred=None`` (no answer extracted) is never equivalent.
    """
    verdict, p, g = _prepare(pred, gold, percent_variants)
    if verdict is not None:
        stats["fast"] += 1
        return verdict
    return _symbolic(p, g, percent_variants, timeout_s)


def are_equivalent(
    preds: Sequence[str | None],
    golds: Sequence[str],
    *,
    timeout_s: float = 5.0,
    percent_variants: bool = True,
    workers: int | None = None,
) -> list[bool]:
    """:func:`is_equivalent` for each pair (order kept); the symbolic checks run on up to
    ``workers`` worker processes at once (default: :func:`max_workers`)."""
    if len(preds) != len(golds):
        raise ValueError(f"are_equivalent: {len(preds)} predictions but {len(golds)} golds")
    out: list[bool | None] = []
    todo: list[tuple[int, str, str]] = []
    for i, (pred, gold) in enumerate(zip(preds, golds, strict=True)):
        verdict, p, g = _prepare(pred, gold, percent_variants)
        out.append(verdict)
        if verdict is None:
            todo.append((i, p, g))
        else:
            stats["fast"] += 1
    n = max(1, min(workers or max_workers(), max_workers(), len(todo)))
    if n == 1:
        for i, p, g in todo:
            out[i] = _symbolic(p, g, percent_variants, timeout_s)
    elif todo:
        with ThreadPoolExecutor(max_workers=n) as ex:
            results = ex.map(lambda t: _symbolic(t[1], t[2], percent_variants, timeout_s), todo)
            for (i, _, _), r in zip(todo, results, strict=True):
                out[i] = r
    return [bool(v) for v in out]

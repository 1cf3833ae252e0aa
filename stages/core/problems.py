"""The benchmark problem files, read and validated in one place.

Three formats, each a JSONL file of one problem per row:

- generated (the data stage's data/generated/problems/{sft,rl,test}.jsonl, and RL prompt files):
  ``{"id"?, "question", "answer", "n_steps"?, "cot"?, ...}``; gold = ``answer`` (text or integer),
  difficulty = ``n_steps``, solution = ``cot``; a row without ``id`` gets ``generated-<row index>``;
- GSM8K (``{"question", "answer"}``): gold = the text after ``####`` without thousands separators
  (:func:`gsm8k_gold`), difficulty = the non-empty solution lines before ``####``
  (its reasoning steps), solution = the ``answer`` text as is (calculator annotations ``<<48/2=24>>`` kept),
  id ``gsm8k-<row index>``;
- MATH (``{"problem", "solution"?, "answer"?, "level"?, "unique_id"?}``): gold = ``answer``, difficulty =
  ``level`` (an integer, or ``"Level N"``), solution = ``solution``, id = ``unique_id`` or ``math-<row index>``.
  Rows whose ``answer`` is null or empty (MATH's train split has both) are skipped unless ``keep_unanswered``
  (decontamination needs their text); their gold is then None.

Row indices count JSON objects from 0 (blank lines are not rows); errors name rows from 1. A missing file, a
malformed line, a row lacking a required field (or holding the wrong type) and a file with no problems are each
a one-line :class:`~stages.core.errors.PipelineError` naming the file, the row and the fix. ``limit`` keeps the
first ``limit`` problems and stops reading there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError
from stages.core.io import iter_jsonl


@dataclass(frozen=True)
class Problem:
    """One benchmark problem."""

    id: str
    benchmark: str
    """``generated``, ``gsm8k`` or ``math``."""
    question: str
    gold: str | None
    """The gold final answer as text; None only for MATH rows without one, loaded with ``keep_unanswered``."""
    difficulty: int | None
    """What per-difficulty breakdowns group by: n_steps, GSM8K solution lines, MATH level; None when unknown."""
    solution: str | None = None
    """The reference solution text (generated ``cot``, GSM8K ``answer``, MATH ``solution``), when the row has one."""


def gsm8k_gold(answer_field: str) -> str:
    """The GSM8K gold answer: the text after ``#### `` with commas removed (``2,125`` -> ``2125``).

    Also :func:`stages.core.answers.gsm8k_gold` (the answers module's public API re-exports it)."""
    s = str(answer_field)
    if "####" not in s:
        raise ValueError("GSM8K answer field has no '####' line")
    return s.split("####")[-1].strip().replace(",", "")


_HINTS = {
    "generated": "run the data stage (dvc repro data) or fix the path",
    "GSM8K": "fix the path (the GSM8K test JSONL) or set it to null",
    "MATH": "fix the path (the MATH test JSONL) or set it to null",
    "problem": "fix the path",
}
_FORMATS = {
    "generated": 'the generated-problem format {"id", "question", "answer", "n_steps", "cot", ...}',
    "GSM8K": 'GSM8K\'s format {"question", "answer": "... #### N"}',
    "MATH": 'the MATH format {"problem", "solution", "answer", "level", "unique_id"}',
}


def _bad(path: Path, i: int, fmt: str, what: str) -> PipelineError:
    return PipelineError(f"{path}: row {i + 1} {what}; fix the row (expected {_FORMATS[fmt]})")


def _text(path: Path, i: int, fmt: str, row: dict[str, Any], key: str) -> str:
    """A required non-empty string field."""
    v = row.get(key)
    if not isinstance(v, str) or not v.strip():
        raise _bad(path, i, fmt, f"has no non-empty string {key!r}")
    return v


def _optional_text(path: Path, i: int, fmt: str, row: dict[str, Any], key: str) -> str | None:
    v = row.get(key)
    if v is not None and not isinstance(v, str):
        raise _bad(path, i, fmt, f"has a non-string {key!r} ({type(v).__name__})")
    return v


def _answer(path: Path, i: int, fmt: str, v: Any) -> str:
    """A gold answer given as text or as an integer."""
    if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).strip():
        raise _bad(path, i, fmt, "has no 'answer' (a non-empty string or an integer)")
    return str(v)


def _generated_row(path: Path, i: int, row: dict[str, Any]) -> Problem:
    q = _text(path, i, "generated", row, "question")
    gold = _answer(path, i, "generated", row.get("answer"))
    pid = row.get("id")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
        raise _bad(path, i, "generated", f"has an 'id' that is neither a string nor an integer ({type(pid).__name__})")
    steps = row.get("n_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)):
        raise _bad(path, i, "generated", f"has a non-integer 'n_steps' ({steps!r})")
    return Problem(f"generated-{i}" if pid is None else str(pid), "generated", q, gold, steps,
                   _optional_text(path, i, "generated", row, "cot"))


def _gsm8k_row(path: Path, i: int, row: dict[str, Any]) -> Problem:
    q = _text(path, i, "GSM8K", row, "question")
    a = _text(path, i, "GSM8K", row, "answer")
    if "####" not in a or not gsm8k_gold(a):
        raise _bad(path, i, "GSM8K", "has an 'answer' without a '#### N' final line")
    steps = [ln for ln in a.split("####")[0].splitlines() if ln.strip()]
    return Problem(f"gsm8k-{i}", "gsm8k", q, gsm8k_gold(a), len(steps), a)


def _math_level(v: Any) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.removeprefix("Level ").strip().isdigit():  # the original release's "Level 5"
        return int(v.removeprefix("Level ").strip())
    return None


def _math_row(path: Path, i: int, row: dict[str, Any]) -> Problem:
    q = _text(path, i, "MATH", row, "problem")
    a = row.get("answer")
    gold = None if a is None or (isinstance(a, str) and not a.strip()) else _answer(path, i, "MATH", a)
    uid = row.get("unique_id")
    return Problem(str(uid) if uid else f"math-{i}", "math", q, gold, _math_level(row.get("level")),
                   _optional_text(path, i, "MATH", row, "solution"))


def _rows(path: str | os.PathLike[str], name: str) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: {name} file not found; {_HINTS[name]}")
    for i, row in enumerate(iter_jsonl(p)):
        yield p, i, row


def _collect(path: str | os.PathLike[str], name: str, limit: int | None,
             convert: Callable[[Path, int, dict[str, Any]], Problem | None]) -> list[Problem]:
    out: list[Problem] = []
    if limit is not None and limit < 1:
        raise PipelineError(f"{path}: limit {limit} keeps no {name} problems; give a limit >= 1 or null")
    for p, i, row in _rows(path, name):
        item = convert(p, i, row)
        if item is not None:
            out.append(item)
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise PipelineError(f"{path}: no {name} problems in the file; check it is the right file")
    return out


def load_generated(path: str | os.PathLike[str], limit: int | None = None) -> list[Problem]:
    """The data stage's problems (e.g. the held-out data/generated/problems/test.jsonl)."""
    return _collect(path, "generated", limit, _generated_row)


def load_gsm8k(path: str | os.PathLike[str], limit: int | None = None) -> list[Problem]:
    """GSM8K rows ``{"question", "answer"}``."""
    return _collect(path, "GSM8K", limit, _gsm8k_row)


def load_math(path: str | os.PathLike[str], limit: int | None = None, *, keep_unanswered: bool = False
              ) -> list[Problem]:
    """MATH rows; rows without an answer are skipped unless ``keep_unanswered`` (then their gold is None)."""
    def conv(p: Path, i: int, row: dict[str, Any]) -> Problem | None:
        item = _math_row(p, i, row)
        return item if item.gold is not None or keep_unanswered else None
    return _collect(path, "MATH", limit, conv)


def load_problem_file(path: str | os.PathLike[str], limit: int | None = None) -> list[Problem]:
    """A problem file of generated rows or GSM8K rows, told apart row by row: a row whose ``answer`` is text
    containing ``####`` is a GSM8K row (its gold is the number after it), any other row a generated one."""
    def conv(p: Path, i: int, row: dict[str, Any]) -> Problem:
        a = row.get("answer")
        return (_gsm8k_row if isinstance(a, str) and "####" in a else _generated_row)(p, i, row)
    return _collect(path, "problem", limit, conv)


def benchmark_row(path: str | os.PathLike[str], i: int, row: dict[str, Any]) -> Problem | None:
    """Row ``i`` (0-based) of a problem file when it is a GSM8K row (an ``answer`` text holding ``####``) or a MATH
    row (a ``problem`` and no ``question``; its gold is None when the row has no answer); None for any other row
    (e.g. a generated one)."""
    p = Path(path)
    a = row.get("answer")
    if "question" not in row and "problem" in row:
        return _math_row(p, i, row)
    if isinstance(a, str) and "####" in a:
        return _gsm8k_row(p, i, row)
    return None


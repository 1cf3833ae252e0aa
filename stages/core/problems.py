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

Rows written by the ingest / testsets stages are generated-format rows with two more optional fields:
``benchmark`` (the prompt and answer-extraction family: ``generated``, ``gsm8k`` or ``math``; default
``generated``) and ``difficulty`` (an integer or null; default ``n_steps``). Any problem loader also takes a
directory: its ``*.jsonl`` files in name order, one after the other.

Other people's data sets become those rows in :mod:`stages.core.ingestion` (the ingest and testsets stages).

Row indices count JSON objects from 0 (blank lines are not rows); errors name rows from 1. A missing file, a
malformed line, a row lacking a required field (or holding the wrong type) and a file with no problems are each
a one-line :class:`~stages.core.errors.PipelineError` naming the file, the row and the fix. ``limit`` keeps the
first ``limit`` problems and stops reading there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core.answers import gsm8k_gold  # answers imports nothing of this module
from stages.core.errors import PipelineError
from stages.core.io import iter_jsonl, iter_jsonl_lines

_GSM8K_CALC = re.compile(r"<<[^<>]*>>")


def strip_calculator(text: str) -> str:
    """Remove GSM8K ``<<48/2=24>>`` calculator annotations."""
    return _GSM8K_CALC.sub("", text)

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


FAMILIES = ("generated", "gsm8k", "math")
"""Benchmark families: what few-shot prompt and answer extraction a problem gets (:attr:`Problem.benchmark`)."""


def _generated_row(path: Path, i: int, row: dict[str, Any]) -> Problem:
    q = _text(path, i, "generated", row, "question")
    gold = _answer(path, i, "generated", row.get("answer"))
    pid = row.get("id")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
        raise _bad(path, i, "generated", f"has an 'id' that is neither a string nor an integer ({type(pid).__name__})")
    key = "difficulty" if "difficulty" in row else "n_steps"
    steps = row.get(key)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)):
        raise _bad(path, i, "generated", f"has a non-integer {key!r} ({steps!r})")
    family = row.get("benchmark", "generated")
    if family not in FAMILIES:
        raise _bad(path, i, "generated", f"has 'benchmark' {family!r}, not one of {FAMILIES}")
    return Problem(f"generated-{i}" if pid is None else str(pid), family, q, gold, steps,
                   _optional_text(path, i, "generated", row, "cot"))


def _gsm8k_row(path: Path, i: int, row: dict[str, Any]) -> Problem:
    q = _text(path, i, "GSM8K", row, "question")
    a = _text(path, i, "GSM8K", row, "answer")
    if "####" not in a or not gsm8k_gold(a):
        raise _bad(path, i, "GSM8K", "has an 'answer' without a '#### N' final line")
    steps = [ln for ln in a.split("####")[0].splitlines() if ln.strip()]
    return Problem(f"gsm8k-{i}", "gsm8k", q, gsm8k_gold(a), len(steps), a)


def math_level(v: Any) -> int | None:
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
    return Problem(str(uid) if uid else f"math-{i}", "math", q, gold, math_level(row.get("level")),
                   _optional_text(path, i, "MATH", row, "solution"))


def jsonl_files(path: str | os.PathLike[str], what: str = "problem") -> list[Path]:
    """``path`` itself, or the ``*.jsonl`` files of the directory ``path`` in name order; a one-line error when
    it is neither an existing file nor a directory holding one."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.glob("*.jsonl") if f.is_file())
        if not files:
            raise PipelineError(f"{p}: directory holds no *.jsonl {what} file; run the stage that writes it or fix the path")
        return files
    if not p.is_file():
        raise PipelineError(f"{p}: {what} file not found; {_HINTS.get(what, 'fix the path')}")
    return [p]


def _rows(path: str | os.PathLike[str], name: str) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    for f in jsonl_files(path, name):
        for i, row in enumerate(iter_jsonl(f)):
            yield f, i, row


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


def load_rows(path: str | os.PathLike[str], what: str = "problem", default_id: str = "{stem}-{index}"
              ) -> list[dict[str, Any]]:
    """The rows of a problem file, or of a directory of them, as dicts (SFT problems, RL prompts). GSM8K rows
    (``answer`` ending in ``#### N``) and MATH rows (``problem``, ``answer``, ``solution``, ...) are read through
    :func:`benchmark_row`: ``question`` / ``answer`` become the problem text and the gold final answer, the original
    GSM8K ``answer`` / MATH ``solution`` text is kept as ``solution``, and ``id`` (when the row has none) is
    ``gsm8k-<index>`` / the MATH ``unique_id``; MATH rows without an answer are skipped. Any other row is checked as
    a generated-format row (``question``; ``answer`` text or an integer, stored as text) and, without ``id``, gets
    ``default_id`` filled in (``stem``: the file's, ``index``: the row's from 0, ``number``: from 1). One-line errors
    as for the loaders above; an empty result is an error."""
    out: list[dict[str, Any]] = []
    for f, i, row in _rows(path, what):
        bench = benchmark_row(f, i, row)
        if bench is not None:
            if bench.gold is None:
                continue  # a MATH row without a gold answer (MATH's train split has two)
            out.append({**row, "id": row.get("id", bench.id), "question": bench.question, "answer": bench.gold,
                        "solution": bench.solution})
            continue
        prob = _generated_row(f, i, row)
        pid = row["id"] if "id" in row else default_id.format(stem=f.stem, index=i, number=i + 1)
        out.append({**row, "id": pid, "answer": prob.gold})
    if not out:
        raise PipelineError(f"{path}: no {what} rows; check it is the right file")
    return out


SOLUTION_FORMATS = ("cot", "pot", "tir")
"""The solution formats a row can carry (chain of thought, program of thought, tool-integrated)."""


def row_formats(row: Mapping[str, Any]) -> list[str]:
    """The solution formats ``row`` has (non-empty text), in :data:`SOLUTION_FORMATS` order."""
    return [f for f in SOLUTION_FORMATS if isinstance(row.get(f), str) and row[f].strip()]


def load_sft_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The SFT problems (a file or a directory of them): :func:`load_rows`, and every row has a solution in at least
    one format; one-line error when missing, empty, or a row has no question, answer or solution."""
    rows = load_rows(path, "SFT problem")
    for i, r in enumerate(rows, 1):
        if not row_formats(r):
            raise PipelineError(f"{path}: SFT row {i} ({r.get('id')}) has no solution (cot, pot or tir); ingest it "
                                "with a solution or leave it out of the SFT set")
    return rows


def read_rows(path: str | os.PathLike[str], *, required: tuple[str, ...] = ("question", "answer"),
              what: str = "problem", hint: str = "fix or remove the row") -> list[dict[str, Any]]:
    """The rows of a problem JSONL file as they are (dicts: stages that copy or extend rows), each checked where it
    enters: every field of ``required`` is a non-empty string (``answer`` may also be an integer), and the file
    holds at least one row. A missing file, a malformed line, a bad row or an empty file is a one-line
    :class:`~stages.core.errors.PipelineError` naming the file and the line to edit."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: {what} file not found; run the stage that writes it (dvc repro) or fix the path")
    rows: list[dict[str, Any]] = []
    for lineno, row in iter_jsonl_lines(p):
        for key in required:
            v = row.get(key)
            ok = isinstance(v, str) and bool(v.strip()) or (key == "answer" and isinstance(v, int)
                                                             and not isinstance(v, bool))
            if not ok:
                got = "missing" if key not in row else f"{type(v).__name__} {str(v)[:40]!r}"
                raise PipelineError(f"{p}:{lineno}: {what} row has no non-empty {key!r} ({got}); {hint}")
        rows.append(row)
    if not rows:
        raise PipelineError(f"{p}: no {what} rows in the file (it is empty); give a file with at least one row")
    return rows

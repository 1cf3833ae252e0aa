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

The second half of this module turns other people's data sets into those rows (the ingest and testsets
stages call it; verification in the sandbox and decontamination are theirs): :func:`read_source` reads a
local JSONL / Parquet file, a directory of them, a ``datasets`` ``save_to_disk`` directory or a hub dataset
(``datasets.load_dataset(id, config, split=..., revision=...)``); :data:`ADAPTERS` convert one source row each
(GSM8K, MATH, MathInstruct-style instruction sets, PAL-style program sets, a generic field mapping, and the
pipeline's own rows), giving a row or the reason it is skipped.

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

from stages.core.answers import extract_answer, gsm8k_gold  # answers imports nothing of this module
from stages.core.errors import PipelineError, cause
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


# =============================================================================================
# Ingestion: other data sets into pipeline rows (used by the ingest and testsets stages)

PIPELINE_FIELDS = ("id", "question", "answer", "cot", "pot", "tir", "format", "benchmark", "difficulty", "source")
"""The fields every ingested row has (``cot`` / ``pot`` / ``tir`` None when absent), plus what an adapter keeps:
``level`` and ``type`` (MATH), ``calculator_last`` (GSM8K), ``n_steps`` / ``values`` (pipeline rows)."""

_CALC = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_BOXED = re.compile(r"\\boxed\s*(\{\s*[^}\s]|[^\s{}$])")  # a \boxed{x} or \boxed x with something in it


@dataclass(frozen=True)
class Converted:
    """One source row after its adapter: a pipeline row, or the reason it is skipped (and a short detail)."""

    row: dict[str, Any] | None
    skip: str | None = None
    detail: str = ""
    gold_from_program: bool = False
    """The row has no gold of its own: it is the value its program returns (the ingest stage runs it)."""
    note: str | None = None
    """Something about how the row was converted that the report counts (``gold_from_solution``)."""


def _skip(reason: str, detail: str = "") -> Converted:
    return Converted(None, reason, detail[:300])


def _field(row: Mapping[str, Any], fields: Mapping[str, str], name: str) -> Any:
    """Source column ``fields.get(name, name)`` of ``row`` (the adapters' own names, renamable)."""
    return row.get(fields.get(name, name))


def _str_or_none(v: Any) -> str | None:
    if isinstance(v, str):
        return v if v.strip() else None
    return None


def number_text(v: Any) -> str | None:
    """A numeric gold as text: integers without ``.0`` (PAL targets are floats: ``3431580.0`` -> ``3431580``),
    other floats by ``repr``; strings stripped; None / NaN / bool -> None."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return str(int(v)) if v.is_integer() and abs(v) < 2**63 else repr(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    return None


def boxed_response(reasoning: str, gold: str) -> str:
    """A chain-of-thought response ending in the boxed gold (the answer format of the prompts' instruction)."""
    return f"{reasoning.strip()}\nThe answer is $\\boxed{{{gold}}}$."


def _base(i: int, name: str, fields: Mapping[str, str], row: Mapping[str, Any], prefix: str) -> str:
    pid = _field(row, fields, "id")
    return str(pid) if isinstance(pid, (str, int)) and not isinstance(pid, bool) and str(pid) else f"{prefix}-{i}"


def _adapt_gsm8k(row: Mapping[str, Any], i: int, name: str, fields: Mapping[str, str]) -> Converted:
    """GSM8K ``{question, answer: "... <<a*b=c>>c ...\\n#### N"}``: gold N (commas removed); CoT = the rationale
    without calculator annotations, then ``The answer is $\\boxed{N}$.``; difficulty = rationale lines;
    ``calculator_last`` = the result of the last annotation (a diagnostic: does it equal the gold?)."""
    q, a = _str_or_none(_field(row, fields, "question")), _str_or_none(_field(row, fields, "answer"))
    if q is None:
        return _skip("no_question")
    if a is None or "####" not in a:
        return _skip("no_gold", f"answer without a '#### N' line: {a!r}")
    gold = gsm8k_gold(a)
    if not gold:
        return _skip("no_gold", f"empty '####' line: {a[-80:]!r}")
    rationale = a.split("####")[0]
    calcs = _CALC.findall(rationale)
    steps = [ln for ln in rationale.splitlines() if ln.strip()]
    return Converted({
        "id": _base(i, name, fields, row, name), "question": q, "answer": gold,
        "cot": boxed_response(strip_calculator(rationale), gold), "pot": None, "tir": None, "format": "cot",
        "benchmark": "gsm8k", "difficulty": len(steps), "source": name,
        "calculator_last": calcs[-1][1].strip() if calcs else None})


def _adapt_math(row: Mapping[str, Any], i: int, name: str, fields: Mapping[str, str]) -> Converted:
    """MATH ``{problem, solution, answer, level, type, unique_id}``: gold = ``answer`` (else the solution's last
    ``\\boxed{}``), CoT = the solution as written, difficulty = level (``3`` or ``"Level 3"``), type kept."""
    q = _str_or_none(_field(row, fields, "problem"))
    if q is None:
        return _skip("no_question")
    sol = _str_or_none(_field(row, fields, "solution"))
    gold = number_text(_field(row, fields, "answer"))
    note = None
    if gold is None and sol is not None and _BOXED.search(sol):
        gold, note = extract_answer(sol, "math"), "gold_from_solution"
    if gold is None:
        return _skip("no_gold", f"no answer and no \\boxed{{}} in the solution: {q[:120]!r}")
    pid = _field(row, fields, "unique_id")
    return Converted({
        "id": str(pid) if isinstance(pid, str) and pid else _base(i, name, fields, row, name), "question": q,
        "answer": gold, "cot": sol, "pot": None, "tir": None, "format": "cot" if sol else None, "benchmark": "math",
        "difficulty": _math_level(_field(row, fields, "level")), "source": name, "level": _field(row, fields, "level"),
        "type": _field(row, fields, "type")}, note=note)


_POT_SOURCE = re.compile(r"(?<![a-z])pot(?![a-z])|program", re.I)


def pot_from_print_program(code: str) -> str | None:
    """A program that prints its answer (MathInstruct's PoT style) in the pipeline's PoT convention: the code in a
    ``def solution():`` whose last statement, ``print(x)``, becomes ``return x``. A program that defines
    ``solution()`` already is returned as is; None when neither applies (unparsable, or the last top-level
    statement is not a one-argument ``print``)."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    if any(isinstance(n, ast.FunctionDef) and n.name == "solution" for n in tree.body):
        return code
    last = tree.body[-1] if tree.body else None
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name)
            and last.value.func.id == "print" and len(last.value.args) == 1 and not last.value.keywords):
        return None
    lines = code.splitlines()
    head = lines[: last.lineno - 1]
    ret = ast.get_source_segment(code, last.value.args[0])
    body = [("    " + ln) if ln.strip() else "" for ln in head] + [f"    return {ret}"]
    return "def solution():\n" + "\n".join(body) + "\n"


def _adapt_instruct(row: Mapping[str, Any], i: int, name: str, fields: Mapping[str, str]) -> Converted:
    """MathInstruct-style ``{instruction, output, source}``: a PoT row when ``source`` names PoT / a program
    (``data/PoT/gsm_gpt4.json``), else CoT. CoT: gold = the answer :func:`~stages.core.answers.extract_answer`
    finds in the output (none: skipped). PoT: the program in the pipeline's ``def solution()`` convention
    (:func:`pot_from_print_program`); its gold is the value it returns (run by the ingest stage)."""
    q, out = _str_or_none(_field(row, fields, "instruction")), _str_or_none(_field(row, fields, "output"))
    if q is None:
        return _skip("no_question")
    if out is None:
        return _skip("no_response")
    src = str(_field(row, fields, "source") or "")
    base = {"id": _base(i, name, fields, row, name), "question": q, "benchmark": "math", "difficulty": None,
            "source": name, "origin": src or None, "tir": None}
    if _POT_SOURCE.search(src):
        prog = pot_from_print_program(out)
        if prog is None:
            return _skip("program_form", f"not a solution() function nor ending in print(x): {out[-120:]!r}")
        return Converted({**base, "answer": None, "cot": None, "pot": prog, "format": "pot"}, gold_from_program=True)
    gold = extract_answer(out, "math")
    if gold is None:
        return _skip("no_gold", f"no answer found in the output: {out[-120:]!r}")
    return Converted({**base, "answer": gold, "cot": out, "pot": None, "format": "cot"})


def _adapt_pal(row: Mapping[str, Any], i: int, name: str, fields: Mapping[str, str]) -> Converted:
    """PAL-style program sets ``{input, code, target}`` (GSM-Hard): PoT = the ``def solution()`` program, gold =
    ``target`` (``3431580.0`` -> ``3431580``); the ingest stage checks that the program returns it."""
    q, code = _str_or_none(_field(row, fields, "input")), _str_or_none(_field(row, fields, "code"))
    if q is None:
        return _skip("no_question")
    if code is None:
        return _skip("no_program")
    gold = number_text(_field(row, fields, "target"))
    if gold is None:
        return _skip("no_gold", f"target {_field(row, fields, 'target')!r}")
    return Converted({"id": _base(i, name, fields, row, name), "question": q, "answer": gold, "cot": None,
                      "pot": code.strip() + "\n", "tir": None, "format": "pot", "benchmark": "gsm8k",
                      "difficulty": None, "source": name})


def _adapt_generic(row: Mapping[str, Any], i: int, name: str, fields: Mapping[str, str]) -> Converted:
    """Any row through ``fields`` (pipeline field -> source column; unnamed fields use their own name):
    ``question`` required; ``answer`` (text or number) or, without it, the answer extracted from ``cot`` or the
    value ``pot`` returns; ``cot`` / ``pot`` / ``tir`` / ``id`` / ``difficulty`` optional."""
    q = _str_or_none(_field(row, fields, "question"))
    if q is None:
        return _skip("no_question")
    cot, pot, tir = (_str_or_none(_field(row, fields, k)) for k in ("cot", "pot", "tir"))
    gold = number_text(_field(row, fields, "answer"))
    from_program = False
    if gold is None and cot is not None:
        gold = extract_answer(cot, "math")
    if gold is None and pot is not None:
        from_program = True
    elif gold is None:
        return _skip("no_gold", f"no answer field and none in the solution: {q[:120]!r}")
    diff = _field(row, fields, "difficulty")
    fmt = "cot" if cot else "pot" if pot else "tir" if tir else None
    return Converted({"id": _base(i, name, fields, row, name), "question": q, "answer": gold, "cot": cot, "pot": pot,
                      "tir": tir, "format": fmt, "benchmark": "math",
                      "difficulty": diff if isinstance(diff, int) and not isinstance(diff, bool) else None,
                      "source": name}, gold_from_program=from_program)


def _adapt_pipeline(row: Mapping[str, Any], i: int, name: str, fields: Mapping[str, str]) -> Converted:
    """The pipeline's own rows (the data stage's problems, earlier ingest output): kept as they are, with the
    pipeline fields filled in (gold checked as the problem loaders do; ``format`` None: the row may hold several)."""
    q = _str_or_none(row.get("question"))
    if q is None:
        return _skip("no_question")
    a = row.get("answer")
    gold = gsm8k_gold(a) if isinstance(a, str) and "####" in a else number_text(a)
    if not gold:
        return _skip("no_gold", f"answer {a!r}")
    family = row.get("benchmark", "generated")
    if family not in FAMILIES:
        return _skip("bad_benchmark", f"benchmark {family!r}")
    diff = row.get("difficulty", row.get("n_steps"))
    return Converted({**row, "id": _base(i, name, fields, row, name), "question": q, "answer": gold,
                      **{k: _str_or_none(row.get(k)) for k in ("cot", "pot", "tir")}, "format": row.get("format"),
                      "benchmark": family, "difficulty": diff if isinstance(diff, int) and not isinstance(diff, bool)
                      else None, "source": row.get("source", name)})


Adapter = Callable[[Mapping[str, Any], int, str, Mapping[str, str]], Converted]
ADAPTERS: dict[str, Adapter] = {
    "pipeline": _adapt_pipeline, "gsm8k": _adapt_gsm8k, "math": _adapt_math, "instruct": _adapt_instruct,
    "pal": _adapt_pal, "generic": _adapt_generic,
}
"""Adapter by name: ``(source row, its index, data set name, field renames) -> Converted``."""


def read_source(path: str | os.PathLike[str], *, hub: Mapping[str, Any] | None = None, limit: int | None = None
                ) -> Iterator[dict[str, Any]]:
    """The rows of a data set, streamed: ``hub`` ``{id, config, split, revision}``:
    ``datasets.load_dataset(id, config, split=split, revision=revision)`` (``id`` may also be a local dataset
    directory); else ``path``: a JSONL (``.jsonl`` / ``.json`` lines) or Parquet file, a directory of them (name
    order), or a ``datasets`` ``save_to_disk`` directory (a Dataset; for a DatasetDict give its split's
    directory). ``limit``: the first rows only. One-line errors for a missing or unreadable source."""
    it = _hub_rows(hub) if hub is not None else _local_rows(Path(path))
    for k, row in enumerate(it):
        if limit is not None and k >= limit:
            return
        yield row


def _hub_rows(hub: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    import datasets

    try:
        ds = datasets.load_dataset(hub["id"], hub.get("config"), split=hub["split"], revision=hub.get("revision"))
    except Exception as e:  # noqa: BLE001 (network, missing config or split: one line, the cause named)
        raise PipelineError(f"hub dataset {hub['id']} (config {hub.get('config')}, split {hub['split']}, revision "
                            f"{hub.get('revision')}): cannot load ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                            "check the id, config, split and revision, and the network") from None
    yield from ds


def _local_rows(p: Path) -> Iterator[dict[str, Any]]:
    if p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file()):
        import datasets

        if (p / "dataset_dict.json").is_file():
            splits = sorted(d.name for d in p.iterdir() if d.is_dir())
            raise PipelineError(f"{p}: a save_to_disk DatasetDict (splits {splits}); give the split's directory, "
                                f"e.g. {p / splits[0]}" if splits else f"{p}: an empty DatasetDict")
        try:
            ds = datasets.load_from_disk(str(p))
        except Exception as e:  # noqa: BLE001 - corrupt state.json / arrow files: one line naming the directory
            raise PipelineError(f"{p}: not a readable datasets directory ({cause(e)}); save it again or fix the "
                                "path") from None
        yield from _guarded(p, (ds[i:i + 1024] for i in range(0, len(ds), 1024)), "datasets directory", columns=True)
        return
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in (".jsonl", ".json", ".parquet"))
        if not files:
            raise PipelineError(f"{p}: no .jsonl / .json / .parquet file in the directory; fix the path")
    elif p.is_file():
        files = [p]
    else:
        raise PipelineError(f"{p}: data set not found; fix the path (a JSONL / Parquet file, a directory of them, or a "
                            "save_to_disk directory)")
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                pf = pq.ParquetFile(f)
            except Exception as e:  # noqa: BLE001
                raise PipelineError(f"{f}: not a readable Parquet file ({cause(e)}); fix or remove it") from None
            start = 0
            for g in range(pf.num_row_groups):  # row group by row group: an error names its first row
                batches = (b.to_pylist() for b in pf.iter_batches(batch_size=1024, row_groups=[g]))
                yield from _guarded(f, batches, "Parquet", start=start, group=g)
                start += pf.metadata.row_group(g).num_rows
        else:
            yield from iter_jsonl(f)


def _guarded(path: Path, batches: Iterator[Any], what: str, columns: bool = False, start: int = 0,
             group: int | None = None) -> Iterator[dict[str, Any]]:
    """The rows of ``batches`` (lists of rows, or column dicts with ``columns``); a read that fails part way (a
    corrupt data page, a truncated arrow file) is a one-line PipelineError naming the file and the first row of the
    batch that could not be read (``start``: the first row's number; ``group``: the Parquet row group)."""
    row = start
    while True:
        try:
            batch = next(batches)
            rows = ([{k: batch[k][j] for k in batch} for j in range(len(next(iter(batch.values()), [])))]
                    if columns else batch)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - pyarrow / datasets raise many types for corrupt data
            where = f"rows from {row}" + (f" (row group {group})" if group is not None else "")
            raise PipelineError(f"{path}: {where}: corrupt {what} data ({cause(e)}); re-create or re-download the "
                                "file") from None
        yield from rows
        row += len(rows)


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

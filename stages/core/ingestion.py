"""Data sets into pipeline rows, checked: the conversion the ingest and testsets stages share.

:func:`convert` reads one data set (:func:`read_source`: a local JSONL / Parquet file, a directory of them, a
``datasets`` ``save_to_disk`` directory, or a hub data set from the snapshot ``python -m stages.ingest fetch``
saved, checked against its pin), keeps the rows ``match`` selects, converts each
with its adapter (:data:`ADAPTERS`: GSM8K, MATH, MathInstruct-style instruction sets, PAL-style program sets, a
generic field mapping and the pipeline's own rows; a row the adapter cannot convert is a counted skip),
runs every program (PoT rows; not those of the pipeline's own rows, checked where they were made) in the sandbox
(kept only when it returns the gold: ``program_failed`` / ``program_wrong``; a row without a gold of its own gets the
value its program returns), and checks the round trip:
the response text the adapter wrote must give the gold through the evaluator's own ``extract_answer`` +
``is_equivalent`` (stages/evaluate/loop.py's extraction per benchmark family and percent rule). The report counts
rows in and out per format, skips by reason (with samples), the program checks, the round-trip rate, and for
GSM8K how often the last calculator annotation equals the gold.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core import paths
from stages.core.answers import extract_answer, gsm8k_gold
from stages.core.errors import PipelineError, cause
from stages.core.io import iter_jsonl, split_timings, write_json, write_timings
from stages.core.problems import FAMILIES, math_level, strip_calculator
from stages.schema.datasets import DatasetSpec

HUB_PIN = "hub.json"
"""The pin of a fetched hub snapshot (``{id, config, split, revision, fingerprint, rows}``), beside its files."""


def _family(row: Mapping[str, Any]) -> str:
    """Answer extraction of the evaluator for a row's benchmark family (stages/evaluate/loop.py)."""
    return "math" if row.get("benchmark") == "math" else "gsm8k"


def evaluator_checks(preds: list[str | None], rows: list[dict[str, Any]], workers: int) -> list[bool]:
    """``is_equivalent(pred, row's gold)`` as the evaluate stage checks it: the percent rule (gold x 100 or / 100
    accepted) for the real benchmarks' families, not for generated problems."""
    from stages.core.answers import are_equivalent

    out: list[bool] = [False] * len(rows)
    for generated in (True, False):
        idx = [k for k, r in enumerate(rows) if (r.get("benchmark", "generated") == "generated") == generated]
        res = are_equivalent([preds[k] for k in idx], [rows[k]["answer"] or "" for k in idx], workers=workers,
                             percent_variants=not generated)
        for k, ok in zip(idx, res, strict=True):
            out[k] = ok
    return out


def _sample(i: int, row: Mapping[str, Any] | None, detail: str, src: Mapping[str, Any] | None = None) -> dict[str, Any]:
    q = (row or {}).get("question") or next((v for v in (src or {}).values() if isinstance(v, str)), "")
    return {"row": i, "id": (row or {}).get("id"), "question": str(q)[:200], "detail": detail[:300]}


class Tally:
    """Counts and samples of one data set's conversion (the report)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.skipped: Counter[str] = Counter()
        self.examples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def skip(self, reason: str, sample: dict[str, Any]) -> None:
        self.skipped[reason] += 1
        if len(self.examples[reason]) < self.samples:
            self.examples[reason].append(sample)


def check_hub_snapshot(spec: DatasetSpec, name: str) -> None:
    """A hub data set's ``path`` must hold the snapshot of exactly its pin; one-line error otherwise."""
    assert spec.hub is not None
    pin_file = Path(spec.path) / HUB_PIN
    want = {k: getattr(spec.hub, k) for k in ("id", "config", "split", "revision")}
    if not pin_file.is_file():
        raise PipelineError(f"{name}: {spec.path} holds no fetched hub snapshot ({HUB_PIN}); run "
                            f"`python -m stages.ingest fetch {name}` first")
    got = json.loads(pin_file.read_text())
    if {k: got.get(k) for k in want} != want:
        raise PipelineError(f"{name}: the snapshot in {spec.path} is of {got}, params ask for {want}; run "
                            f"`python -m stages.ingest fetch {name}` again")


def convert(spec: DatasetSpec, name: str, *, role: str | None, timeout_s: float, workers: int, samples: int
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Steps 1-3 of the module docstring for one data set: (kept rows, report). ``role``: sft / rl for training
    sets (a row failing the round trip is skipped; sft rows need a solution), None for a test set (kept)."""
    t0 = time.perf_counter()
    if spec.hub is not None:
        check_hub_snapshot(spec, name)
    tally = Tally(samples)
    rows, from_program, notes, rows_in, filtered = _read_rows(spec, name, role, tally)
    bad, programs = _check_programs(spec, rows, from_program, timeout_s, workers)
    round_trip = _round_trip(rows, bad, role, workers, samples)
    kept: list[dict[str, Any]] = []
    for k, r in enumerate(rows):
        if k in bad:
            tally.skip(bad[k][0], _sample(r["_i"], r, bad[k][1]))
            continue
        kept.append({key: v for key, v in r.items() if key != "_i" and not (key in ("cot", "pot", "tir") and v is None)})
    by_format = Counter(r.get("format") or "mixed" for r in kept)
    report: dict[str, Any] = {
        "name": name, "adapter": spec.adapter, "role": role or "test",
        "source": {"path": spec.path, "hub": None if spec.hub is None else spec.hub.model_dump()},
        "rows_in": rows_in, "filtered_out": filtered, "rows_out": len(kept),
        "by_format": dict(sorted(by_format.items())), "skipped": dict(sorted(tally.skipped.items())),
        "skip_samples": dict(tally.examples), "programs": programs, "round_trip": round_trip,
        "notes": dict(sorted(notes.items())),
    }
    if spec.adapter == "gsm8k":
        report["gsm8k_calculator"] = _gsm8k_calculator(rows, samples)
    if spec.hub is not None and spec.hub.revision is None:
        report["warning"] = f"hub data set {spec.hub.id} is not pinned (revision null)"
        print(f"warning: {name}: {report['warning']}; DVC tracks the fetched snapshot, not the hub", file=sys.stderr)
    if not kept:
        raise PipelineError(f"{name}: no row of {spec.path} was kept (skipped: {dict(tally.skipped)}); check the "
                            f"adapter ({spec.adapter}) and fields")
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    return kept, report


def _read_rows(spec: DatasetSpec, name: str, role: str | None, tally: Tally
               ) -> tuple[list[dict[str, Any]], list[bool], Counter[str], int, int]:
    """1. The source's rows that match ``spec.match``, converted by the adapter (the unconvertible ones, and SFT rows
    without a solution, skipped into ``tally``); returns (rows with their source index ``_i``, whether each gold
    answer comes from its program, the adapters' notes, rows read, rows filtered out)."""
    adapter = ADAPTERS[spec.adapter]
    match = {col: re.compile(rx) for col, rx in spec.match.items()}
    rows: list[dict[str, Any]] = []
    from_program: list[bool] = []
    notes: Counter[str] = Counter()
    rows_in = filtered = 0
    for i, src in enumerate(read_source(spec.path, limit=spec.limit)):
        rows_in += 1
        if any(not rx.search(str(src.get(col, ""))) for col, rx in match.items()):
            filtered += 1
            continue
        conv = adapter(src, i, name, spec.fields)
        if conv.row is None:
            tally.skip(conv.skip or "unconvertible", _sample(i, None, conv.detail, src))
            continue
        row = conv.row
        if conv.note:
            notes[conv.note] += 1
        if role == "sft" and not any(row.get(k) for k in ("cot", "pot", "tir")):
            tally.skip("no_response", _sample(i, row, "an SFT row needs a solution (cot, pot or tir)"))
            continue
        rows.append({**row, "_i": i})
        from_program.append(conv.gold_from_program)
    if rows_in == 0:
        raise PipelineError(f"{name}: {spec.path} holds no rows; check the path")
    return rows, from_program, notes, rows_in, filtered


def _check_programs(spec: DatasetSpec, rows: list[dict[str, Any]], from_program: list[bool], timeout_s: float,
                    workers: int) -> tuple[dict[int, tuple[str, str]], dict[str, int]]:
    """2. The rows' programs run in the sandbox and checked against the gold answer (a gold answer that comes from
    the program is the program's value). The pipeline's own rows were checked where they were made (the data stage
    writes programs that compute their answers; SFT runs them again with sft.verify_programs): only other data
    sets' programs run here. Returns (the bad rows: index -> (skip reason, detail), the programs' counts)."""
    from stages.core import sandbox

    prog = [k for k, r in enumerate(rows) if r.get("pot") and spec.adapter != "pipeline"]
    results = sandbox.run_many_pot([rows[k]["pot"] for k in prog], workers=workers, **sandbox.cpu_limit(timeout_s)) \
        if prog else []
    runs = dict(zip(prog, results, strict=True))
    values = {k: v for k, (_, v) in runs.items()}
    for k in prog:
        if from_program[k] and values[k] is not None:
            rows[k]["answer"] = str(values[k]).strip()
    checks = evaluator_checks([values[k] for k in prog], [rows[k] for k in prog], workers)
    bad: dict[int, tuple[str, str]] = {}
    for k, ok in zip(prog, checks, strict=True):
        r = rows[k]
        if values[k] is None:
            res = runs[k][0]
            bad[k] = ("program_failed", f"{res.status}: {(res.stderr or '').strip()[-200:]}")
        elif not ok:
            bad[k] = ("program_wrong", f"returned {values[k]!r}, gold {r['answer']!r}")
    programs = {"run": len(prog), "ok": len(prog) - len(bad), "failed": sum(1 for b in bad.values() if b[0] == "program_failed"),
                "wrong": sum(1 for b in bad.values() if b[0] == "program_wrong"),
                "gold_from_program": sum(1 for k in prog if from_program[k])}
    return bad, programs


def _round_trip(rows: list[dict[str, Any]], bad: dict[int, tuple[str, str]], role: str | None, workers: int,
                samples: int) -> dict[str, Any]:
    """3. The round trip of the written response (cot; the program check is the pot round trip): its extracted
    answer against the gold one; a training row that fails is added to ``bad``. Returns the round trip's report."""
    from stages.core.answers import extract_answer

    cot = [k for k, r in enumerate(rows) if r.get("cot") and k not in bad]
    preds = [extract_answer(rows[k]["cot"], _family(rows[k])) for k in cot]
    rt = evaluator_checks(preds, [rows[k] for k in cot], workers)
    rt_fail, fail_pred = [], {}
    for k, pred, ok in zip(cot, preds, rt, strict=True):
        if not ok:
            rt_fail.append(k)
            fail_pred[k] = pred
            if role is not None:
                bad[k] = ("response_gold_mismatch", f"extracted {pred!r}, gold {rows[k]['answer']!r}")
    return {"checked": len(cot), "ok": len(cot) - len(rt_fail),
            "rate": round((len(cot) - len(rt_fail)) / len(cot), 6) if cot else None,
            "failures": [_sample(rows[k]["_i"], rows[k], f"extracted {fail_pred[k]!r}, gold {rows[k]['answer']!r}")
                         for k in rt_fail[:samples]],
            "failures_kept": role is None}


def _gsm8k_calculator(rows: list[dict[str, Any]], samples: int) -> dict[str, Any]:
    """GSM8K's calculator annotations: how often the last one equals the gold answer (and samples where not)."""
    with_calc = [r for r in rows if r.get("calculator_last") is not None]
    agree = [parse_float(r["calculator_last"]) == parse_float(r["answer"]) for r in with_calc]
    return {
        "rows": len(rows), "with_annotation": len(with_calc), "last_annotation_equals_gold": sum(agree),
        "rate": round(sum(agree) / len(with_calc), 4) if with_calc else None,
        "disagree_samples": [_sample(r["_i"], r, f"last annotation {r['calculator_last']!r}, gold {r['answer']!r}")
                             for r, ok in zip(with_calc, agree, strict=True) if not ok][:samples]}


def parse_float(s: Any) -> float | None:
    """A GSM8K number as a float (``$1,200`` -> 1200.0), None when it is not one."""
    try:
        return float(str(s).replace(",", "").replace("$", "").strip().rstrip("."))
    except ValueError:
        return None


def metrics_of(report: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of a report (dvc metrics): no samples, no text."""
    def nums(d: Any) -> Any:
        if isinstance(d, Mapping):
            out = {k: nums(v) for k, v in d.items() if not k.endswith("samples") and k not in ("failures", "source")}
            return {k: v for k, v in out.items() if v is not None and v != {}}
        return d if isinstance(d, (int, float, bool)) else None
    return nums(report)


def write_report(stage: str, name: str, report: dict[str, Any]) -> dict[str, Any]:
    """Write data set ``name``'s report of ``stage`` (testsets / ingest) and its metrics; return the metrics. The
    report and the metrics are the same bytes for the same inputs (the report is a DVC-cached output); the timings
    (``wall_s``) go to ``data/timings/<stage>_<name>.json`` (stages.core.io.write_timings)."""
    report, timings = split_timings(report)
    write_json(paths.report_file(stage, name), report)
    metrics = metrics_of(report)
    write_json(paths.metrics_file(f"{stage}_{name}"), metrics)
    write_timings(f"{stage}_{name}", timings)
    return {**metrics, **(timings or {})}


# =============================================================================================
# Reading a data set (:func:`read_source`) and converting its rows (:data:`ADAPTERS`)

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
        "difficulty": math_level(_field(row, fields, "level")), "source": name, "level": _field(row, fields, "level"),
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

"""Data sets into pipeline rows, checked: the conversion the ingest and testsets stages share.

:func:`convert` reads one data set (:func:`stages.core.problems.read_source`; a hub data set from the snapshot
``python -m stages.ingest fetch`` saved, checked against its pin), keeps the rows ``match`` selects, converts each
with its adapter (:data:`stages.core.problems.ADAPTERS`: a row the adapter cannot convert is a counted skip),
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
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import split_timings, write_json, write_timings
from stages.core.problems import ADAPTERS, read_source
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

"""The ``ingest`` stage (dvc.yaml: ``ingest@<name>``, one per ``ingest.datasets`` entry): one SFT or RL data set
into the pipeline's rows, checked, decontaminated, with a report of every row it did not keep.

For each data set (:func:`stages.core.ingestion.convert`, shared with the testsets stage):

1. read the rows (:func:`stages.core.ingestion.read_source`: a local JSONL / Parquet file or directory, a
   ``save_to_disk`` directory; a hub data set is read from the snapshot ``python -m stages.ingest fetch`` saved,
   checked against its pin), keep those ``match`` selects, convert each with its adapter
   (:data:`stages.core.ingestion.ADAPTERS`); a row the adapter cannot convert is a counted skip (its reason);
2. run every program (PoT rows) in the sandbox: a row is kept only when the program returns the gold
   (``program_failed``: no value; ``program_wrong``: another value); a row without a gold of its own (an
   instruction set's PoT row) gets the value its program returns;
3. the round trip: the response text the adapter wrote must give the gold through the evaluator's own
   ``extract_answer`` + ``is_equivalent`` (the benchmark family's extraction, as stages/evaluate/loop.py); the
   rate is reported, and a training row that fails is skipped (``response_gold_mismatch``);
4. decontaminate (ingest only) against the test sets (``ingest.common.decontam``: the containment rule of
   stages/corpus/decontaminate.py) on question + response; a removed row is counted with the test item it copies.

Outputs: data/ingest/<role>/<name>.jsonl (role sft: SFT examples, every row has a solution; role rl: RL prompts),
data/reports/ingest/<name>.json (counts, skips by reason with samples, round trip, program checks, GSM8K's
calculator diagnostic, decontamination), data/metrics/ingest_<name>.json (the report's numbers).

Hub data sets: ``python -m stages.ingest fetch [--params P] [NAME ...]`` saves every data set of the ingest and
testsets sections that has ``hub`` set (or the named ones) with ``datasets.load_dataset(id, config, split=,
revision=)`` to its ``path`` (save_to_disk) plus ``hub.json`` (the pin); DVC then tracks that directory like any
local data set. An unpinned data set (``revision: null``) is fetched with a warning, once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.ingestion import HUB_PIN, convert, write_report
from stages.core.io import atomic_path, write_jsonl
from stages.schema.datasets import DatasetSpec
from stages.schema.ingest import IngestParams


def decontaminate_rows(rows: list[dict[str, Any]], p: IngestParams, samples: int
                       ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows not copying a test set (question + response against ``p.common.decontam``), and the report part."""
    from stages.corpus.decontaminate import ContaminationIndex, load_benchmarks

    d = p.common.decontam
    bench = load_benchmarks(testsets=d.testsets)
    index = ContaminationIndex(bench, d.ngram, min_short=d.min_short, min_overlap=d.min_overlap)
    kept, removed = [], []
    for r in rows:
        text = "\n".join(x for x in (r["question"], r.get("cot"), r.get("pot"), r.get("tir")) if x)
        hit = index.overlap(text)
        if hit is None:
            kept.append(r)
        else:
            removed.append((r, hit))
    by = Counter(f"{b}" for _, (b, _, _) in removed)
    return kept, {
        "testsets": {b: len(v) for b, v in bench.items()}, "ngram": d.ngram, "min_overlap": d.min_overlap,
        "removed": len(removed), "by_testset": dict(sorted(by.items())),
        "samples": [{"id": r["id"], "question": r["question"][:200], "testset": b, "item": item,
                     "overlap": None if share is None else round(share, 3)} for r, (b, item, share) in removed[:samples]],
    }


def run(p: IngestParams, name: str) -> dict[str, Any]:
    """Ingest data set ``name`` of ``p.datasets``; write its rows, report and metrics; return the metrics."""
    if name not in p.datasets:
        raise PipelineError(f"ingest: unknown data set {name!r}; ingest.datasets has {sorted(p.datasets)}")
    spec = p.datasets[name]
    c = p.common
    rows, report = convert(spec, name, role=spec.role, timeout_s=c.exec_timeout_s, workers=c.exec_workers,
                           samples=c.samples)
    rows, report["decontamination"] = decontaminate_rows(rows, p, c.samples)
    report["rows_out"] = len(rows)
    report["by_format"] = dict(sorted(Counter(r.get("format") or "mixed" for r in rows).items()))
    if not rows:
        raise PipelineError(f"{name}: decontamination removed every row; check ingest.common.decontam")
    write_jsonl(paths.ingest_file(spec.role, name), rows)
    return write_report("ingest", name, report)


# ---------------------------------------------------------------------------------------------- fetch


def fetch(spec: DatasetSpec, name: str, key: str | None = None) -> dict[str, Any]:
    """Save hub data set ``name`` (``spec.hub``) to ``spec.path`` with its pin; return the pin. ``spec.path`` (the field
    ``key``) must lie inside the project or a data root (:func:`stages.core.paths.write_target`), and a directory
    already there is replaced only when an earlier fetch made it (it holds the pin file)."""
    assert spec.hub is not None
    key = key or f"datasets.{name}.path"
    target = paths.write_target(spec.path, key)
    paths.replaceable(target, key, "`python -m stages.ingest fetch`", HUB_PIN)
    import datasets

    h = spec.hub
    if h.revision is None:
        print(f"warning: {name}: hub data set {h.id} is not pinned (revision null): fetching the latest; pin it with "
              "revision: <commit sha> so that a rerun fetches the same rows", file=sys.stderr)
    try:
        ds = datasets.load_dataset(h.id, h.config, split=h.split, revision=h.revision)
    except Exception as e:  # noqa: BLE001 (network, missing config or split: one line)
        raise PipelineError(f"{name}: cannot load hub data set {h.id} (config {h.config}, split {h.split}, revision "
                            f"{h.revision}): {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    pin = {"id": h.id, "config": h.config, "split": h.split, "revision": h.revision,
           "fingerprint": getattr(ds, "_fingerprint", None), "rows": len(ds)}
    with atomic_path(target) as tmp:
        ds.save_to_disk(str(tmp))
        (tmp / HUB_PIN).write_text(json.dumps(pin, indent=2) + "\n")
    return pin


def hub_datasets(params_path: str) -> dict[str, tuple[str, DatasetSpec]]:
    """Every data set of the ingest and testsets sections that has a hub source, by name: (its path's key, it)."""
    from stages.schema.testsets import TestsetsParams

    out: dict[str, tuple[str, DatasetSpec]] = {}
    for section in (IngestParams.from_file(params_path), TestsetsParams.from_file(params_path)):
        out.update({n: (f"{section.SECTION}.datasets.{n}.path", s) for n, s in section.datasets.items()
                    if s.hub is not None})
    return out


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m stages.ingest fetch [--params P] [NAME ...]``: fetch hub data sets (all of them by default)."""
    ap = argparse.ArgumentParser(prog="python -m stages.ingest", description="Fetch the hub data sets of params.")
    ap.add_argument("command", choices=["fetch"])
    ap.add_argument("names", nargs="*", help="data sets to fetch (default: every one with a hub source)")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(list(argv) if argv is not None else None)
    try:
        specs = hub_datasets(args.params)
        unknown = [n for n in args.names if n not in specs]
        if unknown:
            raise PipelineError(f"no hub data set named {unknown} in {args.params} (hub data sets: {sorted(specs)})")
        done: dict[tuple[str, str], str] = {}  # one fetch per snapshot directory and pin (sft and rl share one)
        for n in args.names or sorted(specs):
            field, spec = specs[n]
            key = (spec.path, json.dumps(spec.hub.model_dump() if spec.hub else None, sort_keys=True))
            if key in done:
                print(f"{n}: same snapshot as {done[key]} ({spec.path})")
                continue
            pin = fetch(spec, n, field)
            done[key] = n
            print(f"{n}: {pin['rows']} rows of {pin['id']} ({pin['split']}, revision {pin['revision']}) -> {spec.path}")
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

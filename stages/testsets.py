"""The ``testsets`` stage (dvc.yaml: ``testsets@<name>``, one per ``testsets.datasets`` entry): one evaluation set
into the pipeline's rows, with a report of every row it did not keep.

The conversion is the ingest stage's (:func:`stages.core.ingestion.convert`: read, adapter, programs checked in the
sandbox, the round trip of the written response through the evaluator's ``extract_answer`` + ``is_equivalent``),
except that a test row is never dropped for its round trip (its gold is the benchmark's; the rate is reported)
and test sets are not decontaminated (they are what everything else is decontaminated against). A PAL / PoT row
whose program does not return its gold is skipped: GSM-Hard's numbers were changed by hand, and a row whose
program disagrees with its target has no trustworthy gold.

Outputs: data/testsets/<name>.jsonl (read by the evaluate stage as benchmark ``<name>``, by the corpus and ingest
stages for decontamination, by grpo's held-out curve), data/reports/testsets/<name>.json,
data/metrics/testsets_<name>.json.
"""

from __future__ import annotations

from typing import Any

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.ingestion import convert, write_report
from stages.core.io import write_jsonl
from stages.schema.testsets import TestsetsParams


def run(p: TestsetsParams, name: str) -> dict[str, Any]:
    """Convert test set ``name`` of ``p.datasets``; write its rows, report and metrics; return the metrics."""
    if name not in p.datasets:
        raise PipelineError(f"testsets: unknown test set {name!r}; testsets.datasets has {sorted(p.datasets)}")
    c = p.common
    rows, report = convert(p.datasets[name], name, role=None, timeout_s=c.exec_timeout_s, workers=c.exec_workers,
                           samples=c.samples)
    for r in rows:
        r["source"] = name
    write_jsonl(paths.testset_file(name), rows)
    return write_report("testsets", name, report)

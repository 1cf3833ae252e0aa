"""The ingestion report on the full real files: GSM8K train / test, MATH train / test, GSM-Hard (issue 16).

    python benchmarks/ingest_report.py

Each file goes through the ingest / testsets stages' conversion (stages.core.ingestion.convert: adapter, programs in
the sandbox, the round trip of the written response through the evaluator's extract_answer + is_equivalent); the
training files as the ingest stage sees them (role sft: a row failing the round trip is skipped), the test files as
the testsets stage does (kept, the rate reported). Then the training files are decontaminated against GSM8K test +
MATH test as the ingest stage does (ingest.common.decontam: 10-grams, min_overlap 0.7) and, for contrast, with the
paper's literal rule (min_overlap 0).

Writes benchmarks/results/ingest.json (the reports, without samples beyond 3 per reason) and prints a table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core.ingestion import convert  # noqa: E402
from stages.corpus.decontaminate import ContaminationIndex, load_benchmarks  # noqa: E402
from stages.schema.datasets import DatasetSpec  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))
FILES = [  # name, path, adapter, role (None: a test set)
    ("gsm8k_train", "gsm8k/train.jsonl", "gsm8k", "sft"),
    ("gsm8k_test", "gsm8k/test.jsonl", "gsm8k", None),
    ("math_train", "math/train.jsonl", "math", "sft"),
    ("math_test", "math/test.jsonl", "math", None),
    ("gsm_hard", "pot_tir/pal_gsmhardv2.jsonl", "pal", None),
]


def _frac(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.2%})" if n else "-"


def main() -> int:
    if not (SHARED / "README.md").is_file():
        print(f"real data not found at {SHARED}; set SHARED_DATA", file=sys.stderr)
        return 2
    t0, load0 = time.perf_counter(), os.getloadavg()
    reports: dict[str, Any] = {}
    kept: dict[str, list[dict[str, Any]]] = {}
    for name, rel, adapter, role in FILES:
        spec = DatasetSpec(path=str(SHARED / rel), hub=None, adapter=adapter, fields={}, match={}, limit=None)
        rows, rep = convert(spec, name, role=role, timeout_s=10.0, workers=2, samples=3)
        kept[name], reports[name] = rows, rep
        rt = rep["round_trip"]
        print(f"{name}: {rep['rows_in']} in, {rep['rows_out']} out {rep['by_format']}, skipped {rep['skipped']}, "
              f"round trip {rt['ok']}/{rt['checked']}, programs {rep['programs']['ok']}/{rep['programs']['run']} "
              f"({rep['wall_s']} s)", flush=True)
    bench = load_benchmarks(gsm8k=SHARED / "gsm8k" / "test.jsonl", math=SHARED / "math" / "test.jsonl")
    decon: dict[str, Any] = {}
    for rule, theta in (("chosen", 0.7), ("paper", 0.0)):
        index = ContaminationIndex(bench, 10, min_short=3, min_overlap=theta)
        decon[rule] = {}
        for name in ("gsm8k_train", "math_train"):
            rows = kept[name]
            removed = [r for r in rows if index.match("\n".join(x for x in (r["question"], r.get("cot")) if x))]
            decon[rule][name] = {"rows": len(rows), "removed": len(removed), "kept": len(rows) - len(removed),
                                 "min_overlap": theta}
    rl = sum(decon["chosen"][n]["kept"] for n in ("gsm8k_train", "math_train"))
    result = {"reports": reports, "decontamination": decon, "rl_prompts_gsm8k_math_train": rl,
              "wall_s": round(time.perf_counter() - t0, 1), "loadavg_before": [round(x, 2) for x in load0],
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    out = ROOT / "benchmarks" / "results" / "ingest.json"
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print("\n| file | rows in | rows out (format) | skipped | round trip | programs | GSM8K calc = gold |")
    print("|---|---|---|---|---|---|---|")
    for name, rep in reports.items():
        rt, pr, calc = rep["round_trip"], rep["programs"], rep.get("gsm8k_calculator")
        cells = [name, rep["rows_in"], f"{rep['rows_out']} {rep['by_format']}", rep["skipped"] or "-",
                 _frac(rt["ok"], rt["checked"]), _frac(pr["ok"], pr["run"]),
                 _frac(calc["last_annotation_equals_gold"], calc["with_annotation"]) if calc else "-"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print(f"\ndecontamination of the training files: {json.dumps(decon)}\nRL prompts from GSM8K + MATH train: {rl}")
    print(f"wrote {out.relative_to(ROOT)} in {result['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

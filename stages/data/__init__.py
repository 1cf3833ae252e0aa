"""The ``data`` stage: everything the pipeline generates itself, deterministically from ``data.seed``.

Outputs (data/generated/):
- problems/{sft,rl,test}.jsonl: word problems with CoT / PoT / TIR solutions (stages/data/problems.py);
- crawl.jsonl and seed.jsonl: a web crawl with ground-truth labels and a seed math corpus
  (stages/data/crawl.py), the stand-ins for Common Crawl and OpenWebMath.
"""

from __future__ import annotations

import time
from typing import Any

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, write_jsonl, write_metrics
from stages.data import crawl, problems
from stages.schema.data import DataParams


def run(p: DataParams) -> dict[str, Any]:
    """Generate problems, crawl and seed corpus into data/generated/ (atomically); return metrics."""
    t0 = time.perf_counter()
    pp = p.problems  # min_steps <= max_steps: checked by the schema when params are loaded
    try:
        splits = problems.generate_splits(
            p.seed, n_sft=pp.n_sft, n_rl=pp.n_rl, n_test=pp.n_test,
            min_steps=pp.min_steps, max_steps=pp.max_steps, max_value=pp.max_value,
        )
    except ValueError as e:
        raise PipelineError(f"data.problems: {e}") from None
    metrics: dict[str, Any] = {"problems": {k: len(v) for k, v in splits.items()}}
    with atomic_path(paths.GENERATED) as out:
        for split, rows in splits.items():
            write_jsonl(out / "problems" / f"{split}.jsonl", rows)
        metrics["crawl"] = crawl.generate(
            p.crawl, seed=p.seed, test_problems=splits["test"],
            crawl_path=out / paths.CRAWL.name, seed_path=out / paths.SEED.name,
        )
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    write_metrics("data", metrics, ["problems.*", "crawl.pages", "crawl.math_pages", "crawl.seed_pages"])
    return metrics

"""The ``report`` stage: one static, self-contained HTML page of the whole run (the last stage of dvc.yaml).

Reads every stage's metrics (data/details/*.json), the training curves (data/plots/{pretrain,sft}/*.tsv,
data/plots/grpo/*.csv) and the committed comparison results (benchmarks/results/paradigm.json, iterative_rl.json;
``report.benchmark_results``): the exact list is :func:`stages.report.inputs.input_files`. Writes

- ``data/report/index.html``: a headline table of held-out accuracy per model (± standard errors), every model
  comparison with its paired-bootstrap interval (stages/report/uncertainty.py), the verifier-sensitivity table (each
  checker mode and math-verify), the paper's reference numbers beside ours (stages/report/paper.py, each with its table or figure), a stages overview, then one section per
  stage with its key metrics, its curves (matplotlib PNGs inlined as ``data:`` URIs: the page fetches nothing)
  and every metric in a collapsed table;
- ``data/report/summary.md``: the headline, the paper comparison and the stages as markdown (the flow publishes
  it as the Prefect artifact ``report-summary``);
- ``data/metrics/report.json``: what the page holds (sections run / not run, figures, bytes, wall time).

A missing input (a stage not run, a metric absent) shows as "not run"; a corrupt metrics or curve file is a
one-line error naming it, and leaves the previous report in place.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from stages.core import paths
from stages.core.io import atomic_path, write_metrics
from stages.report import page
from stages.report.inputs import STAGES, load
from stages.report.uncertainty import comparisons
from stages.schema.report import ReportParams


def console_lines(p: ReportParams, root: Path = Path(".")) -> list[str]:
    """What ``dvc repro`` and ``python -m flows.pipeline`` print at the end: held-out accuracy per model (from the
    current metrics files) and the report's path (when the page exists)."""
    html = root / paths.REPORT_HTML
    where = f"{paths.REPORT_HTML} (open {html.resolve().as_uri()} in a browser)" if html.is_file() else None
    lines = page.headline_lines(load(p, root), where)
    if where is None:
        lines.append(f"report: {paths.REPORT_HTML} not built yet (dvc repro report)")
    return lines


def run(p: ReportParams) -> dict[str, Any]:
    """Build the page and its markdown summary from the current outputs; return (and write) the report metrics."""
    t0 = time.perf_counter()
    inputs = load(p)
    comps = comparisons(inputs.evaluate, p.bootstrap_resamples, p.bootstrap_seed)
    html = page.html_page(p.title, inputs, p.benchmark_results, bootstrap_resamples=p.bootstrap_resamples,
                          bootstrap_seed=p.bootstrap_seed, comps=comps)
    md = page.markdown_summary(p.title, inputs, str(paths.REPORT_HTML), comps)
    with atomic_path(paths.REPORT) as tmp:
        tmp.mkdir(parents=True)
        (tmp / paths.REPORT_HTML.name).write_text(html, encoding="utf-8")
        (tmp / paths.REPORT_SUMMARY.name).write_text(md, encoding="utf-8")
    ran = [s for s in STAGES if inputs.metrics.get(s) is not None]
    ran += [f"evaluate@{m}" for m, v in inputs.evaluate.items() if v is not None]
    not_run = [s for s in STAGES if inputs.metrics.get(s) is None]
    not_run += [f"evaluate@{m}" for m, v in inputs.evaluate.items() if v is None]
    metrics = {
        "path": str(paths.REPORT_HTML),
        "stages_shown": ran,
        "stages_not_run": not_run,
        "missing_inputs": inputs.missing,
        "figures": html.count('<img src="data:image/png;base64,'),
        "comparisons": len(comps),
        "comparisons_beyond_noise": sum(c.beyond_noise for c in comps),
        "html_bytes": len(html.encode("utf-8")),
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    write_metrics("report", metrics, ["*"])  # small: all of it is the headline
    return metrics

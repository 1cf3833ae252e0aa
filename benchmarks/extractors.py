"""HTML extractors on real texts wrapped in web pages: kept-text recall, boilerplate kept, LaTeX survival, speed.

    python benchmarks/extractors.py [--pages 200] [--out benchmarks/results/extractors.json]

Texts: real web documents (../shared/data/web_corpus/math_vs_other.jsonl, math and other) and MATH train
solutions (../shared/data/math/train.jsonl, LaTeX). Each is rendered by :func:`stages.data.html.render` amid
navigation / cookie banner / sidebar / footer boilerplate (HTML5 sections, or class-named divs), with its formulas in each of
:data:`stages.data.html.MATH_STYLES` (raw TeX, MathJax ``<script type="math/tex">``, MathML with a TeX
annotation, MathML with alttext, bare MathML). Each extractor runs with and without the math pass of
:mod:`stages.corpus.extract`. Measures per (layout, extractor, math pass, style):

- text recall: share of the text's words (formulas removed) found in the output (multiset overlap);
- boilerplate kept: share of the boilerplate sentences found in the output;
- LaTeX survival: share of formulas whose TeX (whitespace removed) appears in the output;
- ms per page (one core, this machine; the load average is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.corpus.extract import html_to_text  # noqa: E402
from stages.data.html import BOILERPLATE, FORMULA, LAYOUTS, MATH_STYLES, formulas, render  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))
EXTRACTORS = ["trafilatura", "resiliparse", "none"]
_WORD = re.compile(r"\w+")


def texts(shared: Path, n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` texts: a third web math, a third web other, a third MATH solutions (with their problem)."""
    rng = random.Random(seed)
    web = [json.loads(x) for x in (shared / "web_corpus" / "math_vs_other.jsonl").open(encoding="utf-8")]
    math = [json.loads(x) for x in (shared / "math" / "train.jsonl").open(encoding="utf-8")]
    wm = [r for r in web if r["label"] == "math" and len(r["text"]) > 400]
    wo = [r for r in web if r["label"] == "other" and len(r["text"]) > 400]
    k = n // 3
    out = [{"source": "web_math", "text": r["text"][:6000]} for r in rng.sample(wm, k)]
    out += [{"source": "web_other", "text": r["text"][:6000]} for r in rng.sample(wo, k)]
    out += [{"source": "math_solution", "text": f"{r['problem']}\n\n{r['solution']}"} for r in rng.sample(math, n - 2 * k)]
    return out


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def measure(text: str, out: str) -> dict[str, float | None]:
    """Text recall, boilerplate kept and LaTeX survival of one extraction ``out`` of ``text``'s page."""
    want = Counter(_WORD.findall(FORMULA.sub(" ", text).lower()))
    got = Counter(_WORD.findall(FORMULA.sub(" ", out).lower()))
    recall = sum((want & got).values()) / max(1, sum(want.values()))
    low = " ".join(out.lower().split())
    boiler = sum(b.lower() in low for b in BOILERPLATE) / len(BOILERPLATE)
    f = formulas(text)
    flat = _squash(out)
    latex = sum(_squash(x) in flat for x in f) / len(f) if f else None
    return {"text_recall": recall, "boilerplate_kept": boiler, "latex_survival": latex}


def run(pages: list[dict[str, str]], extractor: str, math_pass: bool, style: str, layout: str, seed: int = 0
        ) -> dict[str, Any]:
    rng = random.Random(seed)
    rows: list[dict[str, float | None]] = []
    t = 0.0
    for p in pages:
        # the page title: the text's first line without its math (a "$" in it would shift the pairing of "$" signs)
        title = FORMULA.sub("", p["text"].split("\n", 1)[0]).replace("$", "")[:80]
        doc = render(p["text"], title=title, rng=rng, math=style, layout=layout)
        t0 = time.perf_counter()
        out = html_to_text(doc, extractor, math=math_pass)
        t += time.perf_counter() - t0
        rows.append(measure(p["text"], out))
    agg: dict[str, Any] = {"extractor": extractor, "math_pass": math_pass, "style": style, "layout": layout,
                           "pages": len(pages)}
    for key in ("text_recall", "boilerplate_kept", "latex_survival"):
        vals = [r[key] for r in rows if r[key] is not None]
        agg[key] = round(sum(vals) / len(vals), 4) if vals else None
    agg["empty_outputs"] = sum(1 for r in rows if r["text_recall"] == 0)
    agg["ms_per_page"] = round(1000 * t / max(1, len(pages)), 2)
    return agg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "extractors.json"))
    args = ap.parse_args()
    pages = texts(SHARED, args.pages)
    load = os.getloadavg()
    results = []
    for layout in LAYOUTS:
        for ex in EXTRACTORS:
            for math_pass in (False, True):
                for style in MATH_STYLES:
                    r = run(pages, ex, math_pass, style, layout)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    out = {"pages": args.pages, "sources": dict(Counter(p["source"] for p in pages)), "load_before": load,
           "load_after": os.getloadavg(), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

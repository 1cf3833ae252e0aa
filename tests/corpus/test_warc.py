"""WARC / WET crawl input: the corpus stage on the generated crawl written as Common Crawl files.

The pages of a small generated crawl become HTML (stages/data/html.py: boilerplate around the text, formulas
as MathJax scripts or MathML) in two WARC files, and a third of them plain text in a WET file; the WARC files
also hold a re-crawl of some pages under spellings of the same URL, a non-HTML response, and non-English pages.
Run with URL dedup and an English-only language filter, the stage removes exactly the planted re-crawls and
foreign pages and collects math pages with the precision and recall (against the generator's labels, by URL)
of the same crawl read from JSONL.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from stages import corpus
from stages.core import paths
from stages.core.io import read_jsonl
from stages.data.html import render, write_warc, write_wet
from tests.corpus.test_stage import _generate, _params

GERMAN = ("Die Gemeinde liegt im Norden des Landkreises und hat etwa dreitausend Einwohner. Der Ort wurde im "
          "zwölften Jahrhundert zum ersten Mal erwähnt, und die Kirche stammt aus dieser Zeit. Heute leben die "
          "meisten Menschen vom Handwerk und vom Tourismus, und im Sommer kommen viele Wanderer in das Tal.")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    _generate(root, n_pages=2000, n_seed_pages=300)
    return root


def _write_crawl(project: Path) -> dict[str, int]:
    rows = read_jsonl(project / paths.CRAWL)
    rng = random.Random(0)
    warc_dir = project / "warc"
    warc_dir.mkdir()
    wet = rows[: len(rows) // 3]
    html_rows = rows[len(rows) // 3:]
    pages: list[dict[str, Any]] = []
    for i, r in enumerate(html_rows):
        style = ("mathjax", "mathml_tex", "tex")[i % 3]
        title = r["text"].split("\n", 1)[0][:80]
        pages.append({"url": r["url"], "html": render(r["text"], title=title, rng=rng, math=style)})
    clean = [p for p, r in zip(pages, html_rows, strict=True) if r["contaminated_by"] is None and r["near_dup_of"] is None]
    recrawled = [dict(p, url=p["url"].replace("https://", "http://") + "?utm_source=feed") for p in clean[:25]]
    junk = [{"url": "https://example.org/logo.png", "html": "PNG", "content_type": "image/png"}]
    german = [{"url": f"https://beispiel{i}.de/ort/seite-{i}", "html": render(GERMAN, title="Ort", rng=rng)} for i in range(5)]
    half = len(pages) // 2
    write_warc(warc_dir / "segment-00000.warc.gz", pages[:half] + junk + german)
    write_warc(warc_dir / "segment-00001.warc.gz", pages[half:] + recrawled)
    write_wet(warc_dir / "segment-00002.warc.wet.gz", wet)
    return {"recrawled": len(recrawled), "german": len(german), "pages": len(rows)}


@pytest.mark.slow  # ~15 s: .ci/slow heavy-suite (the README suite stays under 10 min)
def test_warc_crawl_to_corpus(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    ref = corpus.run(_params(**{"recall.rounds": 2}))
    ref_urls = {r["url"] for r in read_jsonl(project / paths.MATH_CORPUS)}
    planted = _write_crawl(project)
    m = corpus.run(_params(crawl_path=str(project / "warc"), languages=["en"], **{"recall.rounds": 2, "dedup.url": True}))
    assert m["skipped"] == {"warc_not_html": 1, "language": planted["german"]}
    assert m["pages_in"] == planted["pages"] + planted["recrawled"]
    assert m["duplicates_removed"]["url"] == planted["recrawled"]
    assert m["contaminated_removed"] == ref["contaminated_removed"]
    rows = read_jsonl(project / paths.MATH_CORPUS)
    got = {r["url"] for r in rows}
    math = {r["url"] for r in read_jsonl(project / paths.CRAWL) if r["label"] == "math"}  # the generator's labels, by URL

    def prec_rec(urls: set[str]) -> tuple[float, float]:
        return len(urls & math) / max(1, len(urls)), len(urls & math) / len(math)
    (p_warc, r_warc), (p_ref, r_ref) = prec_rec(got), prec_rec(ref_urls)
    assert p_warc >= 0.95 and p_ref >= 0.95 and r_warc >= r_ref - 0.05, (p_warc, r_warc, p_ref, r_ref)
    # formulas written as MathJax / MathML come back as TeX
    assert sum("\\frac" in r["text"] for r in rows) >= 0.5 * sum("\\frac" in r["text"] for r in read_jsonl(project / paths.CRAWL)
                                                                 if r["url"] in got)
    assert not any(b in r["text"] for r in rows for b in ("Accept all cookies", "Advertise with us", "Report a broken link"))
    json.dumps(m)  # metrics stay JSON

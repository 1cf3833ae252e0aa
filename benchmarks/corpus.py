"""Throughput of the corpus stage's per-page work on one core: scoring and decontamination, in pages/s.

    python benchmarks/corpus.py [--pages 3000] [--repeats 3] [--quick]

Pages are 1-5 KB: real web text from ../shared/data/web_corpus when present, else (and in addition)
generated crawl pages (data/generated/crawl.jsonl, or a small crawl generated here), concatenated to a
length drawn uniformly in [1, 5] KB. In the same run, on the same texts, pinned to one CPU:

- scoring: ``MathClassifier.score(texts)`` (normalise + fastText predict on a list) next to bare
  fastText ``predict(texts, k=2)`` (and ``k=1``, what ``score`` calls) on the raw texts (newlines replaced, fastText's only requirement),
  and next to ``score(normalized=True)`` on pre-normalised texts (what every round after the first costs
  in the stage: it normalises once per page);
- decontamination: ``ContaminationIndex.match`` (hashed n-grams, numpy) next to a naive lookup of
  every 10-gram tuple of the page in a Python set of the benchmark's 10-gram tuples, both with the same
  grams; benchmarks: GSM8K + MATH test when present, else the generated test problems.

Writes benchmarks/results/corpus.json and prints a table. The machine is shared: load averages are
recorded next to the numbers; best of ``--repeats`` runs is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fasttext  # noqa: E402
import numpy as np  # noqa: E402

from stages.core.text import grams, ngrams, normalize_for_classifier  # noqa: E402
from stages.corpus.classifier import MathClassifier, train_classifier  # noqa: E402
from stages.corpus.decontaminate import ContaminationIndex, load_benchmarks  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))


def _crawl_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]], Path]:
    """Generated crawl rows, seed rows and the held-out problems file (generated here if the data stage has not run)."""
    gen = ROOT / "data" / "generated"
    if not (gen / "crawl.jsonl").is_file():
        from stages.core.io import write_jsonl
        from stages.data import crawl, problems
        from stages.params import CrawlParams

        gen = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
        splits = problems.generate_splits(0, n_sft=10, n_rl=10, n_test=500, min_steps=1, max_steps=3, max_value=20)
        write_jsonl(gen / "problems" / "test.jsonl", splits["test"])
        crawl.generate(CrawlParams(n_pages=3000, n_seed_pages=800, n_math_domains=9, n_general_domains=36,
                                   math_domain_share=0.35, min_words=100, max_words=400, max_steps=3, max_value=20,
                                   near_dup_frac=0.0, n_contaminated=0, r1_share=0.0, avoid_ngram=20),
                       seed=0, test_problems=splits["test"], crawl_path=gen / "crawl.jsonl", seed_path=gen / "seed.jsonl")
    read = lambda p: [json.loads(x) for x in p.open(encoding="utf-8")]  # noqa: E731
    return read(gen / "crawl.jsonl"), read(gen / "seed.jsonl"), gen / "problems" / "test.jsonl"


def make_pages(n: int, rng: random.Random, crawl: list[dict[str, Any]]) -> tuple[list[str], str]:
    sources = [r["text"] for r in crawl]
    kind = "generated crawl pages"
    web = SHARED / "web_corpus" / "math_vs_other.jsonl"
    if web.is_file():
        sources += [json.loads(x)["text"] for x in web.open(encoding="utf-8")]
        kind = "real web text (../shared/data/web_corpus) + generated crawl pages"
    pages = []
    for _ in range(n):
        target = rng.randint(1000, 5000)
        parts, size = [], 0
        while size < target:
            t = rng.choice(sources)
            parts.append(t)
            size += len(t.encode("utf-8")) + 2
        pages.append("\n\n".join(parts).encode("utf-8")[:target].decode("utf-8", "ignore"))
    return pages, kind


def best_of(repeats: int, fn: Any) -> float:
    out = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="500 pages, 2 repeats")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "corpus.json"))
    args = ap.parse_args()
    if args.quick:
        args.pages, args.repeats = 500, 2
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    rng = random.Random(0)
    crawl, seed, test_file = _crawl_rows()
    pages, kind = make_pages(args.pages, rng, crawl)
    sizes = [len(p.encode("utf-8")) for p in pages]
    load0 = os.getloadavg()

    # scoring ------------------------------------------------------------------------------------
    model_file = ROOT / "data" / "corpus" / "classifier.bin"
    if model_file.is_file():
        clf, model_kind = MathClassifier.load(model_file), "data/corpus/classifier.bin (the stage's last round)"
    else:
        neg = [r["text"] for r in rng.sample(crawl, min(len(crawl), len(seed)))]
        clf = train_classifier([r["text"] for r in seed], neg, dim=32, bucket=100_000, thread=1, seed=0)
        model_kind = "trained here on seed vs crawl (dim 32, bucket 100k)"
    bare = clf.model
    raw_lines = [p.replace("\n", " ") for p in pages]
    norm = [normalize_for_classifier(p) for p in pages]
    t_score = best_of(args.repeats, lambda: clf.score(pages))
    t_score_norm = best_of(args.repeats, lambda: clf.score(norm, normalized=True))
    t_bare = best_of(args.repeats, lambda: bare.predict(raw_lines, k=2))
    t_bare_norm = best_of(args.repeats, lambda: bare.predict(norm, k=2))
    t_bare_norm_k1 = best_of(args.repeats, lambda: bare.predict(norm, k=1))
    assert np.allclose(clf.score(norm, normalized=True), clf.score(pages))

    # decontamination ----------------------------------------------------------------------------
    if (SHARED / "gsm8k" / "test.jsonl").is_file():
        bench = load_benchmarks(gsm8k=SHARED / "gsm8k" / "test.jsonl", math=SHARED / "math" / "test.jsonl")
        bench_kind = "GSM8K test + MATH test (../shared/data)"
    else:
        bench = load_benchmarks(generated_test=test_file)
        bench_kind = "generated test problems"
    n = 10
    t = time.perf_counter()
    index = ContaminationIndex(bench, n)
    index.index.match("warm up")  # builds the sorted tables
    t_build = time.perf_counter() - t
    t = time.perf_counter()
    naive: set[tuple[str, ...]] = set()
    for items in bench.values():
        for item in items:
            for text in (item.question, item.solution or ""):
                naive.update(ngrams(grams(text), n))
    t_build_naive = time.perf_counter() - t
    # plant a benchmark question into every 20th page so both paths also take the hit branch
    flat = [it for items in bench.values() for it in items]
    probe = [p + "\n\n" + rng.choice(flat).question if i % 20 == 0 else p for i, p in enumerate(pages)]

    def ours() -> list[Any]:
        return [index.match(p) for p in probe]

    def naive_lookup() -> list[bool]:
        out = []
        for p in probe:
            g = grams(p)
            out.append(any(w in naive for w in ngrams(g, n)))
        return out

    t_ours = best_of(args.repeats, ours)
    t_naive = best_of(args.repeats, naive_lookup)
    hits_ours = sum(h is not None for h in ours())
    hits_naive = sum(naive_lookup())
    t_grams = best_of(args.repeats, lambda: [grams(p) for p in probe])

    per_s = lambda secs: round(len(pages) / secs, 1)  # noqa: E731
    result = {
        "pages": len(pages), "page_bytes": {"min": min(sizes), "mean": round(float(np.mean(sizes))), "max": max(sizes)},
        "texts": kind, "classifier": model_kind, "repeats": args.repeats, "cores": 1,
        "scoring_pages_per_s": {
            "stage_score_raw_text": per_s(t_score), "stage_score_prenormalised": per_s(t_score_norm),
            "bare_fasttext_predict_raw_text": per_s(t_bare), "bare_fasttext_predict_prenormalised": per_s(t_bare_norm),
            "bare_fasttext_predict_k1_prenormalised": per_s(t_bare_norm_k1),
        },
        "score_over_bare_ratio": {"raw_text": round(t_score / t_bare, 3), "prenormalised": round(t_score_norm / t_bare_norm, 3),
                                  "prenormalised_vs_k1": round(t_score_norm / t_bare_norm_k1, 3)},
        "decontamination": {
            "benchmarks": bench_kind, "ngram": n, "benchmark_ngrams": len(naive),
            "index_build_s": round(t_build, 2), "naive_set_build_s": round(t_build_naive, 2),
            "pages_per_s": per_s(t_ours), "naive_set_pages_per_s": per_s(t_naive), "grams_only_pages_per_s": per_s(t_grams),
            "speedup_over_naive": round(t_naive / t_ours, 2), "pages_flagged": hits_ours, "pages_flagged_naive": hits_naive,
        },
        "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "numpy": np.__version__,
                    "fasttext": getattr(fasttext, "__version__", "fasttext-community"), "note": "shared machine; timings are noisy"},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    s = result["scoring_pages_per_s"]
    d = result["decontamination"]
    print(f"{len(pages)} pages of {result['page_bytes']['mean']} B on average; one core; load {result['loadavg_before']}")
    print(f"{'what':52} {'pages/s':>10}")
    for k, v in s.items():
        print(f"{'scoring: ' + k:52} {v:>10}")
    print(f"{'decontamination: ContaminationIndex.match':52} {d['pages_per_s']:>10}")
    print(f"{'decontamination: naive 10-gram set lookup':52} {d['naive_set_pages_per_s']:>10}")
    print(f"{'(grams only)':52} {d['grams_only_pages_per_s']:>10}")
    print(f"score/bare time ratio {result['score_over_bare_ratio']}; decontamination speed-up {d['speedup_over_naive']}x; "
          f"flagged {d['pages_flagged']} (naive {d['pages_flagged_naive']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

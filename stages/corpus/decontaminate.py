"""Benchmark decontamination (DeepSeekMath section 2.1, following DeepSeek-Coder), with a containment
threshold that spares real math.

Paper's rule (``min_overlap: 0``): a page is removed when it contains an ``n``-gram (paper: 10) that occurs
in a benchmark question or solution; for benchmark questions shorter than ``n`` but at least ``min_short`` (3)
grams, a page is removed when it contains the whole question.

Departure (``min_overlap`` > 0; real-mode value 0.7): a page is removed when it contains at least
``min_overlap`` of the distinct ``n``-grams of one benchmark question, or of one benchmark solution (each text
counts on its own); short questions are still matched whole. Why: on real math text a single shared 10-gram is
mostly not a copied problem but a run of LaTeX markup and digits (``begin pmatrix 0 0 0 end pmatrix``,
``1 1 1 1 1 1 1 1 1 1``, ``left frac 1 2 frac 1 2 frac 1 2``) or stock phrasing ("express your answer in
simplest radical form", asy drawing code, the unit-circle figure of MATH's trigonometry solutions), so the paper's rule
removes clean real math pages and much of MATH train, where 0.7 containment removes none of those pages and little of
MATH train (mostly near-duplicates of a test problem), yet nearly every benchmark problem planted into real pages
(benchmarks/decontam.py; the figures in docs/results/corpus.md and benchmarks/results/decontam.json). A copy of a benchmark
text holds all its n-grams, so containment loses nothing on copies; it misses a page quoting less than ``min_overlap``
of a problem. The threshold follows PaLM's contamination criterion (at least 70% of a test example's 8-grams; Chowdhery
et al. 2022).

A gram is a ``\\w+`` token after NFKC normalisation and lower-casing, one gram per CJK character
(:func:`stages.core.text.grams`); GSM8K ``<<48/2=24>>`` calculator annotations are stripped first. Whole pages
are removed (the paper's wording allows segment-level removal too; page level is the conservative reading).

Library use (no DVC needed)::

    from stages.corpus.decontaminate import decontaminate, load_benchmarks
    bench = load_benchmarks(gsm8k="gsm8k/test.jsonl", math="math/test.jsonl")
    result = decontaminate(pages, bench, n=10, min_overlap=0.7)   # pages: strings or dicts with "text"
    result.kept, result.removed                  # removed: (page, benchmark, item id)
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stages.core import problems
from stages.core.problems import Problem, strip_calculator
from stages.core.text import NgramIndex


@dataclass(frozen=True)
class BenchmarkItem:
    """One benchmark problem: its question and (optionally) its reference solution."""

    id: str
    question: str
    solution: str | None = None


def _items(loaded: Iterable[Problem], strip: bool = False) -> list[BenchmarkItem]:
    """Benchmark items of loaded problems (``strip``: without GSM8K calculator annotations)."""
    clean: Callable[[str], str] = strip_calculator if strip else (lambda t: t)
    return [BenchmarkItem(p.id, clean(p.question), None if p.solution is None else clean(p.solution))
            for p in loaded]


def load_benchmarks(*, generated_test: str | os.PathLike[str] | None = None, gsm8k: str | os.PathLike[str] | None = None,
                    math: str | os.PathLike[str] | None = None, testsets: str | os.PathLike[str] | None = None
                    ) -> dict[str, list[BenchmarkItem]]:
    """The benchmarks whose paths are given, by name (``generated``, ``gsm8k``, ``math``; ``testsets``: the
    testsets stage's directory, or one of its files, each file a benchmark named by its stem).

    Files are read by :mod:`stages.core.problems` (one-line errors for a missing file or a malformed row). Items
    are questions and reference solutions (generated CoT, GSM8K solution, MATH solution); GSM8K calculator
    annotations are stripped from both; MATH rows without an answer are kept (their text still counts).
    """
    out: dict[str, list[BenchmarkItem]] = {}
    if testsets is not None:
        for f in problems.jsonl_files(testsets, "test set"):
            out[f.stem] = _items(problems.load_problem_file(f), strip=True)
    if generated_test is not None:
        out["generated"] = _items(problems.load_generated(generated_test))
    if gsm8k is not None:
        out["gsm8k"] = _items(problems.load_gsm8k(gsm8k), strip=True)
    if math is not None:
        out["math"] = _items(problems.load_math(math, keep_unanswered=True))
    return out


class ContaminationIndex:
    """All benchmarks in one :class:`~stages.core.text.NgramIndex`; ``match`` names the benchmark and item."""

    def __init__(self, benchmarks: Mapping[str, Iterable[BenchmarkItem]], n: int = 10, *, min_short: int = 3,
                 min_overlap: float = 0.0) -> None:
        self.n = n
        self.min_overlap = min_overlap
        self.index = NgramIndex(n, min_short=min_short, min_overlap=min_overlap)
        self.sizes: dict[str, int] = {}
        for name, items in benchmarks.items():
            k = 0
            for item in items:
                self.index.add(item.question, (name, item.id))
                if item.solution:
                    self.index.add(item.solution, (name, item.id), whole_if_short=False)
                k += 1
            self.sizes[name] = k

    def match(self, text: str, toks: list[str] | None = None) -> tuple[str, str] | None:
        """``(benchmark, item id)`` of a benchmark problem ``text`` copies, or None (``toks``: its grams, if known)."""
        hit = self.index.match(text, toks)
        return hit if hit is None else (hit[0], hit[1])  # type: ignore[index]

    def overlap(self, text: str, toks: list[str] | None = None) -> tuple[str, str, float | None] | None:
        """:meth:`match` with the share of the matched question's or solution's n-grams that ``text`` holds
        (None under the paper's rule, ``min_overlap`` 0)."""
        hit = self.index.best(text, toks)
        if hit is None:
            return None
        (bench, item), share = hit  # type: ignore[misc]
        return bench, item, share


@dataclass
class DecontamResult:
    """Pages kept, and pages removed with the benchmark and item each one copies."""

    kept: list[Any] = field(default_factory=list)
    removed: list[tuple[Any, str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Pages removed per benchmark."""
        return dict(Counter(b for _, b, _ in self.removed))


def decontaminate(pages: Iterable[Any], benchmarks: Mapping[str, Iterable[BenchmarkItem]] | ContaminationIndex,
                  n: int = 10, *, text: Callable[[Any], str] | str = "text", min_short: int = 3,
                  min_overlap: float = 0.0) -> DecontamResult:
    """Split ``pages`` into kept and removed by the rule of the module docstring.

    ``pages`` are strings or mappings; ``text`` names the field holding the text (or is a function
    returning it). ``benchmarks`` maps a name to its items, or is a prebuilt :class:`ContaminationIndex`
    (then ``n``, ``min_short`` and ``min_overlap`` are the index's own).
    """
    index = benchmarks if isinstance(benchmarks, ContaminationIndex) else ContaminationIndex(
        benchmarks, n, min_short=min_short, min_overlap=min_overlap)
    get = text if callable(text) else (lambda page: page if isinstance(page, str) else page[text])
    out = DecontamResult()
    for page in pages:
        hit = index.match(get(page))
        if hit is None:
            out.kept.append(page)
        else:
            out.removed.append((page, hit[0], hit[1]))
    return out


class Report:
    """Pages removed per benchmark, with the first few as samples (the report artifact)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.removed: Counter[str] = Counter()
        self.items: dict[str, set[str]] = defaultdict(set)
        self.examples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, page: Mapping[str, Any], benchmark: str, item: str) -> None:
        self.removed[benchmark] += 1
        self.items[benchmark].add(item)
        if len(self.examples[benchmark]) < self.samples:
            self.examples[benchmark].append({"page": page.get("id"), "url": page.get("url"), "item": item,
                                             "text": str(page.get("text", ""))[:300]})

    def merge(self, other: Report) -> None:
        self.removed.update(other.removed)
        for b, s in other.items.items():
            self.items[b] |= s
        for b, ex in other.examples.items():
            self.examples[b].extend(ex[: max(0, self.samples - len(self.examples[b]))])

    def to_dict(self, sizes: Mapping[str, int]) -> dict[str, Any]:
        return {b: {"benchmark_items": sizes[b], "pages_removed": self.removed.get(b, 0),
                    "items_matched": len(self.items.get(b, ())), "samples": self.examples.get(b, [])}
                for b in sizes}

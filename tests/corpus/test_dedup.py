"""Exact and MinHash near-duplicate removal."""

from __future__ import annotations

import random

import numpy as np

from stages.corpus.dedup import Deduplicator, dedup, exact_key, signature

WORDS = [f"word{i}" for i in range(500)]


def _page(rng: random.Random, n: int = 150) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def test_exact_and_near_duplicates_found_distinct_pages_kept() -> None:
    rng = random.Random(0)
    base = [_page(rng) for _ in range(30)]
    exact = base[3].upper().replace(" ", "  ") + "\n"
    words = base[7].split()
    near = " ".join(words[:140] + ["changed"] * 3 + words[143:]) + " share this page"
    res = dedup(base + [exact, near], threshold=0.7, num_perm=64, shingle=5)
    assert len(res.kept) == 30
    assert [(kind, i) for _, kind, i in res.removed] == [("exact", 3), ("near", 7)]


def test_signature_estimates_jaccard() -> None:
    rng = random.Random(1)
    a = _page(rng, 400)
    b = " ".join(a.split()[:300] + _page(rng, 100).split())
    est = float(np.mean(signature(a, 256, 3) == signature(b, 256, 3)))
    sa = {tuple(a.split()[i:i + 3]) for i in range(398)}
    sb = {tuple(b.split()[i:i + 3]) for i in range(398)}
    assert abs(est - len(sa & sb) / len(sa | sb)) < 0.1
    assert signature(a, 64, 5).dtype == np.uint32


def test_global_pass_finds_pairs_across_shards() -> None:
    # keys are (shard, row): the second shard's copy of a first-shard page is reported against it
    rng = random.Random(2)
    shard0 = [_page(rng) for _ in range(5)]
    shard1 = [_page(rng), shard0[2] + " extra words at the end"]
    d = Deduplicator(exact=True, near=True, threshold=0.7, num_perm=64)
    hits = [d.check((s, r), exact_key(t), signature(t, 64, 5)) for s, pages in enumerate([shard0, shard1])
            for r, t in enumerate(pages)]
    assert hits[:6] == [None] * 6 and hits[6] == ("near", (0, 2))

"""Exact and MinHash near-duplicate removal: buckets, partitions, verified edges, clusters."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from stages.corpus.dedup import (
    EDGE,
    EXACT,
    KINDS,
    NEAR,
    URL,
    bucket_entries,
    dedup,
    exact_key,
    gid,
    group_edges,
    lsh_params,
    partition_bounds,
    partition_edges,
    resolve_clusters,
    signature,
    split_gid,
    verify_near,
)

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


def _entries(shard_pages: list[list[str]], bands: int, rows: int) -> list[np.ndarray]:
    return [bucket_entries(s, url=None, exact=[exact_key(t) for t in pages], sigs=np.stack([signature(t, 64, 5) for t in pages]),
                           bands=bands, rows=rows) for s, pages in enumerate(shard_pages)]


def test_partitions_find_pairs_across_shards_whatever_their_number(tmp_path: Path) -> None:
    # the second shard's copy of a first-shard page is removed in favour of it, and an exact copy too
    rng = random.Random(2)
    shard0 = [_page(rng) for _ in range(5)]
    shard1 = [_page(rng), shard0[2] + " extra words at the end", shard0[4].upper()]
    bands, rows = lsh_params(0.7, 64)
    files = []
    for s, e in enumerate(_entries([shard0, shard1], bands, rows)):
        files.append(str(tmp_path / f"e{s}.npy"))
        np.save(files[-1], e)
    sigs = {s: np.stack([signature(t, 64, 5) for t in pages]) for s, pages in enumerate([shard0, shard1])}

    def sig_of(g: np.ndarray) -> np.ndarray:
        sh, r = split_gid(g)
        return np.stack([sigs[int(a)][int(b)] for a, b in zip(sh, r, strict=True)])
    results = []
    for n in (1, 3, 16):
        edges = np.concatenate([partition_edges(files, lo, hi, sig_of, 0.7) for lo, hi in partition_bounds(n)])
        cl = resolve_clusters(edges)
        results.append((cl.removed.tolist(), cl.kind.tolist(), cl.kept.tolist()))
    assert results[0] == results[1] == results[2]
    assert results[0] == ([int(gid(1, 1)), int(gid(1, 2))], [NEAR, EXACT], [int(gid(0, 2)), int(gid(0, 4))])


def test_a_shared_band_alone_is_not_a_duplicate() -> None:
    """LSH candidates are verified: two signatures equal on one band but nowhere else give no edge."""
    bands, rows = lsh_params(0.7, 64)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, size=64, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, size=64, dtype=np.uint64).astype(np.uint32)
    b[:rows] = a[:rows]
    sigs = np.stack([a, b])
    entries = bucket_entries(0, url=None, exact=None, sigs=sigs, bands=bands, rows=rows)
    entries.sort(order=["h", "k", "gid"])
    cand = group_edges(entries)
    assert len(cand) == 1 and cand["kind"][0] == NEAR  # a candidate ...
    assert len(verify_near(cand, lambda g: sigs[split_gid(g)[1]], 0.7)) == 0  # ... rejected


def test_clusters_keep_the_first_page_whatever_the_edge_order() -> None:
    # a chain 5 - 9 - 2 (near) and 7 = 11 (exact) = 3 (url): one page kept per cluster, the smallest id
    edges = np.array([(5, 9, NEAR), (2, 9, NEAR), (7, 11, EXACT), (3, 11, URL)], dtype=EDGE)
    ref = resolve_clusters(edges)
    for perm in ([3, 2, 1, 0], [1, 3, 0, 2]):
        cl = resolve_clusters(edges[perm])
        assert cl.removed.tolist() == ref.removed.tolist() and cl.kept.tolist() == ref.kept.tolist()
    assert dict(zip(ref.removed.tolist(), zip(ref.kept.tolist(), [KINDS[k] for k in ref.kind], strict=True), strict=True)) == {
        5: (2, "near"), 9: (2, "near"), 7: (3, "exact"), 11: (3, "url")}

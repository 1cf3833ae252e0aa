"""URL, exact and near-duplicate removal as distributed MinHash-LSH (signatures -> buckets -> clusters).

Keys (computed shard by shard, in the tasks that read the pages):

- URL: 128-bit BLAKE2b hash of the normalised URL (:func:`stages.core.text.normalize_url`);
- exact: 128-bit BLAKE2b hash of the normalised text (:func:`stages.core.text.normalize_for_hash`: NFKC,
  lower case, grams joined by single spaces);
- near: a MinHash signature (datasketch ``MinHash``, scheme ``affine32``, ``num_perm`` permutations) over
  word ``shingle``-grams, cut into ``bands`` bands of ``rows`` values (datasketch's choice for the
  Jaccard ``threshold`` with equal false-positive / false-negative weights); each band is hashed to 64 bits.

The algorithm (the structure of datatrove's and text-dedup's MinHash deduplication):

1. **Buckets, spilled to disk.** Each shard writes one file of bucket entries ``(h, k, gid)`` sorted by
   ``h`` (``h``: a uniform 64-bit hash of the key, ``k``: the key's kind / band and its other bits, ``gid``:
   ``shard << 32 | row``). No process ever holds all of them.
2. **Partitions.** The ``h`` range is cut into ``ceil(entries / partition_size)`` equal ranges; one task per
   range reads its slice of every shard's file (memory-mapped, binary search), sorts it and turns each group
   of equal keys into edges: from the group's first page to every other one, and between neighbours (so one
   unrelated page in a bucket does not hide a true pair). URL and exact edges are final; a near edge counts
   only when the two signatures' estimated Jaccard similarity reaches the threshold (the signature rows
   are read from the shards' memory-mapped signature files). Memory per task: about ``partition_size``
   entries (24 bytes each) plus that partition's candidate pairs.
3. **Clusters.** One task reads the edges (one per duplicate, not per page), finds the connected
   components and keeps the page with the smallest ``gid`` of each (the first in shard / row order); every
   other page of a component is removed, as ``url``, ``exact`` or ``near`` (the first kind among its edges),
   with the kept page as its representative. Deterministic: the same pages go whatever the partition count,
   shard count or runner.

Library use (in memory, the same algorithm)::

    from stages.corpus.dedup import dedup
    result = dedup(pages, threshold=0.7, num_perm=64, shingle=5)
    result.kept, result.removed   # removed: (page, "exact" | "near", index of the page kept instead)
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from datasketch import MinHash
from datasketch.lsh import _optimal_param

from stages.core.text import grams, normalize_for_hash

_TOKEN_HASH: dict[str, int] = {}
_B = np.uint64(0x9E3779B97F4A7C15)

KINDS = ("url", "exact", "near")
"""Duplicate kinds by code (0, 1, 2); a page with edges of several kinds is reported under the first."""
URL, EXACT, NEAR = 0, 1, 2

ENTRY = np.dtype([("h", "<u8"), ("k", "<u8"), ("gid", "<i8")])
"""A bucket entry: uniform hash ``h`` (partitioning and sort key), ``k`` = tag << 56 | other key bits, page ``gid``."""
EDGE = np.dtype([("a", "<i8"), ("b", "<i8"), ("kind", "u1")])
"""A duplicate edge between pages ``a < b`` (gids)."""
_LOW56 = np.uint64((1 << 56) - 1)


def gid(shard: int, rows: np.ndarray | int) -> np.ndarray:
    """Global page ids ``shard << 32 | row``: sorting them is shard-then-row order."""
    return (np.int64(shard) << np.int64(32)) | np.asarray(rows, dtype=np.int64)


def split_gid(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, row)`` arrays of global ids."""
    g = np.asarray(g, dtype=np.int64)
    return g >> np.int64(32), g & np.int64(0xFFFFFFFF)


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """``(bands, rows)`` for a Jaccard ``threshold``: datasketch's optimum with equal FP / FN weights."""
    return _optimal_param(threshold, num_perm, 0.5, 0.5)


def exact_key(text: str, toks: list[str] | None = None) -> bytes:
    """128-bit hash of the normalised text (``toks``: its grams, when already computed)."""
    norm = normalize_for_hash(text) if toks is None else " ".join(toks)
    return hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest()


def url_key(url: str) -> bytes:
    """128-bit hash of an (already normalised) URL."""
    return hashlib.blake2b(url.encode("utf-8"), digest_size=16).digest()


def _token_hashes(toks: list[str]) -> np.ndarray:
    """CRC32 (+1) of each token, memoised per process."""
    get = _TOKEN_HASH.get
    vals = [get(t) for t in toks]
    if None in vals:
        if len(_TOKEN_HASH) > 2_000_000:
            _TOKEN_HASH.clear()
        for i, v in enumerate(vals):
            if v is None:
                vals[i] = _TOKEN_HASH[toks[i]] = zlib.crc32(toks[i].encode("utf-8")) + 1
    return np.array(vals, dtype=np.uint64)


def shingle_hashes(text: str, k: int, toks: list[str] | None = None) -> np.ndarray:
    """Distinct 32-bit hashes of the word ``k``-grams of ``text`` (the whole text when shorter)."""
    toks = grams(text) if toks is None else toks
    if not toks:
        return np.zeros(1, dtype=np.uint64)
    t = _token_hashes(toks)
    k = min(k, len(t))
    m = len(t) - k + 1
    h = np.zeros(m, dtype=np.uint64)
    for j in range(k):
        h = h * _B + t[j:j + m]
    return np.unique(h >> np.uint64(32))


def _identity(x: Any) -> Any:
    return x


_LOCAL = threading.local()


def signature(text: str, num_perm: int, shingle: int, toks: list[str] | None = None) -> np.ndarray:
    """MinHash signature (``num_perm`` uint32 values) of the ``shingle``-word shingles of ``text``."""
    cache = getattr(_LOCAL, "minhash", None)
    if cache is None:
        cache = _LOCAL.minhash = {}
    m = cache.get(num_perm)
    if m is None:
        m = cache[num_perm] = MinHash(num_perm=num_perm, seed=1, hashfunc=_identity, scheme="affine32")
    m.clear()
    m.update_batch(shingle_hashes(text, shingle, toks).tolist())
    return m.hashvalues.copy()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (uint64 -> uniform uint64), vectorised."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def band_hashes(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """64-bit hash of each band of each signature: ``(pages, bands)`` uint64."""
    s = np.asarray(sigs, dtype=np.uint64)
    out = np.empty((len(s), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for b in range(bands):
            h = np.full(len(s), np.uint64(b + 1) * _B, dtype=np.uint64)
            for j in range(b * rows, (b + 1) * rows):
                h = _mix(h ^ s[:, j])
            out[:, b] = h
    return out


def _hash128(keys: Sequence[bytes], tag: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2) if keys else np.zeros((0, 2), dtype="<u8")
    return raw[:, 0].copy(), (raw[:, 1] & _LOW56) | np.uint64(tag << 56)


def bucket_entries(shard: int, *, url: Sequence[bytes] | None, exact: Sequence[bytes] | None,
                   sigs: np.ndarray | None, bands: int, rows: int) -> np.ndarray:
    """One shard's bucket entries (``ENTRY``), sorted by ``(h, k, gid)``; rows are positions in the sequences."""
    parts = []
    if url is not None:
        h, k = _hash128(url, 0)
        parts.append((h, k, gid(shard, np.arange(len(h)))))
    if exact is not None:
        h, k = _hash128(exact, 1)
        parts.append((h, k, gid(shard, np.arange(len(h)))))
    if sigs is not None and len(sigs):
        bh = band_hashes(sigs, bands, rows)
        n = len(bh)
        for b in range(bands):
            parts.append((bh[:, b], np.full(n, np.uint64((2 + b) << 56)), gid(shard, np.arange(n))))
    out = np.zeros(sum(len(p[0]) for p in parts), dtype=ENTRY)
    i = 0
    for h, k, g in parts:
        out["h"][i:i + len(h)], out["k"][i:i + len(h)], out["gid"][i:i + len(h)] = h, k, g
        i += len(h)
    out.sort(order=["h", "k", "gid"])
    return out


def partition_bounds(n_partitions: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of ``h`` (as Python ints, hi of the last = 2**64) splitting it evenly."""
    edges = [(1 << 64) * i // n_partitions for i in range(n_partitions + 1)]
    return list(zip(edges, edges[1:], strict=False))


def _slice(entries: np.ndarray, lo: int, hi: int) -> np.ndarray:
    h = entries["h"]
    a = int(np.searchsorted(h, np.uint64(lo), side="left"))
    b = len(h) if hi >= 1 << 64 else int(np.searchsorted(h, np.uint64(hi), side="left"))
    return np.array(entries[a:b])


def group_edges(entries: np.ndarray) -> np.ndarray:
    """Edges of groups of equal keys in ``entries`` (sorted by ``(h, k, gid)``): first-to-each and neighbours."""
    if len(entries) < 2:
        return np.zeros(0, dtype=EDGE)
    h, k, g = entries["h"], entries["k"], entries["gid"]
    same = (h[1:] == h[:-1]) & (k[1:] == k[:-1])  # entry i+1 is in entry i's group
    if not same.any():
        return np.zeros(0, dtype=EDGE)
    start = np.concatenate([[True], ~same])
    first = np.maximum.accumulate(np.where(start, np.arange(len(g)), 0))  # index of each entry's group start
    cur = np.nonzero(same)[0] + 1
    tag = (k[cur] >> np.uint64(56)).astype(np.int64)
    kind = np.minimum(tag, NEAR).astype(np.uint8)
    a = np.concatenate([g[first[cur]], g[cur - 1]])
    b = np.concatenate([g[cur], g[cur]])
    kk = np.concatenate([kind, kind])
    keep = a != b
    out = np.zeros(int(keep.sum()), dtype=EDGE)
    out["a"], out["b"], out["kind"] = np.minimum(a, b)[keep], np.maximum(a, b)[keep], kk[keep]
    return np.unique(out)


def verify_near(edges: np.ndarray, signature_of: Callable[[np.ndarray], np.ndarray], threshold: float) -> np.ndarray:
    """Keep URL / exact edges, and near edges whose signatures agree on at least ``threshold`` of positions."""
    near = edges["kind"] == NEAR
    if not near.any():
        return edges
    cand = edges[near]
    sa, sb = signature_of(cand["a"]), signature_of(cand["b"])
    ok = np.mean(sa == sb, axis=1) >= threshold
    return np.concatenate([edges[~near], cand[ok]])


def partition_edges(entry_files: Sequence[str], lo: int, hi: int,
                    signature_of: Callable[[np.ndarray], np.ndarray] | None, threshold: float) -> np.ndarray:
    """Verified edges of the ``[lo, hi)`` partition of the shards' bucket files (memory-mapped)."""
    parts = [_slice(np.load(f, mmap_mode="r"), lo, hi) for f in entry_files]
    entries = np.concatenate(parts) if parts else np.zeros(0, dtype=ENTRY)
    entries.sort(order=["h", "k", "gid"])
    edges = group_edges(entries)
    if signature_of is not None:
        edges = verify_near(edges, signature_of, threshold)
    return edges


@dataclass
class Clusters:
    """Removed pages: their gid, duplicate kind code and the gid of the page kept for their cluster."""

    removed: np.ndarray
    kind: np.ndarray
    kept: np.ndarray


def resolve_clusters(edges: np.ndarray) -> Clusters:
    """Connected components of the edge graph; all pages but the smallest gid of each are removed."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if len(edges) == 0:
        z = np.zeros(0, dtype=np.int64)
        return Clusters(z, z.astype(np.uint8), z)
    nodes, inv = np.unique(np.concatenate([edges["a"], edges["b"]]), return_inverse=True)
    ia, ib = inv[:len(edges)], inv[len(edges):]
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (ia, ib)), shape=(len(nodes), len(nodes)))
    _, label = connected_components(graph, directed=False)
    root = np.full(label.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(root, label, nodes)  # nodes are sorted: the first of each component
    kind = np.full(len(nodes), 255, dtype=np.uint8)
    np.minimum.at(kind, ib, edges["kind"])  # kind of the edges where the page is the later one
    np.minimum.at(kind, ia, np.where(kind[ia] == 255, edges["kind"], 255).astype(np.uint8))
    gone = nodes != root[label]
    return Clusters(nodes[gone], kind[gone], root[label][gone])


@dataclass
class DedupResult:
    """Pages kept, and pages removed with the kind of duplicate and the index of the page kept instead."""

    kept: list[Any] = field(default_factory=list)
    removed: list[tuple[Any, str, int]] = field(default_factory=list)


def dedup(pages: Iterable[Any], *, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5, exact: bool = True,
          near: bool = True, text: Callable[[Any], str] | str = "text", partition_size: int = 1_000_000) -> DedupResult:
    """Remove exact and near duplicates from ``pages`` (strings or mappings), keeping the first of each cluster.

    The same buckets -> partitions -> clusters algorithm as the stage, in one process with a temporary
    directory for the bucket file.
    """
    get = text if callable(text) else (lambda page: page if isinstance(page, str) else page[text])
    pages = list(pages)
    texts = [get(p) for p in pages]
    bands, rows = lsh_params(threshold, num_perm)
    sigs = np.stack([signature(t, num_perm, shingle) for t in texts]) if near and texts else None
    entries = bucket_entries(0, url=None, exact=[exact_key(t) for t in texts] if exact else None, sigs=sigs,
                             bands=bands, rows=rows)
    with tempfile.TemporaryDirectory(prefix="dedup-") as d:
        f = str(Path(d) / "entries.npy")
        np.save(f, entries)
        n_parts = max(1, -(-len(entries) // partition_size))
        sig_of = (lambda g: sigs[split_gid(g)[1]]) if sigs is not None else None
        edges = [partition_edges([f], lo, hi, sig_of, threshold) for lo, hi in partition_bounds(n_parts)]
    cl = resolve_clusters(np.concatenate(edges) if edges else np.zeros(0, dtype=EDGE))
    gone = dict(zip(split_gid(cl.removed)[1].tolist(), zip(cl.kind.tolist(), split_gid(cl.kept)[1].tolist(),
                                                           strict=True), strict=True))
    out = DedupResult()
    for i, page in enumerate(pages):
        if i in gone:
            out.removed.append((page, KINDS[gone[i][0]], gone[i][1]))
        else:
            out.kept.append(page)
    return out

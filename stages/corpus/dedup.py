"""Exact and near-duplicate removal.

- Exact: pages whose normalised text (:func:`stages.core.text.normalize_for_hash`: NFKC, lower
  case, grams joined by single spaces) has the same 128-bit BLAKE2b hash.
- Near: MinHash signatures (datasketch ``MinHash``, scheme ``affine32``, ``num_perm`` permutations) over word
  ``shingle``-grams, indexed in a datasketch ``MinHashLSH`` at the Jaccard ``threshold``; an LSH
  candidate counts only when the signatures' estimated Jaccard similarity reaches the threshold.

Signatures are computed shard by shard (the expensive part, parallel); the global pass then visits
pages in a fixed order (shard, then row), keeps the first page of each group and removes the later
ones, so a pair split across shards is found like any other. The global pass holds the hashes,
the LSH band keys and the signatures of kept pages (``4 * num_perm`` bytes per page), not texts.

Library use::

    from stages.corpus.dedup import dedup
    result = dedup(pages, threshold=0.7, num_perm=64, shingle=5)
    result.kept, result.removed   # removed: (page, "exact" | "near", index of the page it duplicates)
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH

from stages.core.text import grams, normalize_for_hash

_TOKEN_HASH: dict[str, int] = {}
_B = np.uint64(0x9E3779B97F4A7C15)


def exact_key(text: str, toks: list[str] | None = None) -> bytes:
    """128-bit hash of the normalised text (``toks``: its grams, when already computed)."""
    norm = normalize_for_hash(text) if toks is None else " ".join(toks)
    return hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest()


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


class Deduplicator:
    """The global pass: feed pages in a fixed order; each is kept (and indexed) or reported as a duplicate."""

    def __init__(self, *, exact: bool, near: bool, threshold: float, num_perm: int) -> None:
        self.exact, self.near, self.threshold, self.num_perm = exact, near, threshold, num_perm
        self._hashes: dict[bytes, Any] = {}
        self._sigs: dict[Any, np.ndarray] = {}
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm) if near else None

    def check(self, key: Any, exact_hash: bytes | None, sig: np.ndarray | None) -> tuple[str, Any] | None:
        """``("exact" | "near", key of the kept page it duplicates)``, or None when ``key`` is new (then indexed)."""
        if self.exact and exact_hash is not None:
            first = self._hashes.get(exact_hash)
            if first is not None:
                return "exact", first
        if self._lsh is not None and sig is not None:
            lean = LeanMinHash(seed=1, hashvalues=sig, scheme="affine32")
            best: tuple[float, Any] | None = None
            for cand in self._lsh.query(lean):
                sim = float(np.mean(self._sigs[cand] == sig))
                if sim >= self.threshold and (best is None or sim > best[0]):
                    best = (sim, cand)
            if best is not None:
                return "near", best[1]
            self._lsh.insert(key, lean)
            self._sigs[key] = sig
        if self.exact and exact_hash is not None:
            self._hashes[exact_hash] = key
        return None


@dataclass
class DedupResult:
    """Pages kept, and pages removed with the kind of duplicate and the index of the page kept instead."""

    kept: list[Any] = field(default_factory=list)
    removed: list[tuple[Any, str, int]] = field(default_factory=list)


def dedup(pages: Iterable[Any], *, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5, exact: bool = True,
          near: bool = True, text: Callable[[Any], str] | str = "text") -> DedupResult:
    """Remove exact and near duplicates from ``pages`` (strings or mappings), keeping the first of each group."""
    get = text if callable(text) else (lambda page: page if isinstance(page, str) else page[text])
    d = Deduplicator(exact=exact, near=near, threshold=threshold, num_perm=num_perm)
    out = DedupResult()
    for i, page in enumerate(pages):
        t = get(page)
        hit = d.check(i, exact_key(t) if exact else None, signature(t, num_perm, shingle) if near else None)
        if hit is None:
            out.kept.append(page)
        else:
            out.removed.append((page, hit[0], hit[1]))
    return out

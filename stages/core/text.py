"""Text normalisation and word n-grams, shared by the crawl generator and the corpus stage.

One definition of a "gram" for the whole project (decontamination, the crawl's contamination
guard): a ``\\w+`` run after NFKC normalisation and lower-casing, except that every CJK character
is a gram of its own.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

import numpy as np

# CJK ideographs, kana, hangul: one gram per character.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_GRAM = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


def nfkc_lower(text: str) -> str:
    """NFKC-normalise and lower-case ``text``."""
    return unicodedata.normalize("NFKC", text).lower()


def grams(text: str) -> list[str]:
    """The grams of ``text``: ``\\w+`` tokens of the NFKC-normalised, lower-cased text, one per CJK character."""
    return _GRAM.findall(nfkc_lower(text))


def ngrams(tokens: list[str], n: int) -> Iterator[tuple[str, ...]]:
    """Every contiguous ``n``-gram of ``tokens`` (none when there are fewer than ``n``)."""
    for i in range(len(tokens) - n + 1):
        yield tuple(tokens[i:i + n])


_CLF_TOKEN = re.compile(r"[^\W_]+|[$\\^_{}=+\-*/<>()%]")


def normalize_for_classifier(text: str) -> str:
    """The text fastText sees: NFKC, lower case, one line of tokens separated by single spaces.

    Tokens are alphanumeric runs and the symbols that carry meaning for math
    (``$ \\ ^ _ { } = + - * / < > ( ) %``), each symbol a token of its own; other punctuation is
    dropped; digits are kept (numbers matter for math vs. other).
    """
    return " ".join(_CLF_TOKEN.findall(nfkc_lower(text)))


def grams_and_classifier_text(text: str) -> tuple[list[str], str]:
    """``(grams(text), normalize_for_classifier(text))`` with one NFKC pass."""
    low = nfkc_lower(text)
    return _GRAM.findall(low), " ".join(_CLF_TOKEN.findall(low))


def normalize_for_hash(text: str) -> str:
    """Canonical form for exact deduplication: NFKC, lower case, grams joined by single spaces."""
    return " ".join(grams(text))


def url_domain(url: str) -> str:
    """The base domain of ``url``: host name, lower case, without port, ``www.`` or ``m.``."""
    rest = url.split("://", 1)[-1]
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rsplit("@", 1)[-1].split(":", 1)[0].lower()
    for pre in ("www.", "m."):
        if host.startswith(pre):
            host = host[len(pre):]
    return host


_TRACKING = re.compile(r"^(utm_[a-z]+|fbclid|gclid|dclid|msclkid|yclid|mc_cid|mc_eid|_ga|_gl|igshid|sessionid|phpsessid|sid|jsessionid)$", re.I)


def normalize_url(url: str) -> str:
    """The URL-dedup form of ``url``: the same page crawled under spellings that differ only in form.

    Lower-case host without user info, default port (``:80`` / ``:443``) and trailing dot; the scheme dropped
    (http and https copies are one page); fragment dropped; tracking and session parameters (``utm_*``,
    ``fbclid``, ``gclid``, ``sessionid``, ...) dropped and the other query parameters sorted; duplicate
    slashes collapsed and a trailing slash removed (except the root). Host prefixes such as ``www.`` and
    ``m.`` are kept: they can serve different pages, and copies under them are left to content dedup.
    """
    from urllib.parse import parse_qsl, urlencode, urlsplit

    u = url.strip()
    try:
        parts = urlsplit(u if "://" in u else "http://" + u)
        host = (parts.hostname or "").rstrip(".")
        port = parts.port
    except ValueError:  # a malformed port or bracket: compare the raw string
        return u
    if port is not None and port not in (80, 443):
        host = f"{host}:{port}"
    path = re.sub(r"/{2,}", "/", parts.path or "/")
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    query = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _TRACKING.match(k))
    return host + path + ("?" + urlencode(query) if query else "")


def url_prefix(url: str, depth: int = 1) -> str:
    """The first ``depth`` path segments of ``url`` as ``/a/b/`` (``/`` for pages at the top of the site)."""
    rest = url.split("://", 1)[-1]
    path = re.split(r"[?#]", rest, maxsplit=1)[0]
    path = path.split("/", 1)[1] if "/" in path else ""
    segs = [s for s in path.split("/")[:-1] if s][:depth]  # the last segment is the page itself
    return "/" + "".join(f"{s}/" for s in segs)


# Polynomial n-gram hash modulo 2**64 with a fixed odd base (so hashes agree across processes):
# hash(w) = sum_j w[j] * B**j. Window hashes come from prefix sums: (H[i+L] - H[i]) * B**-i.
_B = 0x9E3779B97F4A7C15
_BINV = pow(_B, -1, 2**64)
_LEN_MIX = np.uint64(0xC2B2AE3D27D4EB4F)  # keeps short windows of different lengths apart
_POW: list[np.ndarray] = [np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64)]  # B**k, B**-k


def _powers(k: int) -> tuple[np.ndarray, np.ndarray]:
    if len(_POW[0]) < k:
        size = max(k, 2 * len(_POW[0]), 4096)
        for i, base in enumerate((_B, _BINV)):
            arr = np.full(size, base, dtype=np.uint64)
            arr[0] = 1
            _POW[i] = np.cumprod(arr, dtype=np.uint64)
    return _POW[0], _POW[1]


class _Table:
    """Sorted window hashes of one length (a hash may repeat, once per source holding it), their sources, and
    prefilters that skip most lookups."""

    def __init__(self, keys: np.ndarray, vals: np.ndarray, first: np.ndarray | None) -> None:
        self.keys, self.vals, self.first = keys, vals, first
        # a bitmap of about 16 bits per key (ANDed before the binary search, which is cache-miss bound)
        self.bits: np.ndarray | None = None
        self.shift = np.uint64(0)
        if len(keys) > 4096:
            b = int(min(27, max(16, np.ceil(np.log2(len(keys) * 16)))))
            self.shift = np.uint64(64 - b)
            idx = (keys >> self.shift).astype(np.intp)
            bits = np.zeros(1 << (b - 3), dtype=np.uint8)
            np.bitwise_or.at(bits, idx >> 3, (1 << (idx & 7)).astype(np.uint8))
            self.bits = bits

    def _prefilter(self, starts: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.bits is None or not len(h):
            return starts, h
        b = (h >> self.shift).astype(np.intp)
        keep = ((self.bits[b >> 3] >> (b & 7).astype(np.uint8)) & 1).astype(bool)
        return starts[keep], h[keep]

    def lookup(self, starts: np.ndarray, h: np.ndarray) -> tuple[int, int] | None:
        """(start, source index) of the first window (in ``starts`` order) whose hash is a key, or None; of the
        sources holding that window, the first one added."""
        starts, h = self._prefilter(starts, h)
        if not len(h):
            return None
        pos = np.searchsorted(self.keys, h)
        pos[pos == len(self.keys)] = 0
        hit = self.keys[pos] == h
        if not hit.any():
            return None
        j = int(np.argmax(hit))
        return int(starts[j]), int(self.vals[pos[j]])

    def counts(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sources, how many of the distinct windows ``h`` each source holds), for the sources holding any."""
        h = np.unique(h)
        _, h = self._prefilter(h, h)
        lo = np.searchsorted(self.keys, h, "left")
        n = np.searchsorted(self.keys, h, "right") - lo
        total = int(n.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        offsets = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(total)
        return np.unique(self.vals[offsets], return_counts=True)


class NgramIndex:
    """An index of source texts answering "which source does this text copy?" (decontamination).

    With ``min_overlap`` 0 (the default; the paper's rule), a query matches a source when they share one
    ``n``-gram. With ``min_overlap`` > 0 (containment), a query matches a source when it contains at least that
    fraction of the source's distinct ``n``-grams (a copied text contains all of them; an unrelated text that
    shares a stock phrase or a run of markup contains a few). Either way a source with between ``min_short`` and
    ``n - 1`` grams matches a query that contains all of them as a contiguous run (the rule for benchmark texts
    shorter than ``n``). Grams are mapped to integer ids (a vocabulary built from the sources; a query gram outside
    it cannot be part of a match) and every window of ids to a 64-bit polynomial hash, so the index is sorted
    numpy arrays and a query is a few vectorised operations: windows with an unknown gram are dropped, short texts
    are only tried where their first gram occurs, and a bitmap filters the rest before the binary search. Two
    different windows collide with probability about 2**-64 per pair.
    """

    def __init__(self, n: int, *, min_short: int = 3, min_overlap: float = 0.0) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0.0 <= min_overlap <= 1.0:
            raise ValueError(f"min_overlap must be in [0, 1], got {min_overlap}")
        self.n = n
        self.min_short = min_short
        self.min_overlap = min_overlap
        self.vocab: dict[str, int] = {}
        self.sources: list[object] = []
        self._sizes: list[int] = []  # distinct n-grams of each source (1 for a short text matched whole)
        self._parts: dict[int, list[tuple[np.ndarray, np.ndarray, int]]] = {}
        self._tables: tuple[_Table | None, _Table | None, np.ndarray, np.ndarray] | None = None
        self._size_arr = np.zeros(0)

    def __len__(self) -> int:
        return len(self.sources)

    def _ids(self, toks: list[str], grow: bool) -> np.ndarray:
        if grow:
            v = self.vocab
            return np.fromiter((v.setdefault(t, len(v) + 1) for t in toks), dtype=np.uint64, count=len(toks))
        get = self.vocab.get
        return np.array([get(t, 0) for t in toks], dtype=np.uint64)

    def add(self, text: str, source: object, *, whole_if_short: bool = True) -> None:
        """Index ``text`` under ``source`` (its n-grams; the whole text when it is short and ``whole_if_short``).
        Each call is one source of its own for the overlap count, even when ``source`` repeats (a question and
        its solution are two texts)."""
        toks = grams(text)
        if len(toks) >= self.n:
            length = self.n
        elif whole_if_short and len(toks) >= self.min_short:
            length = len(toks)
        else:
            return
        ids = self._ids(toks, grow=True)
        h = _window_hashes(ids, length)
        h = h[:1] if length < self.n else np.unique(h)
        self.sources.append(source)
        self._sizes.append(len(h))
        self._parts.setdefault(length, []).append((h, np.full(len(h), len(self.sources) - 1, dtype=np.int64), int(ids[0])))
        self._tables = None

    def _build(self) -> tuple[_Table | None, _Table | None, np.ndarray, np.ndarray]:
        """(n-gram table, short-text table, short lengths, n-grams a query must hold per source); short keys are
        mixed with their length."""
        if self._tables is None:
            long_t = short_t = None
            lengths = np.array(sorted(k for k in self._parts if k < self.n), dtype=np.intp)
            if self.n in self._parts:
                parts = self._parts[self.n]
                keys = np.concatenate([h for h, _, _ in parts])
                order = np.argsort(keys, kind="stable")  # equal windows: the first source added first
                long_t = _Table(keys[order], np.concatenate([v for _, v, _ in parts])[order], None)
            if len(lengths):
                mix = np.arange(self.n, dtype=np.uint64) * _LEN_MIX  # array arithmetic wraps silently
                parts = [(h + mix[k], v, f) for k in lengths for h, v, f in self._parts[int(k)]]
                keys, first = np.unique(np.concatenate([h for h, _, _ in parts]), return_index=True)
                starts = np.zeros(len(self.vocab) + 1, dtype=bool)
                starts[[f for _, _, f in parts]] = True
                short_t = _Table(keys, np.concatenate([v for _, v, _ in parts])[first], starts)
            self._size_arr = np.array(self._sizes, dtype=np.float64)
            need = np.maximum(1, np.ceil(self.min_overlap * self._size_arr - 1e-9)).astype(np.int64)
            self._tables = (long_t, short_t, lengths, need)  # the first source wins a shared short window
        return self._tables

    def match(self, text: str, toks: list[str] | None = None) -> object | None:
        """The source ``text`` copies, or None. ``min_overlap`` 0: the source matching earliest in the text;
        else the source of which ``text`` holds the largest share of n-grams (a short text matched whole: all).

        ``toks``: the grams of ``text`` when the caller already has them."""
        hit = self.best(text, toks)
        return None if hit is None else hit[0]

    def best(self, text: str, toks: list[str] | None = None) -> tuple[object, float | None] | None:
        """:meth:`match` with the share of the source's n-grams found in ``text`` (1.0 for a short text matched
        whole; None with ``min_overlap`` 0, where one shared n-gram decides and no share is computed)."""
        long_t, short_t, lengths, need = self._build()
        if long_t is None and short_t is None:
            return None
        ids = self._ids(grams(text) if toks is None else toks, grow=False)
        n_ids = len(ids)
        if n_ids == 0:
            return None
        prefix = _prefix_hashes(ids)
        _, inv = _powers(n_ids)
        unknown = np.concatenate([[0], np.cumsum(ids == 0)])
        best: tuple[int, int] | None = None  # (position in text, source index), min_overlap 0
        top: tuple[float, int] | None = None  # (share of the source's n-grams, source index), min_overlap > 0
        if long_t is not None and n_ids >= self.n:
            m = n_ids - self.n + 1
            starts = np.flatnonzero((unknown[self.n:self.n + m] - unknown[:m]) == 0)
            h = (prefix[starts + self.n] - prefix[starts]) * inv[starts]
            if self.min_overlap == 0.0:
                best = long_t.lookup(starts, h)
            else:
                srcs, counts = long_t.counts(h)
                ok = counts >= need[srcs]
                if ok.any():
                    share = counts[ok] / self._size_arr[srcs[ok]]
                    j = int(np.argmax(share))  # ties: the first source added (srcs are sorted)
                    top = (float(share[j]), int(srcs[ok][j]))
        if short_t is not None and (top is None or top[0] < 1.0):
            starts = np.flatnonzero(short_t.first[ids.astype(np.intp)])
            if best is not None:
                starts = starts[starts < best[0]]
            if len(starts):
                st = np.repeat(starts, len(lengths))
                ln = np.tile(lengths, len(starts))
                end = st + ln
                fits = end <= n_ids
                st, ln, end = st[fits], ln[fits], end[fits]
                fits = (unknown[end] - unknown[st]) == 0
                st, ln, end = st[fits], ln[fits], end[fits]
                h = (prefix[end] - prefix[st]) * inv[st] + ln.astype(np.uint64) * _LEN_MIX
                hit = short_t.lookup(st, h)
                if hit is not None:
                    if self.min_overlap == 0.0:
                        if best is None or hit[0] < best[0]:
                            best = hit
                    else:
                        top = (1.0, hit[1])
        if self.min_overlap == 0.0:
            return None if best is None else (self.sources[best[1]], None)
        return None if top is None else (self.sources[top[1]], top[0])


def _prefix_hashes(ids: np.ndarray) -> np.ndarray:
    """H[i] = sum_{k<i} ids[k] * B**k (uint64 arithmetic wraps around)."""
    pw, _ = _powers(len(ids))
    h = np.zeros(len(ids) + 1, dtype=np.uint64)
    np.cumsum(ids * pw[:len(ids)], out=h[1:])
    return h


def _window_hashes(ids: np.ndarray, length: int, prefix: np.ndarray | None = None) -> np.ndarray:
    """Hash of every window of ``length`` ids."""
    h = _prefix_hashes(ids) if prefix is None else prefix
    m = len(ids) - length + 1
    _, inv = _powers(len(ids))
    return (h[length:length + m] - h[:m]) * inv[:m]

"""Recall: turn per-page classifier scores into the collected set of a round.

Every page is scored; pages are ranked by score and the top ones kept, up to a page budget, a
token budget, and / or down to a score threshold (``corpus.recall``). Shards never exchange
pages: each returns a histogram of its scores (page counts and token counts per bin), the merged
histogram gives the lowest score that keeps within the budgets, and each shard then keeps its
pages at or above that score. A budget is met to within one histogram bin.

Negatives for the next round are sampled with a hash of (seed, round, page id), so the sample is
the same whatever the sharding and needs no pass over the data to draw.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def budget_for_round(budgets: Sequence[int] | None, round_: int) -> int | None:
    """The budget of round ``round_`` (1-based); the last value repeats; None = no budget."""
    if not budgets:
        return None
    return budgets[min(round_, len(budgets)) - 1]


def select_threshold(hist_pages: np.ndarray, hist_tokens: np.ndarray, *, min_score: float, max_pages: int | None,
                     max_tokens: int | None) -> float:
    """Lowest score threshold (a bin edge, >= ``min_score``) whose kept pages fit both budgets.

    Bins are taken from the top score down while the cumulative pages and tokens stay within the
    budgets; the threshold is the lower edge of the last bin taken. Returns a value above 1 when
    not even the top bin fits (nothing is collected).
    """
    bins = len(hist_pages)
    edges = np.linspace(0.0, 1.0, bins + 1)
    cum_p = np.cumsum(hist_pages[::-1])
    cum_t = np.cumsum(hist_tokens[::-1])
    ok = np.ones(bins, dtype=bool)
    if max_pages is not None:
        ok &= cum_p <= max_pages
    if max_tokens is not None:
        ok &= cum_t <= max_tokens
    taken = int(np.argmin(ok)) if not ok.all() else bins  # bins taken from the top
    thr = 1.0 + 1e-9 if taken == 0 else float(edges[bins - taken])
    return max(thr, float(min_score))


def sample_mask(ids: Sequence[str], eligible: np.ndarray, rate: float, *, seed: int, round_: int) -> np.ndarray:
    """Pages drawn with probability ``rate`` among ``eligible``, decided by a hash of (seed, round, id)."""
    out = np.zeros(len(ids), dtype=bool)
    if rate <= 0:
        return out
    salt = f"{seed}:{round_}:".encode()
    for i, pid in enumerate(ids):
        if eligible[i]:
            h = int.from_bytes(hashlib.blake2b(salt + pid.encode("utf-8"), digest_size=8).digest(), "big")
            out[i] = h / 2**64 < rate
    return out


def overlap(current: int, shared: int) -> float:
    """Fraction of the current round's pages that the previous round had already collected."""
    return shared / current if current else 0.0

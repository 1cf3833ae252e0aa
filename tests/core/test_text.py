"""Grams, URL helpers and the hashed n-gram index (checked against a naive tuple-set implementation)."""

from __future__ import annotations

import random

import pytest

from stages.core.text import (
    NgramIndex,
    grams,
    grams_and_classifier_text,
    normalize_for_classifier,
    normalize_for_hash,
    url_domain,
    url_prefix,
)


def test_grams_nfkc_lower_and_cjk() -> None:
    assert grams("Ｈｅｌｌｏ, WORLD! x² don’t") == ["hello", "world", "x2", "don", "t"]
    assert grams("数学题 abc123") == ["数", "学", "题", "abc123"]
    assert grams("$\\frac{1}{2}$") == ["frac", "1", "2"]


def test_normalisers() -> None:
    assert normalize_for_hash("The  CAT\n sat.") == normalize_for_hash("the cat sat")
    assert normalize_for_classifier("Let $x^2 = 4$.\nThen x=2!") == "let $ x ^ 2 = 4 $ then x = 2"
    toks, norm = grams_and_classifier_text("A $b_1$")
    assert toks == grams("A $b_1$") and norm == normalize_for_classifier("A $b_1$")


def test_url_helpers() -> None:
    assert url_domain("https://www.MathOverflow.net:443/questions/1?x=2") == "mathoverflow.net"
    assert url_domain("http://m.example.org") == "example.org"
    assert url_prefix("https://mathoverflow.net/questions/12/title") == "/questions/"
    assert url_prefix("https://mathoverflow.net/questions/12/title", 2) == "/questions/12/"
    assert url_prefix("https://x.org/page.html") == "/" and url_prefix("https://x.org") == "/"


def _naive(sources: list[str], n: int, min_short: int, query: str) -> set[int]:
    hits = set()
    q = grams(query)
    for i, s in enumerate(sources):
        g = grams(s)
        if len(g) >= n:
            table = {tuple(g[j:j + n]) for j in range(len(g) - n + 1)}
            if any(tuple(q[j:j + n]) in table for j in range(len(q) - n + 1)):
                hits.add(i)
        elif len(g) >= min_short and any(q[j:j + len(g)] == g for j in range(len(q) - len(g) + 1)):
            hits.add(i)
    return hits


def test_ngram_index_agrees_with_naive_sets() -> None:
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(30)]
    sources = [" ".join(rng.choice(vocab) for _ in range(rng.randint(2, 14))) for _ in range(40)]
    index = NgramIndex(6, min_short=3)
    for i, s in enumerate(sources):
        index.add(s, i)
    for _ in range(300):
        query = " ".join(rng.choice(vocab + ["zz"]) for _ in range(rng.randint(0, 40)))
        expected = _naive(sources, 6, 3, query)
        got = index.match(query)
        assert (got is None) == (not expected), query
        if got is not None:
            assert got in expected


def test_ngram_index_rules() -> None:
    index = NgramIndex(10)
    index.add("one two three four five six seven eight nine ten eleven", "long")
    index.add("Compute 8 choose 4", "short")
    index.add("too short", "tiny")  # < 3 grams: never matched whole
    assert index.match("xx ONE two three four five six seven eight nine ten yy") == "long"
    assert index.match("one two three four five six seven eight nine") is None  # only 9 grams
    assert index.match("Q: compute  8 CHOOSE 4?") == "short"
    assert index.match("compute 8 choose") is None
    assert index.match("this is too short") is None
    assert NgramIndex(5).match("anything") is None


def _naive_overlap(sources: list[str], n: int, min_short: int, theta: float, query: str) -> dict[int, float]:
    """Sources the query holds at least ``theta`` of (distinct n-grams; short sources whole), with the share."""
    q = grams(query)
    qset = {tuple(q[j:j + n]) for j in range(len(q) - n + 1)}
    out = {}
    for i, s in enumerate(sources):
        g = grams(s)
        if len(g) >= n:
            table = {tuple(g[j:j + n]) for j in range(len(g) - n + 1)}
            share = len(table & qset) / len(table)
            if share > 0 and share >= theta - 1e-12:
                out[i] = share
        elif len(g) >= min_short and any(q[j:j + len(g)] == g for j in range(len(q) - len(g) + 1)):
            out[i] = 1.0
    return out


def test_containment_agrees_with_naive_sets() -> None:
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(12)]
    sources = [" ".join(rng.choice(vocab) for _ in range(rng.randint(2, 30))) for _ in range(60)]
    for theta in (0.2, 0.5, 0.7, 1.0):
        index = NgramIndex(4, min_short=3, min_overlap=theta)
        for i, s in enumerate(sources):
            index.add(s, i)
        for _ in range(200):
            parts = [rng.choice(sources) for _ in range(rng.randint(0, 2))]
            noise = " ".join(rng.choice(vocab + ["zz"]) for _ in range(rng.randint(0, 30)))
            query = " ".join(parts[:1] + [noise] + parts[1:])
            expected = _naive_overlap(sources, 4, 3, theta, query)
            hit = index.best(query)
            assert (hit is None) == (not expected), (theta, query)
            if hit is not None:
                assert hit[0] in expected and abs(hit[1] - max(expected.values())) < 1e-9


def test_containment_rules() -> None:
    index = NgramIndex(3, min_overlap=0.5)
    index.add("a b c d e f", "six")     # 4 distinct 3-grams: a query must hold 2
    index.add("x y z x y z x y z", "rep")  # 3 distinct 3-grams (x y z, y z x, z x y): repeats count once
    index.add("p q", "tiny")  # too short to match whole
    assert index.match("a b c d") == "six" and index.best("a b c d") == ("six", 0.5)
    assert index.match("a b c") is None  # 1 of 4
    assert index.best("x y z x") == ("rep", 2 / 3)
    assert index.match("p q") is None
    assert NgramIndex(3, min_overlap=0.0).best("anything") is None
    with pytest.raises(ValueError):
        NgramIndex(3, min_overlap=1.5)


def test_normalize_url_merges_spellings_of_one_page_only() -> None:
    from stages.core.text import normalize_url

    same = ["https://www.Example.com/a/b/?utm_source=x&b=2&a=1#top", "http://www.example.com:80/a//b?a=1&b=2",
            "HTTPS://WWW.EXAMPLE.COM:443/a/b?b=2&fbclid=123&a=1"]
    assert len({normalize_url(u) for u in same}) == 1
    different = ["https://www.example.com/a/b?a=1&b=3", "https://m.example.com/a/b?a=1&b=2", "https://www.example.com/a/c?a=1&b=2",
                 "https://www.example.com:8080/a/b?a=1&b=2", same[0]]
    assert len({normalize_url(u) for u in different}) == len(different)
    assert normalize_url("https://example.com") == normalize_url("https://example.com/") == "example.com/"

"""The generated crawl and seed corpus: schema, determinism, the structure issue 2 asks for, and the
contamination guard (checked here with a naive n-gram set, independent of NgramIndex)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from stages.core.text import grams, url_domain, url_prefix
from stages.data import crawl, problems
from stages.params import CrawlParams

PARAMS = dict(n_pages=900, n_seed_pages=60, n_math_domains=6, n_general_domains=12, math_domain_share=0.35,
              min_words=80, max_words=200, max_steps=3, max_value=20, near_dup_frac=0.05, n_contaminated=20, r1_share=0.0,
              avoid_ngram=20)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crawl")
    test = problems.generate_splits(0, n_sft=10, n_rl=10, n_test=200, min_steps=1, max_steps=3, max_value=20)["test"]
    metrics = crawl.generate(CrawlParams(**PARAMS), seed=3, test_problems=test, crawl_path=tmp / "crawl.jsonl",
                             seed_path=tmp / "seed.jsonl")
    rows = [json.loads(line) for line in (tmp / "crawl.jsonl").open()]
    seed = [json.loads(line) for line in (tmp / "seed.jsonl").open()]
    return tmp, test, metrics, rows, seed


def test_schema_and_counts(generated):
    _, _, metrics, rows, seed = generated
    assert set(rows[0]) == {"id", "url", "text", "label", "kind", "near_dup_of", "contaminated_by"}
    assert set(seed[0]) == {"id", "url", "text"}
    assert len(seed) == PARAMS["n_seed_pages"]
    assert len(rows) == metrics["pages"] == PARAMS["n_pages"] + PARAMS["n_contaminated"] + metrics["near_dup_pages"]
    assert len({r["id"] for r in rows}) == len(rows) and len({r["url"] for r in rows}) == len(rows)
    for r in rows:
        assert r["label"] == ("math" if r["kind"] in crawl.MATH_KINDS else "other")
        assert r["kind"] in crawl.MATH_KINDS + crawl.OTHER_KINDS
        assert 40 <= len(r["text"].split()) <= 3 * PARAMS["max_words"]


def test_deterministic(generated, tmp_path):
    tmp, test, _, _, _ = generated
    crawl.generate(CrawlParams(**PARAMS), seed=3, test_problems=test, crawl_path=tmp_path / "c.jsonl",
                   seed_path=tmp_path / "s.jsonl")
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp / "crawl.jsonl").read_bytes()
    assert (tmp_path / "s.jsonl").read_bytes() == (tmp / "seed.jsonl").read_bytes()


def test_domain_structure(generated):
    _, _, _, rows, _ = generated
    by_domain = defaultdict(list)
    for r in rows:
        if r["near_dup_of"] is None:
            by_domain[url_domain(r["url"])].append(r)
    math_share = {d: sum(r["label"] == "math" for r in rs) / len(rs) for d, rs in by_domain.items()}
    math_domains = [d for d, s in math_share.items() if s > 0.4]
    general = [d for d, s in math_share.items() if s <= 0.4]
    assert len(math_domains) == PARAMS["n_math_domains"] and len(general) == PARAMS["n_general_domains"]
    # math pages also live on general domains, non-math pages also on math domains
    assert sum(r["label"] == "math" for d in general for r in by_domain[d]) >= 10
    assert sum(r["label"] == "other" for d in math_domains for r in by_domain[d]) >= 30
    # on math domains only some prefixes hold math
    for d in math_domains:
        share = defaultdict(Counter)
        for r in by_domain[d]:
            share[url_prefix(r["url"])][r["label"]] += 1
        assert any(c["math"] == 0 for c in share.values()) and any(c["math"] > c["other"] for c in share.values())


def test_math_styles_and_seed_narrower(generated):
    _, _, _, rows, seed = generated
    kinds = Counter(r["kind"] for r in rows if r["label"] == "math")
    assert set(kinds) == set(crawl.MATH_KINDS)
    assert kinds["worked_problem"] / sum(kinds.values()) > 0.3  # the pretraining corpus teaches the task
    worked = [r["text"] for r in rows if r["kind"] == "worked_problem"]
    assert all("\\boxed{" in t.lower() for t in worked)
    assert any("$" in r["text"] for r in rows if r["kind"] == "definition")
    assert all("\\boxed{" not in s["text"] for s in seed)  # seed: formal pages only, no worked problems
    crawl_texts = {" ".join(grams(r["text"])) for r in rows}
    assert not any(" ".join(grams(s["text"])) in crawl_texts for s in seed)
    assert not {url_domain(s["url"]) for s in seed} & {url_domain(r["url"]) for r in rows}


def test_near_duplicates_point_to_originals(generated):
    _, _, metrics, rows, _ = generated
    ids = {r["id"]: r for r in rows}
    dups = [r for r in rows if r["near_dup_of"] is not None]
    assert len(dups) == metrics["near_dup_pages"] > 0
    for r in dups:
        orig = ids[r["near_dup_of"]]
        assert orig["near_dup_of"] is None and orig["label"] == r["label"]
        a, b = set(grams(orig["text"])), set(grams(r["text"]))
        assert len(a & b) / len(a | b) > 0.6


def test_only_planted_pages_copy_test_problems(generated):
    _, test, _, rows, _ = generated
    n = PARAMS["avoid_ngram"]
    by_id = {t["id"]: t for t in test}
    table = set()
    short = set()
    for t in test:
        for text in (t["question"], t["cot"]):
            g = grams(text)
            table.update(tuple(g[i:i + n]) for i in range(len(g) - n + 1))
        q = grams(t["question"])
        if len(q) < n:
            short.add(" " + " ".join(q) + " ")
    planted = 0
    for r in rows:
        g = grams(r["text"])
        joined = " " + " ".join(g) + " "
        hit = any(tuple(g[i:i + n]) in table for i in range(len(g) - n + 1)) or any(q in joined for q in short)
        if r["contaminated_by"] is None:
            assert not hit, r["id"]
        else:
            planted += 1
            assert " ".join(grams(by_id[r["contaminated_by"]]["question"])) in joined
    assert planted >= PARAMS["n_contaminated"]


def test_r1_share_writes_worked_problems_in_r1_format(generated, tmp_path):
    """data.crawl.r1_share: that share of worked problems as ``<think> reasoning </think> The answer is \\boxed{x}.``
    (the text an R1-Zero start needs to know the tags); the default crawl has none."""
    _, test, _, rows, _ = generated
    assert not any("</think>" in r["text"] for r in rows)
    p = CrawlParams(**{**PARAMS, "r1_share": 0.3})
    crawl.generate(p, seed=3, test_problems=test, crawl_path=tmp_path / "c.jsonl", seed_path=tmp_path / "s.jsonl")
    r1 = [json.loads(line) for line in (tmp_path / "c.jsonl").open()]
    worked = [r for r in r1 if r["kind"] == "worked_problem"]
    sections = [s for r in worked for s in r["text"].split("\n\n") if "\nAnswer: <think> " in s]
    assert sections and all(s.count("</think>") == 1 and s.rstrip().endswith("}.") for s in sections)
    shares = len(sections) / sum(1 for r in worked for s in r["text"].split("\n\n")
                                 if "Solution.\n" in s or "\nAnswer:" in s or "In Python:" in s or "```python" in s)
    assert 0.2 < shares < 0.4, shares
    sec = crawl.r1_section("Q?", "Step one: 1 + 1 = 2.\nThe answer is \\boxed{2}.")
    assert sec == "Question: Q?\nAnswer: <think> Step one: 1 + 1 = 2. </think> The answer is \\boxed{2}."

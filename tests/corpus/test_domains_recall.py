"""Domain discovery and selection by budget / threshold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stages.core.errors import PipelineError
from stages.corpus import domains as dom
from stages.corpus.recall import budget_for_round, sample_mask, select_threshold


def _stats() -> dom.DomainStats:
    s = dom.DomainStats()
    # mathsite: /q/ mostly collected, /shop/ never; general: 1 of 40 collected
    s.add(["mathsite.org"] * 30, ["/q/"] * 20 + ["/shop/"] * 10, [True] * 14 + [False] * 16)
    other = dom.DomainStats()
    other.add(["general.com"] * 40, ["/blog/"] * 40, [True] + [False] * 39)
    s.merge(other)
    return s


def test_math_domains_and_prefix_proposals(tmp_path: Path) -> None:
    s = _stats()
    mdoms = dom.math_domains(s, domain_fraction=0.1, min_domain_pages=10)
    assert mdoms == ["mathsite.org"]
    props = dom.propose(s, mdoms, prefix_fraction=0.5, min_prefix_pages=5)
    assert [(p.domain, p.prefix, p.pages, p.collected) for p in props] == [("mathsite.org", "/q/", 20, 14)]
    assert dom.accept(props, mdoms, "auto") == {("mathsite.org", "/q/")}
    dom.write_proposals(tmp_path / "p.tsv", props, {("mathsite.org", "/q/")})
    assert "mathsite.org\t/q/\t20\t14\t0.700\tTrue" in (tmp_path / "p.tsv").read_text()


def test_approved_list_replaces_auto(tmp_path: Path) -> None:
    s = _stats()
    mdoms = dom.math_domains(s, domain_fraction=0.1, min_domain_pages=10)
    f = tmp_path / "approved.tsv"
    f.write_text("# reviewed\nmathsite.org\t/shop/\ngeneral.com /blog/   # not a math domain: ignored\n")
    assert dom.accept([], mdoms, str(f)) == {("mathsite.org", "/shop/")}
    f.write_text("mathsite.org questions\n")
    with pytest.raises(PipelineError, match="expected"):
        dom.read_approved(f)
    with pytest.raises(PipelineError, match="not found"):
        dom.read_approved(tmp_path / "missing.tsv")


def test_select_threshold_budgets() -> None:
    bins = 10
    hp = np.array([5, 5, 5, 5, 5, 5, 5, 5, 5, 5])
    ht = hp * 100
    assert select_threshold(hp, ht, min_score=0.5, max_pages=None, max_tokens=None) == 0.5
    assert select_threshold(hp, ht, min_score=0.0, max_pages=None, max_tokens=None) == 0.0
    assert select_threshold(hp, ht, min_score=0.0, max_pages=12, max_tokens=None) == pytest.approx(0.8)
    assert select_threshold(hp, ht, min_score=0.0, max_pages=None, max_tokens=1500) == pytest.approx(0.7)
    assert select_threshold(hp, ht, min_score=0.9, max_pages=30, max_tokens=None) == pytest.approx(0.9)
    assert select_threshold(hp, ht, min_score=0.0, max_pages=3, max_tokens=None) > 1.0  # nothing fits
    assert len(hp) == bins
    assert budget_for_round(None, 3) is None and budget_for_round([10, 20], 1) == 10 and budget_for_round([10, 20], 4) == 20


def test_negative_sampling_is_deterministic_and_independent_of_sharding() -> None:
    ids = [f"page-{i}" for i in range(4000)]
    eligible = np.ones(4000, dtype=bool)
    eligible[::4] = False
    whole = sample_mask(ids, eligible, 0.25, seed=0, round_=1)
    halves = np.concatenate([sample_mask(ids[:1500], eligible[:1500], 0.25, seed=0, round_=1),
                             sample_mask(ids[1500:], eligible[1500:], 0.25, seed=0, round_=1)])
    assert np.array_equal(whole, halves) and not (whole & ~eligible).any()
    assert abs(whole.sum() / eligible.sum() - 0.25) < 0.03
    assert not np.array_equal(whole, sample_mask(ids, eligible, 0.25, seed=0, round_=2))

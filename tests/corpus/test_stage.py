"""The corpus stage end to end on a small generated crawl: outputs, ground-truth figures, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages import corpus
from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import write_jsonl
from stages.data import crawl, problems
from stages.params import CorpusParams, CrawlParams, resolve
from stages.schema.base import merge_runtime

ROOT = Path(__file__).resolve().parents[2]
SMALL_CRAWL = dict(n_pages=3000, n_seed_pages=300, n_math_domains=9, n_general_domains=36, math_domain_share=0.35,
                   min_words=100, max_words=250, max_steps=3, max_value=20, near_dup_frac=0.05, n_contaminated=30, r1_share=0.0,
                   avoid_ngram=20)


def _params(**over: Any) -> CorpusParams:
    doc = resolve(ROOT / "params.yaml")
    # the section with its runtime values merged in (stages/schema/base.py)
    raw = merge_runtime(CorpusParams, doc["corpus"], doc["runtime"]["corpus"], "corpus", "params.yaml")
    for key, value in over.items():
        node = raw
        *parents, leaf = key.split(".")
        for k in parents:
            node = node[k]
        node[leaf] = value
    return CorpusParams(**raw)


def _generate(root: Path, **crawl_over: Any) -> None:
    splits = problems.generate_splits(0, n_sft=200, n_rl=100, n_test=150, min_steps=1, max_steps=3, max_value=20)
    for split, rows in splits.items():
        write_jsonl(root / paths.problems_file(split), rows)
    write_jsonl(root / paths.testset_file("generated"), splits["test"])  # as the testsets stage writes it
    crawl.generate(CrawlParams(**{**SMALL_CRAWL, **crawl_over}), seed=0, test_problems=splits["test"], crawl_path=root / paths.CRAWL,
                   seed_path=root / paths.SEED)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    _generate(root)
    return root


@pytest.fixture(scope="module")
def run(project: Path) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(project)
        return corpus.run(_params())


def test_outputs(project: Path, run: dict[str, Any]) -> None:
    import datasets

    out = project / paths.CORPUS
    ds = datasets.load_dataset("json", data_files=str(out / "math_corpus.jsonl"), split="train")
    assert set(ds.column_names) == {"id", "url", "text", "score", "domain", "round"}
    assert len(ds) == run["math_pages"] > 0 and min(ds["score"]) >= 0.5 and set(ds["round"]) <= {1, 2, 3, 4}
    general = [json.loads(line) for line in (out / "general.jsonl").open()]
    assert len(general) == run["general_pages"] and set(general[0]) == {"id", "url", "text"}
    assert run["math_pages"] + run["general_pages"] == run["candidates"]
    for split in ("sft", "rl"):
        rows = [json.loads(line) for line in (out / "problems" / f"{split}.jsonl").open()]
        src = [json.loads(line) for line in (project / paths.problems_file(split)).open()]
        assert len(rows) == len(src) - run["problems_removed"][split] and set(rows[0]) == set(src[0])
    assert (out / "classifier.bin").is_file()
    assert sorted(p.name for p in (out / "reports").iterdir()) == [
        "decontamination.json", "dedup.json", "domains-round1.tsv", "domains-round2.tsv", "domains-round3.tsv", "rounds.json"]
    assert (project / paths.plots_dir("corpus") / "rounds.tsv").read_text().startswith("round\tcollected")
    assert json.loads((project / paths.timings_file("corpus")).read_text())["wall_s"] > 0
    assert "wall_s" not in json.loads((project / paths.metrics_file("corpus")).read_text())
    assert not list((project / "data").glob(".corpus-work*"))  # scratch removed


def test_ground_truth_figures(run: dict[str, Any]) -> None:
    final = run["final"]
    assert final["precision"] >= 0.9 and final["recall"] >= 0.9
    assert final["recall_gain_points"] >= 10  # round 1 misses the styles the seed corpus lacks
    assert [r["round"] for r in run["rounds"]] == [1, 2, 3, 4]
    assert run["rounds"][0]["pages_added_to_seed"] > 0
    assert run["decontam_vs_truth"]["planted_recall"] == 1.0 and run["decontam_vs_truth"]["clean_pages_removed"] == 0
    assert run["dedup_vs_truth"]["pair_recall"] >= 0.85
    assert run["dedup_vs_truth"]["removed_without_true_duplicate"] <= 2


def test_deterministic_and_shard_count_independent(project: Path, run: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Same figures with 3 shards instead of 2 (pairs split across shards are deduplicated all the same)."""
    monkeypatch.chdir(project)
    again = corpus.run(_params(n_shards=3, **{"recall.rounds": 2}))
    keys = ("collected", "new", "threshold", "positives", "pages_added_to_seed", "precision", "recall")
    for a, b in zip(again["rounds"], run["rounds"][:2], strict=True):
        assert {k: a[k] for k in keys if k in a} == {k: b[k] for k in keys if k in a}
    assert again["duplicates_removed"] == run["duplicates_removed"]
    assert again["contaminated_removed"] == run["contaminated_removed"]


@pytest.mark.slow
def test_prefect_flow_maps_shards_as_tasks(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.corpus import corpus_shards_flow

    monkeypatch.chdir(project)
    m = corpus_shards_flow(_params(workers=2, **{"recall.rounds": 2}))
    assert m["rounds_run"] == 2 and (project / paths.MATH_CORPUS).is_file()


def test_bad_inputs(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    with pytest.raises(PipelineError, match="crawl_path"):
        corpus.run(_params(crawl_path=str(tmp_path / "missing.jsonl")))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(PipelineError, match="seed corpus .* has no valid pages"):
        corpus.run(_params(seed_path=str(tmp_path / "empty.jsonl"), **{"recall.rounds": 1}))
    (tmp_path / "junk.jsonl").write_bytes(b'{"url": "u"}\n\xff\xfe\nnot json\n')
    with pytest.raises(PipelineError, match="no valid pages"):
        corpus.run(_params(crawl_path=str(tmp_path / "junk.jsonl")))
    with pytest.raises(PipelineError, match="decontam.testsets"):
        corpus.run(_params(**{"decontam.testsets": str(tmp_path / "missing")}))
    with pytest.raises(PipelineError, match="approved prefix list not found"):
        corpus.run(_params(**{"domains.approve": str(tmp_path / "missing.tsv")}))


def test_malformed_lines_are_counted(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_bytes((project / paths.CRAWL).read_bytes() + b'{"broken\n\xff\n{"url": "x", "text": ""}\n')
    m = corpus.run(_params(crawl_path=str(dirty), **{"recall.rounds": 1}))
    assert m["skipped"] == {"bad_json": 2, "no_text": 1}

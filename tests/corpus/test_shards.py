"""Streaming input: byte-range shards cover every line once; bad rows are counted skips; Parquet and
datasets directories work too."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from stages.core.errors import PipelineError
from stages.corpus.shards import iter_pages, plan_shards


def _write(path: Path, n: int) -> list[dict]:
    rows = [{"id": f"p{i}", "url": f"https://s{i % 3}.org/a/{i}", "text": "x" * (i % 17 + 1) + f" page {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.mark.parametrize("n_shards", [1, 2, 3, 7, 50])
def test_jsonl_byte_ranges_cover_every_line_once(tmp_path: Path, n_shards: int) -> None:
    rows = _write(tmp_path / "c.jsonl", 101)
    shards = plan_shards(tmp_path / "c.jsonl", n_shards)
    assert len(shards) == n_shards
    got = [p["id"] for s in shards for p in iter_pages(s)]
    assert got == [r["id"] for r in rows]


def test_bad_rows_are_counted_skips(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    good = json.dumps({"url": "https://a.org/x", "text": "fine"}).encode()
    f.write_bytes(b"\n".join([
        good, b"{not json", b"\xff\xfe bad bytes", b"[1, 2]", json.dumps({"url": "https://a.org/y", "text": "  "}).encode(),
        json.dumps({"text": "no url"}).encode(), json.dumps({"url": "u", "text": 5}).encode(), b"", good,
    ]) + b"\n")
    skipped: Counter[str] = Counter()
    pages = [p for s in plan_shards(f, 3) for p in iter_pages(s, skipped)]
    assert len(pages) == 2 and pages[0]["id"].startswith("c.jsonl@")  # no id: file@offset
    assert skipped == {"bad_json": 3, "no_text": 2, "no_url": 1}


def test_parquet_and_datasets_directories(tmp_path: Path) -> None:
    import datasets

    rows = [{"id": f"p{i}", "url": f"https://a.org/{i}", "text": f"text {i}", "label": "math"} for i in range(30)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "c.parquet"), batch_size=10)
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "c.parquet", tmp_path / "saved"):
        pages = [p for s in plan_shards(path, 4) for p in iter_pages(s)]
        assert [p["id"] for p in pages] == [r["id"] for r in rows] and pages[0]["label"] == "math"


def test_missing_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="not found"):
        plan_shards(tmp_path / "nope.jsonl", 2)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(PipelineError, match="no \\*.jsonl"):
        plan_shards(tmp_path / "empty_dir", 2)


def test_fsspec_urls_read_like_local_paths(tmp_path: Path) -> None:
    """An fsspec URL (here file://) plans and reads the same shards as the path; shards carry the URL for workers."""
    pytest.importorskip("warcio")
    from stages.data.html import write_warc

    rows = _write(tmp_path / "c.jsonl", 40)
    write_warc(tmp_path / "w.warc.gz", [{"url": r["url"], "html": f"<html><body><p>{r['text']}</p></body></html>"} for r in rows[:5]])
    for name in ("c.jsonl", "w.warc.gz"):
        local = plan_shards(tmp_path / name, 3)
        url = plan_shards(f"file://{tmp_path / name}", 3)
        assert all(s.path.startswith("file://") for s in url)
        assert [p["url"] for s in url for p in iter_pages(s)] == [p["url"] for s in local for p in iter_pages(s)]
    directory = plan_shards(f"file://{tmp_path}", 4)
    assert {s.fmt for s in directory} == {"jsonl", "warc"} and all(s.path.startswith("file://") for s in directory)

"""Streaming page input: split a crawl on disk into shards and read them page by page.

Accepted inputs (``corpus.crawl_path`` / ``corpus.seed_path``):

- a JSONL file: split into byte ranges on line boundaries (shard ``i`` reads the lines that start
  inside its range, so no line is read twice or lost);
- a Parquet file: split by row groups;
- a ``datasets`` directory saved with ``save_to_disk``: split into contiguous row ranges
  (memory-mapped Arrow, never loaded whole);
- a directory of ``*.jsonl`` / ``*.parquet`` files: each file split as above.

Rows need a non-empty string ``text`` and ``url``; ``id`` is optional (``<file>@<offset>`` when
absent). Bad rows are **counted skips**, never tracebacks: ``bad_json`` (malformed JSON, bytes
that are not UTF-8, a line that is not an object), ``no_text``, ``no_url``. Ground-truth fields
of the generated crawl (``label``, ``kind``, ``near_dup_of``, ``contaminated_by``) are carried
along when present, for evaluation only.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError

CARRIED = ("label", "kind", "near_dup_of", "contaminated_by")


@dataclass(frozen=True)
class Shard:
    """One slice of one input file: bytes [start, stop) of a JSONL file, row groups or rows [start, stop)."""

    path: str
    fmt: str  # "jsonl" | "parquet" | "arrow"
    start: int
    stop: int
    index: int


def _files(path: Path) -> list[tuple[Path, str]]:
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
            return [(path, "arrow")]
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet"))
        if not files:
            raise PipelineError(f"{path}: no *.jsonl or *.parquet files and not a datasets directory; give a page file or directory")
        return [(f, "parquet" if f.suffix == ".parquet" else "jsonl") for f in files]
    if path.is_file():
        return [(path, "parquet" if path.suffix == ".parquet" else "jsonl")]
    raise PipelineError(f"{path}: not found; run the data stage (dvc repro data) or fix the path in params")


def plan_shards(path: str | os.PathLike[str], n: int) -> list[Shard]:
    """Split the input at ``path`` into about ``n`` shards (at least one per file)."""
    files = _files(Path(path))
    per_file = max(1, -(-n // len(files)))
    shards: list[Shard] = []
    for f, fmt in files:
        if fmt == "jsonl":
            size = f.stat().st_size
            k = max(1, min(per_file, size))
            bounds = [size * i // k for i in range(k + 1)]
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            groups = pq.ParquetFile(f).num_row_groups
            k = max(1, min(per_file, groups))
            bounds = [groups * i // k for i in range(k + 1)]
        else:
            import datasets

            rows = len(datasets.load_from_disk(str(f)))
            k = max(1, min(per_file, rows))
            bounds = [rows * i // k for i in range(k + 1)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            shards.append(Shard(str(f), fmt, a, b, len(shards)))
    return shards


def _raw_rows(shard: Shard) -> Iterator[tuple[str, Any]]:
    """(position tag, parsed row or None when malformed)."""
    name = Path(shard.path).name
    if shard.fmt == "jsonl":
        with open(shard.path, "rb") as f:
            pos = shard.start
            if pos > 0:
                f.seek(pos - 1)
                pos += len(f.readline()) - 1  # skip the line that started before our range
            while pos < shard.stop:
                raw = f.readline()
                if not raw:
                    break
                here, pos = pos, pos + len(raw)
                if not raw.strip():
                    continue
                try:
                    yield f"{name}@{here}", json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    yield f"{name}@{here}", None
    elif shard.fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(shard.path)
        row = sum(pf.metadata.row_group(g).num_rows for g in range(shard.start))
        for g in range(shard.start, shard.stop):
            for rec in pf.read_row_group(g).to_pylist():
                yield f"{name}@{row}", rec
                row += 1
    else:
        import datasets

        ds = datasets.load_from_disk(shard.path)
        for i in range(shard.start, shard.stop, 1000):
            batch = ds[i:min(i + 1000, shard.stop)]
            keys = list(batch)
            for j in range(len(batch[keys[0]]) if keys else 0):
                yield f"{name}@{i + j}", {k: batch[k][j] for k in keys}


def iter_pages(shard: Shard, skipped: Counter[str] | None = None) -> Iterator[dict[str, Any]]:
    """Valid pages of ``shard`` as ``{"id", "url", "text", ...carried fields}``; bad rows counted in ``skipped``."""
    skipped = skipped if skipped is not None else Counter()
    for tag, row in _raw_rows(shard):
        if not isinstance(row, dict):
            skipped["bad_json"] += 1
            continue
        text, url = row.get("text"), row.get("url")
        if not isinstance(text, str) or not text.strip():
            skipped["no_text"] += 1
            continue
        if not isinstance(url, str) or not url.strip():
            skipped["no_url"] += 1
            continue
        page = {"id": str(row["id"]) if row.get("id") is not None else tag, "url": url.strip(), "text": text}
        for k in CARRIED:
            if k in row:
                page[k] = row[k]
        yield page

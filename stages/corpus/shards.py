"""Streaming page input: split a crawl on disk into shards and read them page by page.

Accepted inputs (``corpus.crawl_path`` / ``corpus.seed_path``):

- a JSONL file: split into byte ranges on line boundaries (shard ``i`` reads the lines that start
  inside its range, so no line is read twice or lost);
- a Parquet file: split by row groups;
- a ``datasets`` directory saved with ``save_to_disk``: split into contiguous row ranges
  (memory-mapped Arrow, never loaded whole);
- a directory of ``*.jsonl`` / ``*.parquet`` files: each file split as above;
- WARC / WET files (``*.warc``, ``*.warc.gz``, ``*.wet``, ``*.wet.gz``, or a directory of them; one shard
  per file, as Common Crawl segments come): WARC ``response`` records with an HTML body become pages through
  :mod:`stages.corpus.extract` (``ReadOptions.extractor``), WET ``conversion`` records are taken as text;
  the URL is ``WARC-Target-URI`` and the id ``WARC-Record-ID``. Other records are counted skips
  (``warc_not_html``, ``warc_other``; an HTML page with no text left is ``no_text``).

Paths are local paths or fsspec URLs (``file://``, ``s3://``, ... with the matching fsspec backend), read
the same way by every worker. ``ReadOptions.languages`` keeps only pages whose language (py3langid) is one
of the given codes (others are counted as ``language``).

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
from pathlib import PurePosixPath
from typing import Any

import fsspec

from stages.core.errors import PipelineError, cause

CARRIED = ("label", "kind", "near_dup_of", "contaminated_by")


@dataclass(frozen=True)
class Shard:
    """One slice of one input file: bytes [start, stop) of a JSONL file, row groups or rows [start, stop)."""

    path: str
    fmt: str  # "jsonl" | "parquet" | "arrow" | "warc"
    start: int
    stop: int
    index: int


@dataclass(frozen=True)
class ReadOptions:
    """How pages are read: the HTML extractor for WARC responses and the language filter."""

    extractor: str = "trafilatura"
    languages: tuple[str, ...] | None = None


WARC_SUFFIXES = (".warc", ".warc.gz", ".wet", ".wet.gz")


def _fmt(name: str) -> str | None:
    if name.endswith(WARC_SUFFIXES):
        return "warc"
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(PurePosixPath(name).suffix)


def _files(path: str) -> list[tuple[str, str]]:
    fs, root = fsspec.core.url_to_fs(path)
    url = "://" in path

    def name(p: str) -> str:  # how a worker opens it: the URL form for remote files, the path for local ones
        return fs.unstrip_protocol(p) if url else p
    if fs.isdir(root):
        if fs.isfile(f"{root}/dataset_info.json") or fs.isfile(f"{root}/state.json"):
            if url:
                raise PipelineError(f"{path}: a datasets directory must be a local path")
            return [(root, "arrow")]
        files = sorted(p for p in fs.ls(root, detail=False) if _fmt(p) is not None)
        if not files:
            raise PipelineError(f"{path}: no *.jsonl, *.parquet or WARC / WET files and not a datasets directory; "
                                "give a page file or directory")
        return [(name(f), str(_fmt(f))) for f in files]
    if fs.isfile(root):
        return [(name(root), _fmt(root) or "jsonl")]
    raise PipelineError(f"{path}: not found; run the data stage (dvc repro data) or fix the path in params")


def _open(path: str, mode: str = "rb") -> Any:
    return fsspec.open(path, mode).open()


def plan_shards(path: str | os.PathLike[str], n: int) -> list[Shard]:
    """Split the input at ``path`` into about ``n`` shards (at least one per file; one per WARC / WET file)."""
    files = _files(str(path))
    per_file = max(1, -(-n // len(files)))
    shards: list[Shard] = []
    for f, fmt in files:
        if fmt == "warc":
            shards.append(Shard(f, fmt, 0, 1, len(shards)))
            continue
        if fmt == "jsonl":
            fs, p = fsspec.core.url_to_fs(f)
            size = fs.size(p)
            k = max(1, min(per_file, size))
            bounds = [size * i // k for i in range(k + 1)]
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            try:
                with _open(f) as fh:
                    groups = pq.ParquetFile(fh).num_row_groups
            except Exception as e:  # noqa: BLE001 - a corrupt footer: one line naming the file
                raise PipelineError(f"{f}: not a readable Parquet file ({cause(e)}); fix or remove it") from None
            k = max(1, min(per_file, groups))
            bounds = [groups * i // k for i in range(k + 1)]
        else:
            import datasets

            try:
                rows = len(datasets.load_from_disk(str(f)))
            except Exception as e:  # noqa: BLE001
                raise PipelineError(f"{f}: not a readable datasets directory ({cause(e)}); save it again") from None
            k = max(1, min(per_file, rows))
            bounds = [rows * i // k for i in range(k + 1)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            shards.append(Shard(str(f), fmt, a, b, len(shards)))
    return shards


def _raw_rows(shard: Shard) -> Iterator[tuple[str, Any]]:
    """(position tag, parsed row or None when malformed)."""
    name = PurePosixPath(shard.path).name
    if shard.fmt == "jsonl":
        with _open(shard.path) as f:
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

        with _open(shard.path) as fh:
            pf = pq.ParquetFile(fh)
            row = sum(pf.metadata.row_group(g).num_rows for g in range(shard.start))
            for g in range(shard.start, shard.stop):
                try:
                    recs = pf.read_row_group(g).to_pylist()
                except Exception as e:  # noqa: BLE001 - a corrupt data page: one line naming file and rows
                    raise PipelineError(f"{shard.path}: rows from {row} (row group {g}): corrupt Parquet data "
                                        f"({cause(e)}); re-create or re-download the file") from None
                for rec in recs:
                    yield f"{name}@{row}", rec
                    row += 1
    elif shard.fmt == "warc":
        yield from _warc_rows(shard, name)
    else:
        import datasets

        ds = datasets.load_from_disk(shard.path)
        for i in range(shard.start, shard.stop, 1000):
            try:
                batch = ds[i:min(i + 1000, shard.stop)]
            except Exception as e:  # noqa: BLE001 - a truncated / corrupt arrow file
                raise PipelineError(f"{shard.path}: rows from {i}: corrupt datasets data ({cause(e)}); save it "
                                    "again") from None
            keys = list(batch)
            for j in range(len(batch[keys[0]]) if keys else 0):
                yield f"{name}@{i + j}", {k: batch[k][j] for k in keys}


def _warc_rows(shard: Shard, name: str) -> Iterator[tuple[str, Any]]:
    """WARC responses (HTML, extracted later) and WET conversions as rows; other records as skip markers."""
    from warcio.archiveiterator import ArchiveIterator

    with _open(shard.path) as f:
        for i, rec in enumerate(ArchiveIterator(f)):
            tag = f"{name}#{i}"
            if rec.rec_type not in ("response", "conversion"):
                if rec.rec_type not in ("warcinfo", "request", "metadata"):
                    yield tag, _Skip("warc_other")
                continue
            url = rec.rec_headers.get_header("WARC-Target-URI")
            rid = rec.rec_headers.get_header("WARC-Record-ID") or tag
            if rec.rec_type == "conversion":
                yield tag, {"id": rid.strip("<>"), "url": url, "text": rec.content_stream().read().decode("utf-8", "replace")}
                continue
            ctype = (rec.http_headers.get_header("Content-Type") if rec.http_headers else "") or ""
            if "html" not in ctype.lower():
                yield tag, _Skip("warc_not_html")
                continue
            body = rec.content_stream().read()
            yield tag, {"id": rid.strip("<>"), "url": url, "html": body, "charset": _charset(ctype)}


def _charset(ctype: str) -> str | None:
    for part in ctype.split(";"):
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v:
            return v.strip("\"' ").lower()
    return None


@dataclass(frozen=True)
class _Skip:
    reason: str


def language(text: str) -> str:
    """The language code py3langid assigns to ``text`` (its first 2,000 characters, lower-cased: the model's byte
    n-grams are case-sensitive and call all-capitals English pages Nigerian Pidgin)."""
    import py3langid

    return str(py3langid.classify(text[:2000].lower())[0])


def iter_pages(shard: Shard, skipped: Counter[str] | None = None, read: ReadOptions | None = None
               ) -> Iterator[dict[str, Any]]:
    """Valid pages of ``shard`` as ``{"id", "url", "text", ...carried fields}``; bad rows counted in ``skipped``."""
    skipped = skipped if skipped is not None else Counter()
    read = read or ReadOptions()
    for tag, row in _raw_rows(shard):
        if isinstance(row, _Skip):
            skipped[row.reason] += 1
            continue
        if not isinstance(row, dict):
            skipped["bad_json"] += 1
            continue
        if "html" in row:
            from stages.corpus.extract import html_to_text

            row["text"] = html_to_text(row.pop("html"), read.extractor, encoding=row.pop("charset", None))
        text, url = row.get("text"), row.get("url")
        if not isinstance(text, str) or not text.strip():
            skipped["no_text"] += 1
            continue
        if not isinstance(url, str) or not url.strip():
            skipped["no_url"] += 1
            continue
        if read.languages is not None and language(text) not in read.languages:
            skipped["language"] += 1
            continue
        page = {"id": str(row["id"]) if row.get("id") is not None else tag, "url": url.strip(), "text": text}
        for k in CARRIED:
            if k in row:
                page[k] = row[k]
        yield page

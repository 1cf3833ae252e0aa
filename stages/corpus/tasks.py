"""The tasks of the corpus stage: every function handles one shard, one bucket partition or one small
reduction, and is mapped by :func:`stages.corpus.run` (as Prefect tasks on a thread pool, Dask or Ray by
flows/corpus.py; one after the other by default). Arguments and results are plain picklable values
(paths, counts, small arrays); page data and per-page state stay in files under the shard's working
directory, so the driver never holds anything per page and a worker on another machine only needs the
working directory on a shared file system.

Per-shard working files (``<work>/shard-NNNNN/``): ``pages.jsonl`` (the pages that survived the
language filter and decontamination), ``norm.txt`` (each page's text normalised for the classifier, one
per line, so rounds never normalise twice), ``meta.json`` (id, domain, prefix, near_dup_of),
``tokens.npy`` / ``label.npy`` (token counts, ground truth), ``sig.npy`` (MinHash signatures),
``entries.npy`` (dedup bucket entries, sorted), and the state the rounds update: ``keep.npy``,
``added.npy``, ``new_added.npy``, ``negatives.npy``, ``scores.npy``, ``hist_pages.npy`` /
``hist_tokens.npy`` (the round's score histograms), ``collected.npy``, ``first_round.npy``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import threading
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stages.core.io import read_jsonl, write_jsonl
from stages.core.text import grams_and_classifier_text, normalize_for_classifier, normalize_url, url_domain, url_prefix
from stages.corpus import dedup as dd
from stages.corpus import domains as dom
from stages.corpus.classifier import MathClassifier, train_file, write_training_file
from stages.corpus.decontaminate import ContaminationIndex, Report, decontaminate, load_benchmarks
from stages.corpus.recall import sample_mask
from stages.corpus.shards import ReadOptions, Shard, iter_pages

LABEL_CODE = {"math": 1, "other": 0}


def tokens_of(text: str) -> int:
    """Token count proxy used for budgets: ceil(characters / 4), the usual BPE rule of thumb."""
    return -(-len(text) // 4)


def _save(path: Path, arr: np.ndarray) -> None:
    """``np.save`` through a temporary name, so a re-run task never leaves a torn file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)


def _load(shard_dir: str, name: str) -> np.ndarray:
    return np.load(Path(shard_dir) / f"{name}.npy")


def _meta(shard_dir: str) -> dict[str, list[Any]]:
    return json.loads((Path(shard_dir) / "meta.json").read_text(encoding="utf-8"))


def _pages(shard_dir: str) -> Iterator[dict[str, Any]]:
    with open(Path(shard_dir) / "pages.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _norm(shard_dir: str) -> Iterator[str]:
    with open(Path(shard_dir) / "norm.txt", encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


# ------------------------------------------------------------------------------------------------
# benchmarks index and seed corpus

_INDEX: dict[tuple[str, float], ContaminationIndex] = {}
_INDEX_LOCK = threading.Lock()


def build_index(index_file: str, *, generated_test: str | None, testsets: str | None, ngram: int, min_short: int,
                min_overlap: float = 0.0, gsm8k: str | None = None, math: str | None = None) -> dict[str, int]:
    """Build the benchmark n-gram index once and pickle it for the shard tasks; return items per benchmark.
    ``testsets``: the testsets stage's directory (each file a benchmark); the generated test split always."""
    bench = {**load_benchmarks(testsets=testsets, gsm8k=gsm8k, math=math),
             **load_benchmarks(generated_test=generated_test)}
    index = ContaminationIndex(bench, ngram, min_short=min_short, min_overlap=min_overlap)
    index.index.match("warm up")  # builds the sorted tables before pickling
    tmp = f"{index_file}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(index, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, index_file)
    return dict(index.sizes)


def load_index(index_file: str) -> ContaminationIndex:
    """The pickled index, loaded once per worker process (keyed by path and modification time)."""
    key = (index_file, os.stat(index_file).st_mtime)
    with _INDEX_LOCK:
        if key not in _INDEX:
            _INDEX.clear()
            with open(index_file, "rb") as f:
                _INDEX[key] = pickle.load(f)
        return _INDEX[key]


def seed_shard(shard: Shard, out_file: str) -> tuple[int, dict[str, int]]:
    """Normalise one shard of the seed corpus into ``out_file`` (one line per page); (pages, skipped)."""
    skipped: Counter[str] = Counter()
    n = 0
    with open(out_file, "w", encoding="utf-8") as f:
        for page in iter_pages(shard, skipped):
            line = normalize_for_classifier(page["text"])
            if line:
                f.write(line + "\n")
                n += 1
    return n, dict(skipped)


# ------------------------------------------------------------------------------------------------
# prepare: read, filter, decontaminate, dedup keys


def prepare_shard(shard: Shard, shard_dir: str, index_file: str, *, read: ReadOptions, num_perm: int, shingle: int,
                  url: bool, exact: bool, near: bool, bands: int, rows: int, prefix_depth: int, samples: int
                  ) -> dict[str, Any]:
    """Read and validate one input shard, apply the language filter, drop contaminated pages, compute the
    dedup bucket entries; write the shard's work files and return small counts."""
    index = load_index(index_file)
    out = Path(shard_dir)
    out.mkdir(parents=True, exist_ok=True)
    skipped: Counter[str] = Counter()
    report = Report(samples)
    meta: dict[str, list[Any]] = {k: [] for k in ("id", "domain", "prefix", "near_dup_of")}
    tokens: list[int] = []
    labels: list[int] = []
    url_keys: list[bytes] = []
    exact_keys: list[bytes] = []
    sigs: list[np.ndarray] = []
    n_in = 0
    truth: Counter[str] = Counter()
    with open(out / "pages.jsonl", "w", encoding="utf-8") as f, open(out / "norm.txt", "w", encoding="utf-8") as fn:
        for page in iter_pages(shard, skipped, read):
            n_in += 1
            text = page["text"]
            toks, norm = grams_and_classifier_text(text)
            planted = page.get("contaminated_by") is not None
            truth["planted"] += planted
            hit = index.match(text, toks)
            if hit is not None:
                report.add(page, *hit)
                truth["planted_removed" if planted else "clean_removed"] += 1
                continue
            f.write(json.dumps(page, ensure_ascii=False) + "\n")
            fn.write(norm + "\n")
            meta["id"].append(page["id"])
            meta["domain"].append(url_domain(page["url"]))
            meta["prefix"].append(url_prefix(page["url"], prefix_depth))
            meta["near_dup_of"].append(page.get("near_dup_of"))
            tokens.append(tokens_of(text))
            labels.append(LABEL_CODE.get(page.get("label"), -1))
            if url:
                url_keys.append(dd.url_key(normalize_url(page["url"])))
            if exact:
                exact_keys.append(dd.exact_key(text, toks))
            if near:
                sigs.append(dd.signature(text, num_perm, shingle, toks))
    sig = np.stack(sigs) if sigs else np.zeros((0, num_perm), dtype=np.uint32)
    entries = dd.bucket_entries(shard.index, url=url_keys if url else None, exact=exact_keys if exact else None,
                                sigs=sig if near else None, bands=bands, rows=rows)
    (out / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    lab = np.array(labels, dtype=np.int8)
    _save(out / "tokens.npy", np.array(tokens, dtype=np.int64))
    _save(out / "label.npy", lab)
    _save(out / "sig.npy", sig)
    _save(out / "entries.npy", entries)
    return {"pages_in": n_in, "kept": len(labels), "skipped": dict(skipped), "report": report, "truth": dict(truth),
            "entries": len(entries), "labelled": int((lab >= 0).sum())}


# ------------------------------------------------------------------------------------------------
# dedup: partitions, clusters


def _signatures(sig_files: Sequence[str]) -> Any:
    """A function gid array -> signature rows, reading the shards' signature files memory-mapped."""
    maps: dict[int, np.ndarray] = {}

    def get(g: np.ndarray) -> np.ndarray:
        shard, row = dd.split_gid(g)
        out: np.ndarray | None = None
        for s in np.unique(shard).tolist():
            if s not in maps:
                maps[s] = np.load(sig_files[s], mmap_mode="r")
            sel = shard == s
            block = np.asarray(maps[s][row[sel]])
            if out is None:
                out = np.empty((len(g), block.shape[1]), dtype=block.dtype)
            out[sel] = block
        return out if out is not None else np.zeros((0, 0), dtype=np.uint32)
    return get


def dedup_partition(entry_files: list[str], sig_files: list[str], lo: int, hi: int, threshold: float,
                    out_file: str) -> int:
    """Edges (URL, exact, verified near) of one bucket partition, written to ``out_file``; their number."""
    edges = dd.partition_edges(entry_files, lo, hi, _signatures(sig_files), threshold)
    _save(Path(out_file), edges)
    return len(edges)


def dedup_clusters(edge_files: list[str], shard_dirs: list[str], samples: int) -> dict[str, Any]:
    """Resolve clusters from all partitions' edges; write each shard's ``removed.npy``; counts and samples."""
    edges = np.concatenate([np.load(f) for f in edge_files]) if edge_files else np.zeros(0, dtype=dd.EDGE)
    cl = dd.resolve_clusters(edges)
    shard, row = dd.split_gid(cl.removed)
    for s, d in enumerate(shard_dirs):
        _save(Path(d) / "removed.npy", row[shard == s])
    counts = Counter(dd.KINDS[k] for k in cl.kind.tolist())
    first = np.argsort(cl.removed, kind="stable")[:samples]
    ids: dict[int, list[str]] = {}

    def id_of(g: int) -> str:
        s, r = g >> 32, g & 0xFFFFFFFF
        if s not in ids:
            ids[s] = _meta(shard_dirs[s])["id"]
        return ids[s][r]
    sample = {id_of(int(cl.removed[i])): id_of(int(cl.kept[i])) for i in first}
    return {"removed": {k: counts[k] for k in dd.KINDS if counts[k]}, "samples": sample}


def _root_hash(ids: Sequence[str]) -> np.ndarray:
    return np.array([int.from_bytes(dd.url_key(x)[:8], "little") for x in ids], dtype=np.uint64)


def init_state(shard_dir: str, truth_dir: str | None, n_truth_parts: int) -> int:
    """Start the rounds' state of a shard (kept = not removed as a duplicate); return its kept pages.

    With ``truth_dir`` (a crawl with ground truth), also write the shard's dedup-truth records
    (:func:`dedup_truth_partition`) partitioned by the hash of each page's true original.
    """
    n = len(_load(shard_dir, "tokens"))
    keep = np.ones(n, dtype=bool)
    keep[_load(shard_dir, "removed")] = False
    d = Path(shard_dir)
    _save(d / "keep.npy", keep)
    for name in ("added", "new_added", "collected", "negatives"):
        _save(d / f"{name}.npy", np.zeros(n, dtype=bool))
    _save(d / "first_round.npy", np.zeros(n, dtype=np.int16))
    if truth_dir is not None:
        meta = _meta(shard_dir)
        roots = [o if o is not None else i for i, o in zip(meta["id"], meta["near_dup_of"], strict=True)]
        rec = np.zeros(n, dtype=[("root", "<u8"), ("self", "?"), ("removed", "?")])
        rec["root"] = _root_hash(roots)
        rec["self"] = np.array([o is None for o in meta["near_dup_of"]], dtype=bool)
        rec["removed"] = ~keep
        part = rec["root"] % np.uint64(n_truth_parts)
        for q in range(n_truth_parts):
            _save(Path(truth_dir) / f"part-{q:05d}-{d.name}.npy", rec[part == q])
    return int(keep.sum())


def dedup_truth_partition(files: list[str]) -> tuple[int, int, int]:
    """(true pairs, pairs found, pages removed without a true duplicate) of one partition of truth records.

    A true pair is a page and the original it copies (``near_dup_of``), both present after
    decontamination; it is found when either page was removed.
    """
    rec = np.concatenate([np.load(f) for f in files]) if files else np.zeros(0)
    if not len(rec):
        return 0, 0, 0
    _, inv, size = np.unique(rec["root"], return_inverse=True, return_counts=True)
    present = np.bincount(inv, weights=rec["self"]) > 0
    root_removed = np.bincount(inv, weights=rec["self"] & rec["removed"]) > 0
    copy = ~rec["self"]
    paired = present[inv] & (size[inv] >= 2)
    pairs = int((copy & present[inv]).sum())
    found = int((copy & present[inv] & (rec["removed"] | root_removed[inv])).sum())
    false = int((rec["removed"] & ~paired).sum())
    return pairs, found, false


# ------------------------------------------------------------------------------------------------
# rounds


def training_texts_shard(shard_dir: str, *, round_: int, seed: int, rate: float, uncollected: bool, neg_file: str,
                         add_file: str) -> tuple[int, int]:
    """Draw the round's negatives among the shard's eligible pages (kept, not added to the seed, and with
    ``uncollected`` not collected last round) and write their texts and those of the pages added to the seed
    last round to two files; (negatives, added) written."""
    keep, added, new_added = _load(shard_dir, "keep"), _load(shard_dir, "added"), _load(shard_dir, "new_added")
    eligible = keep & ~added
    if uncollected and round_ > 1:
        eligible &= ~_load(shard_dir, "collected")
    negs = sample_mask(_meta(shard_dir)["id"], eligible, rate, seed=seed, round_=round_)
    _save(Path(shard_dir) / "negatives.npy", negs)
    n_neg = n_add = 0
    with open(neg_file, "w", encoding="utf-8") as fn, open(add_file, "w", encoding="utf-8") as fa:
        for i, line in enumerate(_norm(shard_dir)):
            if (negs[i] or new_added[i]) and line:
                if negs[i]:
                    fn.write(line + "\n")
                    n_neg += 1
                else:
                    fa.write(line + "\n")
                    n_add += 1
    return n_neg, n_add


def _lines(files: Sequence[str], rate: float, seed: int) -> Iterator[str]:
    """Lines of ``files`` (already normalised texts), each kept with probability ``rate``."""
    rng = random.Random(seed)
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if rate >= 1.0 or rng.random() < rate:
                    yield line.rstrip("\n")


def train_round(*, positive_files: list[str], positive_rate: float, negative_files: list[str], seed: int,
                shuffle_seed: int, train_txt: str, model_file: str, dim: int, lr: float, word_ngrams: int, min_count: int, epochs: int,
                bucket: int, thread: int) -> tuple[int, int]:
    """Write the round's fastText training file (positives subsampled at ``positive_rate``, lines interleaved
    with ``shuffle_seed``), train fastText with ``seed``, save the model; (positives, negatives)."""
    n_p, n_n = write_training_file(train_txt, _lines(positive_files, positive_rate, shuffle_seed),
                                   _lines(negative_files, 1.0, 0), seed=shuffle_seed, normalized=True)
    if n_n == 0:
        return n_p, n_n
    clf = train_file(train_txt, dim=dim, lr=lr, word_ngrams=word_ngrams, min_count=min_count, epochs=epochs,
                     bucket=bucket, thread=thread, seed=seed)
    clf.save(model_file)
    os.unlink(train_txt)
    return n_p, n_n


def score_shard(shard_dir: str, model_path: str, bins: int, batch_size: int = 4096) -> int:
    """Score the kept pages of a shard (NaN for the rest, in ``scores.npy``) and write their histograms of pages and
    tokens (``hist_pages.npy``, ``hist_tokens.npy``, summed by :func:`sum_histograms`); return the pages scored.
    The histograms stay in files (2 x ``bins`` values per shard): the driver never holds one per shard."""
    keep, tokens = _load(shard_dir, "keep"), _load(shard_dir, "tokens")
    clf = MathClassifier.load(model_path)
    scores = np.full(len(keep), np.nan, dtype=np.float32)
    batch: list[str] = []
    rows: list[int] = []

    def flush() -> None:
        if batch:
            scores[rows] = clf.score(batch, normalized=True)
            batch.clear()
            rows.clear()
    for i, line in enumerate(_norm(shard_dir)):
        if keep[i]:
            batch.append(line)
            rows.append(i)
            if len(batch) >= batch_size:
                flush()
    flush()
    _save(Path(shard_dir) / "scores.npy", scores)
    s = scores[keep]
    hp, _ = np.histogram(s, bins=bins, range=(0.0, 1.0))
    ht, _ = np.histogram(s, bins=bins, range=(0.0, 1.0), weights=tokens[keep].astype(np.float64))
    _save(Path(shard_dir) / "hist_pages.npy", hp)
    _save(Path(shard_dir) / "hist_tokens.npy", ht)
    return int(len(s))


def sum_histograms(shard_dirs: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The score histograms of pages and tokens summed over the shards (one reduction task per round; it reads
    2 x bins values per shard)."""
    hp, ht = _load(shard_dirs[0], "hist_pages"), _load(shard_dirs[0], "hist_tokens")
    for d in shard_dirs[1:]:
        hp += _load(d, "hist_pages")
        ht += _load(d, "hist_tokens")
    return hp, ht


def _counts(pred: np.ndarray, truth: np.ndarray) -> tuple[int, int, int]:
    return int((pred & truth).sum()), int(pred.sum()), int(truth.sum())


def collect_shard(shard_dir: str, *, threshold: float, round_: int, domain_dir: str | None, n_domain_parts: int
                  ) -> dict[str, Any]:
    """Collect the shard's pages scoring at least ``threshold``; update its state; return counts.

    Counts: collected, shared with the previous round, tokens, and (with ground truth) true positives /
    predicted / true of the collected set and of the classifier at 0.5 on held-out pages (kept, neither
    negatives nor added to the seed this round). With ``domain_dir``, also write the shard's page and
    collected counts per (domain, prefix) into ``n_domain_parts`` partition files by domain hash.
    """
    d = Path(shard_dir)
    keep, scores, tokens = _load(shard_dir, "keep"), _load(shard_dir, "scores"), _load(shard_dir, "tokens")
    prev, first_round = _load(shard_dir, "collected"), _load(shard_dir, "first_round")
    collected = keep & (np.nan_to_num(scores, nan=-1.0) >= threshold)
    first_round[collected & (first_round == 0)] = round_
    _save(d / "collected.npy", collected)
    _save(d / "first_round.npy", first_round)
    out: dict[str, Any] = {"collected": int(collected.sum()), "shared": int((collected & prev).sum()),
                           "tokens": int(tokens[collected].sum())}
    label = _load(shard_dir, "label")
    if (label >= 0).all():
        out["prf"] = _counts(collected[keep], label[keep] == 1)
        held = keep & ~_load(shard_dir, "negatives") & ~_load(shard_dir, "added")
        out["heldout"] = (*_counts(np.nan_to_num(scores, nan=0.0)[held] >= 0.5, label[held] == 1), int(held.sum()))
    if domain_dir is not None:
        meta = _meta(shard_dir)
        pages: Counter[tuple[str, str]] = Counter(zip(meta["domain"], meta["prefix"], strict=True))
        got: Counter[tuple[str, str]] = Counter(
            (dm, pre) for dm, pre, c in zip(meta["domain"], meta["prefix"], collected.tolist(), strict=True) if c)
        parts: list[list[list[Any]]] = [[] for _ in range(n_domain_parts)]
        for (dm, pre), n in pages.items():
            parts[zlib.crc32(dm.encode("utf-8")) % n_domain_parts].append([dm, pre, n, got[dm, pre]])
        for q, rows in enumerate(parts):
            (Path(domain_dir) / f"part-{q:05d}-{d.name}.json").write_text(json.dumps(rows), encoding="utf-8")
    return out


def domain_partition(files: list[str], *, domain_fraction: float, min_domain_pages: int, prefix_fraction: float,
                     min_prefix_pages: int) -> tuple[list[str], list[dom.Proposal]]:
    """Math-related domains and prefix proposals of one partition of domains (every shard's counts for them)."""
    stats = dom.DomainStats()
    for f in files:
        stats.add_counts(json.loads(Path(f).read_text(encoding="utf-8")))
    mdoms = dom.math_domains(stats, domain_fraction=domain_fraction, min_domain_pages=min_domain_pages)
    return mdoms, dom.propose(stats, mdoms, prefix_fraction=prefix_fraction, min_prefix_pages=min_prefix_pages)


def add_shard(shard_dir: str, accepted: set[tuple[str, str]], *, uncollected: bool) -> tuple[int, int]:
    """Add the shard's kept, uncollected pages under accepted prefixes to the seed; (pages added, pages
    eligible as negatives next round)."""
    meta = _meta(shard_dir)
    keep, added, collected = _load(shard_dir, "keep"), _load(shard_dir, "added"), _load(shard_dir, "collected")
    in_acc = np.array([(dm, pre) in accepted for dm, pre in zip(meta["domain"], meta["prefix"], strict=True)],
                      dtype=bool).reshape(-1)
    new_added = keep & ~collected & ~added & in_acc
    added |= new_added
    _save(Path(shard_dir) / "new_added.npy", new_added)
    _save(Path(shard_dir) / "added.npy", added)
    eligible = keep & ~added & (~collected if uncollected else True)
    return int(new_added.sum()), int(eligible.sum())


# ------------------------------------------------------------------------------------------------
# outputs


def write_shard(shard_dir: str, math_file: str, general_file: str) -> tuple[int, int, int]:
    """Write the shard's math rows (id, url, text, score, domain, round) and general rows (id, url, text)."""
    keep, collected = _load(shard_dir, "keep"), _load(shard_dir, "collected")
    scores, first_round = _load(shard_dir, "scores"), _load(shard_dir, "first_round")
    n_math = n_gen = tok = 0
    with open(math_file, "w", encoding="utf-8") as fm, open(general_file, "w", encoding="utf-8") as fg:
        for i, page in enumerate(_pages(shard_dir)):
            if not keep[i]:
                continue
            if collected[i]:
                row = {"id": page["id"], "url": page["url"], "text": page["text"], "score": round(float(scores[i]), 5),
                       "domain": url_domain(page["url"]), "round": int(first_round[i])}
                fm.write(json.dumps(row, ensure_ascii=False) + "\n")
                n_math += 1
                tok += tokens_of(page["text"])
            else:
                fg.write(json.dumps({"id": page["id"], "url": page["url"], "text": page["text"]}, ensure_ascii=False) + "\n")
                n_gen += 1
    return n_math, n_gen, tok


def decontaminate_problems(src: str, index_file: str, out_file: str) -> dict[str, Any]:
    """Decontaminate one split of word problems (question + CoT) against the benchmarks; write the kept ones."""
    rows = read_jsonl(src)
    res = decontaminate(rows, load_index(index_file), text=lambda r: f"{r.get('question', '')}\n{r.get('cot', '')}")
    write_jsonl(out_file, res.kept)
    return {"in": len(rows), "removed": len(res.removed), "by_benchmark": res.counts(),
            "samples": [{"id": r.get("id"), "benchmark": b, "item": i} for r, b, i in res.removed[:5]]}

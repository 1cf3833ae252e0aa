"""Shard-level work of the corpus stage: each function handles one shard and is mapped over shards
(as Prefect tasks by flows/corpus.py; sequentially by default). Arguments and results are plain,
picklable values, so a Dask or Ray task runner can ship them to other processes.

Per-shard working files (``<work>/shard-NNNNN/``): ``pages.jsonl`` (the pages that survived
decontamination), ``meta.json`` (id, domain, prefix, tokens, ground truth), ``exact.npy`` and
``sig.npy`` (dedup keys), ``norm.txt`` (each page's text normalised for the classifier, one per line, so
rounds never normalise twice), ``scores-<shard>.npy`` (classifier scores of the current round).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from stages.core.text import grams_and_classifier_text, url_domain, url_prefix
from stages.corpus.classifier import MathClassifier
from stages.corpus.decontaminate import ContaminationIndex, Report
from stages.corpus.dedup import exact_key, signature
from stages.corpus.shards import Shard, iter_pages

LABEL_CODE = {"math": 1, "other": 0}


def tokens_of(text: str) -> int:
    """Token count proxy used for budgets: ceil(characters / 4), the usual BPE rule of thumb."""
    return -(-len(text) // 4)


def _pages(shard_dir: str) -> Iterator[dict[str, Any]]:
    with open(Path(shard_dir) / "pages.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _norm(shard_dir: str) -> Iterator[str]:
    with open(Path(shard_dir) / "norm.txt", encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def prepare_shard(shard: Shard, shard_dir: str, index: ContaminationIndex, *, num_perm: int, shingle: int,
                  near: bool, prefix_depth: int, samples: int) -> dict[str, Any]:
    """Read and validate one input shard, drop contaminated pages, compute dedup keys; write the shard's work files."""
    out = Path(shard_dir)
    out.mkdir(parents=True, exist_ok=True)
    skipped: Counter[str] = Counter()
    report = Report(samples)
    meta: dict[str, list[Any]] = {k: [] for k in ("id", "domain", "prefix", "tokens", "label", "near_dup_of", "planted")}
    exact: list[bytes] = []
    sigs: list[np.ndarray] = []
    n_in = 0
    truth = Counter()
    with open(out / "pages.jsonl", "w", encoding="utf-8") as f, open(out / "norm.txt", "w", encoding="utf-8") as fn:
        for page in iter_pages(shard, skipped):
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
            meta["tokens"].append(tokens_of(text))
            meta["label"].append(LABEL_CODE.get(page.get("label"), -1))
            meta["near_dup_of"].append(page.get("near_dup_of"))
            meta["planted"].append(planted)
            exact.append(exact_key(text, toks))
            if near:
                sigs.append(signature(text, num_perm, shingle, toks))
    (out / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    np.save(out / "exact.npy", np.array(exact, dtype="S16"))
    np.save(out / "sig.npy", np.stack(sigs) if sigs else np.zeros((0, num_perm), dtype=np.uint32))
    return {"pages_in": n_in, "kept": len(meta["id"]), "skipped": dict(skipped), "report": report, "truth": dict(truth)}


def training_texts_shard(shard_dir: str, negatives: np.ndarray, added: np.ndarray, neg_file: str, add_file: str
                         ) -> tuple[int, int]:
    """Write the normalised texts of the rows flagged in ``negatives`` / ``added`` to two files."""
    n_neg = n_add = 0
    with open(neg_file, "w", encoding="utf-8") as fn, open(add_file, "w", encoding="utf-8") as fa:
        for i, line in enumerate(_norm(shard_dir)):
            if negatives[i] or added[i]:
                if not line:
                    continue
                if negatives[i]:
                    fn.write(line + "\n")
                    n_neg += 1
                else:
                    fa.write(line + "\n")
                    n_add += 1
    return n_neg, n_add


def score_shard(shard_dir: str, model_path: str, keep: np.ndarray, tokens: np.ndarray, scores_file: str, bins: int,
                batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Score the kept pages of a shard (NaN for the rest); return score histograms of pages and of tokens."""
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
    np.save(scores_file, scores)
    s = scores[keep]
    hp, _ = np.histogram(s, bins=bins, range=(0.0, 1.0))
    ht, _ = np.histogram(s, bins=bins, range=(0.0, 1.0), weights=tokens[keep].astype(np.float64))
    return hp, ht


def write_shard(shard_dir: str, keep: np.ndarray, collected: np.ndarray, scores: np.ndarray, first_round: np.ndarray,
                math_file: str, general_file: str) -> tuple[int, int, int]:
    """Write the shard's math rows (id, url, text, score, domain, round) and general rows (id, url, text)."""
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

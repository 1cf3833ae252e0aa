"""The ``corpus`` stage: DeepSeekMath's math-corpus pipeline (paper section 2.1) on a crawl on disk.

1. Read the crawl shard by shard (:mod:`.shards`), drop pages that copy a benchmark problem
   (:mod:`.decontaminate`) and compute exact / MinHash dedup keys (:mod:`.dedup`); one task per shard.
2. Remove exact and near duplicates in one global pass over the keys (pairs across shards included).
3. For each round: train fastText on the seed corpus (+ pages discovered so far) against random
   crawl pages (:mod:`.classifier`), score every page (one task per shard), keep the top pages by
   budget / threshold (:mod:`.recall`), find math-related domains and their math URL prefixes,
   and add those prefixes' uncollected pages to the seed corpus (:mod:`.domains`).
4. Write the last round's pages as the math corpus, the rest as general text, the SFT / RL problems
   decontaminated against the evaluation sets, the last classifier, and reports.

Outputs (``data/corpus/``, written atomically): math_corpus.jsonl (id, url, text, score, domain,
round: the first round that collected the page), general.jsonl (id, url, text), problems/{sft,rl}.jsonl,
classifier.bin, reports/ (rounds.json, domains-round<k>.tsv, dedup.json, decontamination.json).
When the crawl carries ground truth (the generated crawl's ``label``, ``near_dup_of``,
``contaminated_by``), the metrics also score every step against it.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, read_jsonl, temporary_dir, write_json, write_jsonl, write_metrics, write_text
from stages.core.problems import read_rows
from stages.core.text import normalize_for_classifier
from stages.corpus import domains as dom
from stages.corpus.classifier import train_file, write_training_file
from stages.corpus.decontaminate import ContaminationIndex, Report, decontaminate, load_benchmarks
from stages.corpus.dedup import Deduplicator
from stages.corpus.recall import budget_for_round, overlap, sample_mask, select_threshold
from stages.corpus.shards import iter_pages, plan_shards
from stages.corpus.tasks import prepare_shard, score_shard, training_texts_shard, write_shard
from stages.schema.corpus import CorpusParams

MapFn = Callable[[Callable[..., Any], list[dict[str, Any]]], list[Any]]
"""Runs ``fn(**kwargs)`` for each kwargs dict and returns the results in order (sequential, Prefect tasks, ...)."""


def local_map(fn: Callable[..., Any], items: list[dict[str, Any]]) -> list[Any]:
    """The default :data:`MapFn`: one after the other in this process."""
    return [fn(**kw) for kw in items]


def _check_inputs(p: CorpusParams) -> None:
    for name, value in (("crawl_path", p.crawl_path), ("seed_path", p.seed_path)):
        if not Path(value).exists():
            raise PipelineError(f"corpus.{name}: {value} not found; run the data stage (dvc repro data) or fix the path")
    for split in ("sft", "rl", "test"):
        f = Path(p.problems_dir) / f"{split}.jsonl"
        if not f.is_file():
            raise PipelineError(f"corpus.problems_dir: {f} not found; run the data stage or fix the path")
    for split in ("sft", "rl"):  # copied (decontaminated) into data/corpus/problems: checked here, where they enter
        read_rows(Path(p.problems_dir) / f"{split}.jsonl", what=f"{split.upper()} problem")
    for name, value in (("gsm8k_test", p.decontam.gsm8k_test), ("math_test", p.decontam.math_test)):
        if value is not None and not Path(value).is_file():
            raise PipelineError(f"corpus.decontam.{name}: {value} not found; give an existing JSONL file or null")
    if p.domains.approve != "auto":
        dom.read_approved(p.domains.approve)


def _prf(pred: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    tp = float(np.sum(pred & truth))
    prec = tp / max(1.0, float(pred.sum()))
    rec = tp / max(1.0, float(truth.sum()))
    return {"precision": round(prec, 4), "recall": round(rec, 4), "f1": round(2 * prec * rec / max(1e-12, prec + rec), 4)}


def _lines(files: list[Path], rate: float, seed: int) -> Iterator[str]:
    """Lines of ``files`` (already normalised texts), each kept with probability ``rate``."""
    rng = random.Random(seed)
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if rate >= 1.0 or rng.random() < rate:
                    yield line.rstrip("\n")


def run(p: CorpusParams, *, map_fn: MapFn | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build the math corpus into data/corpus/ (atomically) and return the metrics (also written to data/metrics)."""
    t0 = time.perf_counter()
    mp = map_fn or local_map
    say = log or (lambda msg: None)
    _check_inputs(p)
    bench = load_benchmarks(generated_test=Path(p.problems_dir) / "test.jsonl", gsm8k=p.decontam.gsm8k_test,
                            math=p.decontam.math_test)
    index = ContaminationIndex(bench, p.decontam.ngram, min_short=p.decontam.min_short)
    timings: dict[str, float] = {}
    with temporary_dir(paths.DATA, "corpus-work") as work, atomic_path(paths.CORPUS) as out:
        (out / "reports").mkdir(parents=True)
        metrics = _build(p, mp, say, index, work, out, timings)
    timings["total"] = round(time.perf_counter() - t0, 2)
    metrics["timings_s"] = timings
    metrics["wall_s"] = timings["total"]
    write_metrics("corpus", metrics, ["math_pages", "math_tokens", "general_pages", "rounds_run", "final.*",
                                        "decontam_vs_truth.planted_recall", "dedup_vs_truth.pair_recall"])
    return metrics


def _build(p: CorpusParams, mp: MapFn, say: Callable[[str], None], index: ContaminationIndex, work: Path, out: Path,
           timings: dict[str, float]) -> dict[str, Any]:
    # 0. seed corpus (first: an empty one fails before any work) --------------------------
    seed_file = work / "seed.txt"
    n_seed = 0
    seed_skipped: Counter[str] = Counter()
    with open(seed_file, "w", encoding="utf-8") as f:
        for sh in plan_shards(p.seed_path, 1):
            for page in iter_pages(sh, seed_skipped):
                line = normalize_for_classifier(page["text"])
                if line:
                    f.write(line + "\n")
                    n_seed += 1
    if n_seed == 0:
        raise PipelineError(f"corpus.seed_path: the seed corpus {p.seed_path} has no valid pages (skipped: {dict(seed_skipped)}); "
                            "the classifier needs positives")

    # 1. shards: validate, decontaminate, dedup keys --------------------------------------------------
    t = time.perf_counter()
    shards = plan_shards(p.crawl_path, p.n_shards)
    dirs = [str(work / f"shard-{s.index:05d}") for s in shards]
    prepared = mp(prepare_shard, [
        dict(shard=s, shard_dir=d, index=index, num_perm=p.dedup.num_perm, shingle=p.dedup.shingle, near=p.dedup.near,
             prefix_depth=p.domains.prefix_depth, samples=p.decontam.samples) for s, d in zip(shards, dirs, strict=True)])
    skipped: Counter[str] = Counter()
    report = Report(p.decontam.samples)
    truth: Counter[str] = Counter()
    for r in prepared:
        skipped.update(r["skipped"])
        report.merge(r["report"])
        truth.update(r["truth"])
    pages_in = sum(r["pages_in"] for r in prepared)
    if pages_in == 0:
        raise PipelineError(f"corpus.crawl_path: {p.crawl_path} has no valid pages (skipped: {dict(skipped)}); "
                            "rows need non-empty 'text' and 'url'")
    meta = [json.loads((Path(d) / "meta.json").read_text(encoding="utf-8")) for d in dirs]
    ids = [m["id"] for m in meta]
    tokens = [np.array(m["tokens"], dtype=np.int64) for m in meta]
    labels = [np.array(m["label"], dtype=np.int8) for m in meta]
    has_truth = all((lab >= 0).all() for lab in labels) and sum(len(x) for x in labels) > 0
    say(f"read {pages_in} pages in {len(shards)} shards; {sum(report.removed.values())} contaminated, skipped {dict(skipped)}")
    timings["prepare"] = round(time.perf_counter() - t, 2)

    # 2. global dedup ------------------------------------------------------------------------------------
    t = time.perf_counter()
    dd = Deduplicator(exact=p.dedup.exact, near=p.dedup.near, threshold=p.dedup.threshold, num_perm=p.dedup.num_perm)
    keep = []
    dup_kind: Counter[str] = Counter()
    dup_of: dict[str, str] = {}
    for s, d in enumerate(dirs):
        exact = np.load(Path(d) / "exact.npy")
        sigs = np.load(Path(d) / "sig.npy")
        k = np.ones(len(ids[s]), dtype=bool)
        for r in range(len(k)):
            hit = dd.check((s, r), bytes(exact[r]).ljust(16, b"\0"), sigs[r] if p.dedup.near else None)
            if hit is not None:
                k[r] = False
                dup_kind[hit[0]] += 1
                dup_of[ids[s][r]] = ids[hit[1][0]][hit[1][1]]
        keep.append(k)
    dedup_report: dict[str, Any] = {"removed": dict(dup_kind), "samples": dict(list(dup_of.items())[:20])}
    if has_truth:
        dedup_report["vs_truth"] = _dedup_truth(meta, dup_of)
    del dd
    n_candidates = int(sum(k.sum() for k in keep))
    say(f"dedup removed {dict(dup_kind)}; {n_candidates} candidate pages")
    timings["dedup"] = round(time.perf_counter() - t, 2)
    if n_candidates == 0:
        raise PipelineError("no crawl page is left after decontamination and deduplication; check corpus.decontam / dedup")

    # 3. rounds --------------------------------------------------------------------------------------------
    added = [np.zeros(len(x), dtype=bool) for x in ids]
    new_added = [np.zeros(len(x), dtype=bool) for x in ids]
    first_round = [np.zeros(len(x), dtype=np.int16) for x in ids]
    prev: list[np.ndarray] | None = None
    collected: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    add_files: list[Path] = []
    rounds: list[dict[str, Any]] = []
    model_path = work / "model.bin"
    cp = p.classifier
    for k in range(1, p.recall.rounds + 1):
        tr = time.perf_counter()
        n_pos_all = n_seed + sum(int(a.sum()) for a in added)
        n_pos = min(n_pos_all, cp.max_positives)
        eligible = [kp & ~ad for kp, ad in zip(keep, added, strict=True)]
        if cp.negatives == "uncollected" and prev is not None:
            eligible = [e & ~c for e, c in zip(eligible, prev, strict=True)]
        n_eligible = sum(int(e.sum()) for e in eligible)
        rate = min(1.0, cp.negatives_per_positive * n_pos / max(1, n_eligible))
        negs = [sample_mask(i, e, rate, seed=p.seed, round_=k) for i, e in zip(ids, eligible, strict=True)]
        neg_files = [work / f"neg-r{k}-{s}.txt" for s in range(len(dirs))]
        round_add = [work / f"add-r{k}-{s}.txt" for s in range(len(dirs))]
        mp(training_texts_shard, [
            dict(shard_dir=d, negatives=negs[s], added=new_added[s], neg_file=str(neg_files[s]), add_file=str(round_add[s]))
            for s, d in enumerate(dirs)])
        add_files += round_add
        train_txt = work / f"train-r{k}.txt"
        n_p, n_n = write_training_file(
            train_txt, _lines([seed_file, *add_files], n_pos / max(1, n_pos_all), seed=p.seed + k),
            _lines(neg_files, 1.0, 0), seed=p.seed + k, normalized=True)
        if n_n == 0:
            raise PipelineError(f"round {k}: no crawl page left to sample negatives from; lower corpus.recall.rounds")
        clf = train_file(train_txt, dim=cp.dim, lr=cp.lr, word_ngrams=cp.word_ngrams, min_count=cp.min_count,
                         epochs=cp.epochs, bucket=cp.bucket, thread=cp.thread, seed=p.seed)
        clf.save(model_path)
        del clf
        for f in [train_txt, *neg_files]:
            f.unlink()
        t_train = time.perf_counter() - tr

        ts = time.perf_counter()
        score_files = [work / f"scores-{s}.npy" for s in range(len(dirs))]
        hists = mp(score_shard, [
            dict(shard_dir=d, model_path=str(model_path), keep=keep[s], tokens=tokens[s], scores_file=str(score_files[s]),
                 bins=p.recall.bins) for s, d in enumerate(dirs)])
        hp = np.sum([h[0] for h in hists], axis=0)
        ht = np.sum([h[1] for h in hists], axis=0)
        thr = select_threshold(hp, ht, min_score=p.recall.min_score, max_pages=budget_for_round(p.recall.max_pages, k),
                               max_tokens=budget_for_round(p.recall.max_tokens, k))
        scores = [np.load(f) for f in score_files]
        collected = [kp & (np.nan_to_num(sc, nan=-1.0) >= thr) for kp, sc in zip(keep, scores, strict=True)]
        for fr, c in zip(first_round, collected, strict=True):
            fr[c & (fr == 0)] = k
        n_col = sum(int(c.sum()) for c in collected)
        shared = sum(int((c & q).sum()) for c, q in zip(collected, prev, strict=True)) if prev is not None else 0
        rec: dict[str, Any] = {
            "round": k, "positives": n_p, "positives_discovered": n_pos_all - n_seed, "negatives": n_n,
            "threshold": round(thr, 4), "collected": n_col,
            "tokens": int(sum(int(t_[c].sum()) for t_, c in zip(tokens, collected, strict=True))),
            "new": n_col - shared, "overlap_with_previous": round(overlap(n_col, shared), 4) if prev is not None else None,
            "train_s": round(t_train, 2), "score_s": round(time.perf_counter() - ts, 2),
        }
        if has_truth:
            kp_all = np.concatenate(keep)
            truth_all = np.concatenate(labels)[kp_all] == 1
            rec.update(_prf(np.concatenate(collected)[kp_all], truth_all))
            held = np.concatenate([kp & ~n & ~a for kp, n, a in zip(keep, negs, added, strict=True)])
            s_all = np.nan_to_num(np.concatenate(scores), nan=0.0)
            rec["heldout_classifier"] = {**_prf(s_all[held] >= 0.5, np.concatenate(labels)[held] == 1), "pages": int(held.sum())}
        stop = (p.recall.stop_overlap is not None and prev is not None and rec["overlap_with_previous"] >= p.recall.stop_overlap)
        if k < p.recall.rounds and not stop:
            stats = dom.DomainStats()
            for m, c in zip(meta, collected, strict=True):
                stats.add(m["domain"], m["prefix"], c.tolist())
            mdoms = dom.math_domains(stats, domain_fraction=p.domains.domain_fraction,
                                     min_domain_pages=p.domains.min_domain_pages)
            props = dom.propose(stats, mdoms, prefix_fraction=p.domains.prefix_fraction,
                                min_prefix_pages=p.domains.min_prefix_pages)
            acc = dom.accept(props, mdoms, p.domains.approve)
            dom.write_proposals(out / "reports" / f"domains-round{k}.tsv", props, acc)
            for s, m in enumerate(meta):
                in_acc = np.array([(d, pre) in acc for d, pre in zip(m["domain"], m["prefix"], strict=True)], dtype=bool)
                new_added[s] = keep[s] & ~collected[s] & ~added[s] & in_acc if len(in_acc) else in_acc
                added[s] |= new_added[s]
            rec.update({"math_domains": len(mdoms), "prefixes_proposed": len(props), "prefixes_accepted": len(acc),
                        "pages_added_to_seed": int(sum(int(a.sum()) for a in new_added))})
        rounds.append(rec)
        say(f"round {k}: collected {n_col} (new {rec['new']}), threshold {thr:.3f}"
            + (f", precision {rec['precision']}, recall {rec['recall']}" if has_truth else "")
            + (f"; added {rec.get('pages_added_to_seed', 0)} pages to the seed" if k < p.recall.rounds else ""))
        prev = collected
        if stop:
            say(f"stopping after round {k}: overlap with the previous round {rec['overlap_with_previous']}")
            break
    timings["rounds"] = round(sum(r["train_s"] + r["score_s"] for r in rounds), 2)

    # 4. outputs --------------------------------------------------------------------------------------------
    t = time.perf_counter()
    n_math = sum(int(c.sum()) for c in collected)
    if n_math == 0:
        raise PipelineError("the classifier collected no page in the last round; lower corpus.recall.min_score or raise the budgets")
    parts = mp(write_shard, [
        dict(shard_dir=d, keep=keep[s], collected=collected[s], scores=scores[s], first_round=first_round[s],
             math_file=str(work / f"math-{s}.jsonl"), general_file=str(work / f"general-{s}.jsonl"))
        for s, d in enumerate(dirs)])
    for name, prefix in (("math_corpus.jsonl", "math"), ("general.jsonl", "general")):
        with open(out / name, "wb") as fo:
            for s in range(len(dirs)):
                with open(work / f"{prefix}-{s}.jsonl", "rb") as fi:
                    shutil.copyfileobj(fi, fo)
    shutil.copyfile(model_path, out / "classifier.bin")
    problems_removed = {}
    for split in ("sft", "rl"):
        rows = read_jsonl(Path(p.problems_dir) / f"{split}.jsonl")
        res = decontaminate(rows, index, text=lambda r: f"{r.get('question', '')}\n{r.get('cot', '')}")
        write_jsonl(out / "problems" / f"{split}.jsonl", res.kept)
        problems_removed[split] = {"in": len(rows), "removed": len(res.removed), "by_benchmark": res.counts(),
                                   "samples": [{"id": r.get("id"), "benchmark": b, "item": i} for r, b, i in res.removed[:5]]}
    decon = {"ngram": p.decontam.ngram, "crawl": report.to_dict(index.sizes), "problems": problems_removed}
    if has_truth:
        decon["crawl_vs_truth"] = {
            "planted_pages": truth["planted"], "planted_removed": truth["planted_removed"],
            "planted_recall": round(truth["planted_removed"] / max(1, truth["planted"]), 4),
            "clean_pages_removed": truth["clean_removed"],
        }
    write_json(out / "reports" / "decontamination.json", decon)
    write_json(out / "reports" / "dedup.json", dedup_report)
    # the cached output holds no timings (same inputs, same bytes); they are in the metrics' rounds
    write_json(out / "reports" / "rounds.json", [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rounds])
    tsv_cols = ["round", "collected", "new", "overlap_with_previous", "precision", "recall", "f1"]
    write_text(paths.plots_dir("corpus") / "rounds.tsv", "\t".join(tsv_cols) + "\n" + "".join(
        "\t".join("" if r.get(c) is None else str(r.get(c)) for c in tsv_cols) + "\n" for r in rounds))
    timings["write"] = round(time.perf_counter() - t, 2)

    metrics: dict[str, Any] = {
        "pages_in": pages_in, "skipped": dict(skipped), "seed_pages": n_seed,
        "contaminated_removed": dict(report.removed), "duplicates_removed": dict(dup_kind), "candidates": n_candidates,
        "rounds_run": len(rounds), "math_pages": n_math, "math_tokens": int(sum(x[2] for x in parts)),
        "general_pages": int(sum(x[1] for x in parts)),
        "problems_removed": {s: v["removed"] for s, v in problems_removed.items()},
        "rounds": [{k_: v for k_, v in r.items() if k_ not in ("heldout_classifier",)} for r in rounds],
    }
    if has_truth:
        last, first = rounds[-1], rounds[0]
        metrics["final"] = {"precision": last["precision"], "recall": last["recall"], "f1": last["f1"],
                            "round1_recall": first["recall"],
                            "recall_gain_points": round(100 * (last["recall"] - first["recall"]), 1),
                            "heldout_classifier_f1": last["heldout_classifier"]["f1"]}
        metrics["decontam_vs_truth"] = decon["crawl_vs_truth"]
        metrics["dedup_vs_truth"] = dedup_report["vs_truth"]
    return metrics


def _dedup_truth(meta: list[dict[str, list[Any]]], dup_of: dict[str, str]) -> dict[str, Any]:
    """Score dedup against the generator's ``near_dup_of`` pairs (among pages that survived decontamination)."""
    present = {i for m in meta for i in m["id"]}
    pairs = [(i, o) for m in meta for i, o in zip(m["id"], m["near_dup_of"], strict=True) if o is not None and o in present]
    in_pair = {x for pr in pairs for x in pr}
    found = sum(1 for i, o in pairs if i in dup_of or o in dup_of)
    false = sum(1 for i in dup_of if i not in in_pair)
    return {"true_pairs": len(pairs), "pairs_found": found, "pair_recall": round(found / max(1, len(pairs)), 4),
            "removed_without_true_duplicate": false}

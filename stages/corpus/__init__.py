"""The ``corpus`` stage: DeepSeekMath's math-corpus pipeline (paper section 2.1) on a crawl on disk.

Every step is a set of tasks (:mod:`.tasks`: one per shard, per bucket partition or per domain partition)
mapped by a :data:`MapFn` (sequential by default; Prefect tasks on threads, Dask or Ray in flows/corpus.py);
the driver only plans shards, adds up small per-task counts and picks thresholds. Page data and per-page
state live in files under a working directory that every worker can reach.

1. Build the benchmark n-gram index once (a task; pickled for the others); normalise the seed corpus
   (one task per seed shard).
2. Shards: read pages (JSONL / Parquet / datasets / WARC / WET, :mod:`.shards`; HTML through
   :mod:`.extract`), apply the language filter, drop pages that copy a benchmark problem
   (:mod:`.decontaminate`), compute URL / exact / MinHash-band bucket entries (:mod:`.dedup`).
3. Dedup as distributed MinHash-LSH: one task per bucket partition (``dedup.partition_size`` entries)
   turns equal keys into verified edges, one task resolves clusters and keeps the first page of each.
4. For each round: each shard draws its negatives (hash of seed, round and page id) and writes them and
   the pages added to the seed; one task trains fastText (:mod:`.classifier`); each shard is scored and
   returns score histograms; the driver picks the threshold for the budgets (:mod:`.recall`); each shard
   collects its pages and writes per-(domain, prefix) counts into domain partitions; one task per domain
   partition finds math-related domains and proposes prefixes (:mod:`.domains`); the accepted prefixes go
   back to the shards, which add their uncollected pages to the seed.
5. Write the last round's pages as the math corpus, the rest as general text (one task per shard, then
   the files are concatenated), the SFT / RL problems decontaminated (one task per split), the last
   classifier, and reports.

Outputs (``data/corpus/``, written atomically): math_corpus.jsonl (id, url, text, score, domain,
round: the first round that collected the page), general.jsonl (id, url, text), problems/{sft,rl}.jsonl,
classifier.bin, reports/ (rounds.json, domains-round<k>.tsv, dedup.json, decontamination.json).
When the crawl carries ground truth (the generated crawl's ``label``, ``near_dup_of``,
``contaminated_by``), the metrics also score every step against it (with tasks too).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, temporary_dir, write_json, write_metrics, write_text
from stages.core.problems import read_rows
from stages.corpus import domains as dom
from stages.corpus import tasks
from stages.corpus.decontaminate import Report
from stages.corpus.dedup import lsh_params, partition_bounds
from stages.corpus.recall import budget_for_round, overlap, select_threshold
from stages.corpus.shards import ReadOptions, plan_shards
from stages.schema.corpus import CorpusParams

MapFn = Callable[[Callable[..., Any], list[dict[str, Any]]], list[Any]]
"""Runs ``fn(**kwargs)`` for each kwargs dict and returns the results in order (sequential, Prefect tasks, ...)."""


def local_map(fn: Callable[..., Any], items: list[dict[str, Any]]) -> list[Any]:
    """The default :data:`MapFn`: one after the other in this process."""
    return [fn(**kw) for kw in items]


def _check_inputs(p: CorpusParams) -> None:
    for name, value in (("crawl_path", p.crawl_path), ("seed_path", p.seed_path)):
        if "://" not in value and not Path(value).exists():
            raise PipelineError(f"corpus.{name}: {value} not found; run the data stage (dvc repro data) or fix the path")
    for split in ("sft", "rl", "test"):
        f = Path(p.problems_dir) / f"{split}.jsonl"
        if not f.is_file():
            raise PipelineError(f"corpus.problems_dir: {f} not found; run the data stage or fix the path")
    for split in ("sft", "rl"):  # copied (decontaminated) into data/corpus/problems: checked here, where they enter
        read_rows(Path(p.problems_dir) / f"{split}.jsonl", what=f"{split.upper()} problem")
    if not Path(p.decontam.testsets).exists():
        raise PipelineError(f"corpus.decontam.testsets: {p.decontam.testsets} not found; run the testsets stage "
                            "(dvc repro testsets) or fix the path")
    if p.domains.approve != "auto":
        dom.read_approved(p.domains.approve)


def _prf(tp: int, pred: int, true: int) -> dict[str, float]:
    prec = tp / max(1, pred)
    rec = tp / max(1, true)
    return {"precision": round(prec, 4), "recall": round(rec, 4), "f1": round(2 * prec * rec / max(1e-12, prec + rec), 4)}


def _sum(parts: list[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(int(x) for x in np.sum(np.array(parts, dtype=np.int64).reshape(len(parts), -1), axis=0))


def work_root(p: CorpusParams) -> Path:
    """The absolute directory holding the stage's working files (every worker must be able to reach it): inside the
    project or a data root (:func:`stages.core.paths.write_target`); the stage makes a directory of its own in it."""
    return paths.write_target(p.work_dir or str(paths.DATA), "corpus.work_dir")


def run(p: CorpusParams, *, map_fn: MapFn | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build the math corpus into data/corpus/ (atomically) and return the metrics (also written to data/metrics)."""
    t0 = time.perf_counter()
    mp = map_fn or local_map
    say = log or (lambda msg: None)
    _check_inputs(p)
    timings: dict[str, float] = {}
    work_split: dict[str, int] = {}
    with temporary_dir(work_root(p), "corpus-work") as work, atomic_path(paths.CORPUS) as out:
        (out / "reports").mkdir(parents=True)
        metrics = _build(p, mp, say, work, out, timings, work_split)
    timings["total"] = round(time.perf_counter() - t0, 2)
    metrics["timings_s"] = timings
    metrics["wall_s"] = timings["total"]
    metrics["work_split"] = work_split  # how the work was cut into tasks: depends on n_shards / partition_size, not the result
    write_metrics("corpus", metrics, ["math_pages", "math_tokens", "general_pages", "rounds_run", "final.*",
                                        "decontam_vs_truth.planted_recall", "dedup_vs_truth.pair_recall"])
    return metrics


def _abs(path: str | None) -> str | None:
    """An input path as workers see it: URLs unchanged, local paths made absolute."""
    if path is None or "://" in path:
        return path
    return str(Path(path).resolve())


@dataclass
class _Job:
    """What the phases of one build share: the params, the task map (local or a task runner), the log, the work
    and output directories, and the run's timings and work-split figures (filled in as the phases run)."""

    p: CorpusParams
    mp: MapFn
    say: Callable[[str], None]
    work: Path
    out: Path
    timings: dict[str, float]
    work_split: dict[str, int]


def _build(p: CorpusParams, mp: MapFn, say: Callable[[str], None], work: Path, out: Path,
           timings: dict[str, float], work_split: dict[str, int]) -> dict[str, Any]:
    """The corpus in five phases (module docstring): the benchmark index and the seed corpus, the shards read,
    filtered and decontaminated, deduplication, the recall rounds, the outputs; returns the metrics."""
    job = _Job(p, mp, say, work, out, timings, work_split)
    index_file, sizes, seed_files, n_seed = _index_and_seed(job)
    prep = _prepare(job, index_file)
    dup_kind, dedup_report, n_candidates = _dedup(job, prep)
    rounds, model_path = _recall_rounds(job, prep["dirs"], seed_files, n_seed, n_candidates, prep["has_truth"])
    return _write_outputs(job, prep, index_file, sizes, model_path, rounds, dedup_report, dup_kind, n_seed,
                          n_candidates)


def _index_and_seed(job: _Job) -> tuple[str, Any, list[str], int]:
    """0. The benchmark n-gram index and the seed corpus (first: an empty one fails before any work); returns (the
    index file, its sizes, the seed shards' files, seed pages)."""
    p, mp, work = job.p, job.mp, job.work
    index_file = str(work / "index.pkl")
    sizes = mp(tasks.build_index, [dict(index_file=index_file, generated_test=_abs(str(Path(p.problems_dir) / "test.jsonl")),
                                        testsets=_abs(p.decontam.testsets), ngram=p.decontam.ngram,
                                        min_short=p.decontam.min_short, min_overlap=p.decontam.min_overlap)])[0]
    seed_shards = plan_shards(_abs(p.seed_path), p.n_shards)
    seed_files = [str(work / f"seed-{s.index:05d}.txt") for s in seed_shards]
    seeded = mp(tasks.seed_shard, [dict(shard=s, out_file=f) for s, f in zip(seed_shards, seed_files, strict=True)])
    n_seed = sum(n for n, _ in seeded)
    if n_seed == 0:
        seed_skipped: Counter[str] = Counter()
        for _, sk in seeded:
            seed_skipped.update(sk)
        raise PipelineError(f"corpus.seed_path: the seed corpus {p.seed_path} has no valid pages (skipped: {dict(seed_skipped)}); "
                            "the classifier needs positives")
    return index_file, sizes, seed_files, n_seed


def _prepare(job: _Job, index_file: str) -> dict[str, Any]:
    """1. The crawl's shards read, filtered, decontaminated, their dedup entries bucketed; returns the shard
    directories, the LSH bands / rows, what was skipped, the decontamination report, the planted truth's counts."""
    p, mp, work = job.p, job.mp, job.work
    t = time.perf_counter()
    shards = plan_shards(_abs(p.crawl_path), p.n_shards)
    job.work_split["shards"] = len(shards)
    dirs = [str(work / f"shard-{s.index:05d}") for s in shards]
    bands, rows = lsh_params(p.dedup.threshold, p.dedup.num_perm)
    read = ReadOptions(extractor=p.html_extractor, languages=tuple(p.languages) if p.languages is not None else None)
    prepared = mp(tasks.prepare_shard, [
        dict(shard=s, shard_dir=d, index_file=index_file, read=read, num_perm=p.dedup.num_perm, shingle=p.dedup.shingle,
             url=p.dedup.url, exact=p.dedup.exact, near=p.dedup.near, bands=bands, rows=rows,
             prefix_depth=p.domains.prefix_depth, samples=p.decontam.samples)
        for s, d in zip(shards, dirs, strict=True)])
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
    n_rows = sum(r["kept"] for r in prepared)
    has_truth = n_rows > 0 and sum(r["labelled"] for r in prepared) == n_rows
    job.say(f"read {pages_in} pages in {len(shards)} shards; {sum(report.removed.values())} contaminated, skipped {dict(skipped)}")
    job.timings["prepare"] = round(time.perf_counter() - t, 2)
    return {"dirs": dirs, "bands": bands, "rows": rows, "skipped": skipped, "report": report, "truth": truth,
            "pages_in": pages_in, "has_truth": has_truth, "entries": sum(r["entries"] for r in prepared)}


def _dedup(job: _Job, prep: dict[str, Any]) -> tuple[Any, dict[str, Any], int]:
    """2. Deduplication: bucket partitions -> edges -> clusters (against the planted duplicates when labelled);
    returns (what was removed, by kind; the dedup report; the candidate pages left)."""
    p, mp, work, dirs, has_truth = job.p, job.mp, job.work, prep["dirs"], prep["has_truth"]
    t = time.perf_counter()
    entries = prep["entries"]
    n_parts = max(1, -(-entries // p.dedup.partition_size))
    (work / "dedup").mkdir()
    entry_files = [str(Path(d) / "entries.npy") for d in dirs]
    sig_files = [str(Path(d) / "sig.npy") for d in dirs]
    edge_files = [str(work / "dedup" / f"edges-{q:05d}.npy") for q in range(n_parts)]
    n_edges = mp(tasks.dedup_partition, [
        dict(entry_files=entry_files, sig_files=sig_files, lo=lo, hi=hi, threshold=p.dedup.threshold, out_file=f)
        for (lo, hi), f in zip(partition_bounds(n_parts), edge_files, strict=True)])
    clusters = mp(tasks.dedup_clusters, [dict(edge_files=edge_files, shard_dirs=dirs, samples=20)])[0]
    dup_kind = clusters["removed"]
    dedup_report: dict[str, Any] = {"removed": dup_kind, "samples": clusters["samples"], "bands": prep["bands"],
                                    "rows": prep["rows"]}
    job.work_split["dedup_partitions"], job.work_split["bucket_entries"], job.work_split["edges"] = \
        n_parts, entries, int(sum(n_edges))
    truth_dir = work / "dedup-truth"
    truth_dir.mkdir()
    n_truth = len(dirs)
    kept = mp(tasks.init_state, [dict(shard_dir=d, truth_dir=str(truth_dir) if has_truth else None, n_truth_parts=n_truth)
                                 for d in dirs])
    if has_truth:
        tr = mp(tasks.dedup_truth_partition, [dict(files=[str(truth_dir / f"part-{q:05d}-{Path(d).name}.npy") for d in dirs])
                                               for q in range(n_truth)])
        pairs, found, false = _sum(tr)
        dedup_report["vs_truth"] = {"true_pairs": pairs, "pairs_found": found, "pair_recall": round(found / max(1, pairs), 4),
                                    "removed_without_true_duplicate": false}
    n_candidates = int(sum(kept))
    job.say(f"dedup removed {dup_kind}; {n_candidates} candidate pages")
    job.timings["dedup"] = round(time.perf_counter() - t, 2)
    if n_candidates == 0:
        raise PipelineError("no crawl page is left after decontamination and deduplication; check corpus.decontam / dedup")
    return dup_kind, dedup_report, n_candidates


def _recall_rounds(job: _Job, dirs: list[str], seed_files: list[str], n_seed: int, n_candidates: int,
                   has_truth: bool) -> tuple[list[dict[str, Any]], str]:
    """3. The recall rounds (paper 2.1): each trains the classifier on the positives so far, scores and collects
    the crawl, and (but the last) discovers math domains whose pages join the positives; returns (the rounds'
    records, the last classifier's file)."""
    p = job.p
    n_eligible, n_discovered, add_files = n_candidates, 0, []
    rounds: list[dict[str, Any]] = []
    model_path = ""
    prev_collected: int | None = None
    for k in range(1, p.recall.rounds + 1):
        tr0 = time.perf_counter()
        model_path, n_p, n_n, n_pos_all = _train_round(job, k, dirs, seed_files, add_files, n_seed + n_discovered,
                                                       n_eligible)
        t_train = time.perf_counter() - tr0
        rec, thr, last = _collect_round(job, k, dirs, model_path, prev_collected, has_truth)
        rec.update(positives=n_p, positives_discovered=n_pos_all - n_seed, negatives=n_n, train_s=round(t_train, 2))
        stop = (p.recall.stop_overlap is not None and prev_collected is not None
                and rec["overlap_with_previous"] >= p.recall.stop_overlap)
        if not last and not stop:
            n_new, n_eligible = _discover_domains(job, k, dirs, rec)
            n_discovered += n_new
        shutil.rmtree(job.work / f"domains-r{k}", ignore_errors=True)
        rounds.append(rec)
        job.say(f"round {k}: collected {rec['collected']} (new {rec['new']}), threshold {thr:.3f}"
                + (f", precision {rec['precision']}, recall {rec['recall']}" if has_truth else "")
                + (f"; added {rec.get('pages_added_to_seed', 0)} pages to the seed" if k < p.recall.rounds else ""))
        prev_collected = rec["collected"]
        if stop:
            job.say(f"stopping after round {k}: overlap with the previous round {rec['overlap_with_previous']}")
            break
    job.timings["rounds"] = round(sum(r["train_s"] + r["score_s"] for r in rounds), 2)
    return rounds, model_path


def _train_round(job: _Job, k: int, dirs: list[str], seed_files: list[str], add_files: list[str], n_pos_all: int,
                 n_eligible: int) -> tuple[str, int, int, int]:
    """Round ``k``'s classifier: positives (the seed and the pages discovered so far, at most ``max_positives``)
    against sampled negatives; ``add_files`` grows by the round's discovered-page files. Returns (the model file,
    positives, negatives used, positives available)."""
    p, mp, work, cp = job.p, job.mp, job.work, job.p.classifier
    n_pos = min(n_pos_all, cp.max_positives)
    rate = min(1.0, cp.negatives_per_positive * n_pos / max(1, n_eligible))
    neg_files = [str(work / f"neg-r{k}-{s}.txt") for s in range(len(dirs))]
    round_add = [str(work / f"add-r{k}-{s}.txt") for s in range(len(dirs))]
    mp(tasks.training_texts_shard, [
        dict(shard_dir=d, round_=k, seed=p.seed, rate=rate, uncollected=cp.negatives == "uncollected",
             neg_file=neg_files[s], add_file=round_add[s]) for s, d in enumerate(dirs)])
    add_files += round_add
    model_path = str(work / f"model-r{k}.bin")
    n_p, n_n = mp(tasks.train_round, [dict(
        positive_files=seed_files + add_files, positive_rate=n_pos / max(1, n_pos_all), negative_files=neg_files,
        seed=p.seed, shuffle_seed=p.seed + k, train_txt=str(work / f"train-r{k}.txt"), model_file=model_path,
        dim=cp.dim, lr=cp.lr, word_ngrams=cp.word_ngrams, min_count=cp.min_count, epochs=cp.epochs, bucket=cp.bucket,
        thread=cp.thread)])[0]
    if n_n == 0:
        raise PipelineError(f"round {k}: no crawl page left to sample negatives from; lower corpus.recall.rounds")
    for f in neg_files:
        os.unlink(f)
    return model_path, n_p, n_n, n_pos_all


def _collect_round(job: _Job, k: int, dirs: list[str], model_path: str, prev_collected: int | None,
                   has_truth: bool) -> tuple[dict[str, Any], float, bool]:
    """Round ``k``'s scoring and collection at the threshold the budgets allow; returns (the round's record, the
    threshold, whether it is the last round)."""
    p, mp = job.p, job.mp
    ts = time.perf_counter()
    mp(tasks.score_shard, [dict(shard_dir=d, model_path=model_path, bins=p.recall.bins) for d in dirs])
    hp, ht = mp(tasks.sum_histograms, [dict(shard_dirs=dirs)])[0]
    thr = select_threshold(hp, ht, min_score=p.recall.min_score, max_pages=budget_for_round(p.recall.max_pages, k),
                           max_tokens=budget_for_round(p.recall.max_tokens, k))
    last = k == p.recall.rounds
    domain_dir = job.work / f"domains-r{k}"
    domain_dir.mkdir()
    got = mp(tasks.collect_shard, [dict(shard_dir=d, threshold=thr, round_=k, domain_dir=None if last else str(domain_dir),
                                        n_domain_parts=len(dirs)) for d in dirs])
    n_col = sum(g["collected"] for g in got)
    shared = sum(g["shared"] for g in got)
    rec: dict[str, Any] = {
        "round": k, "positives": None, "positives_discovered": None, "negatives": None,
        "threshold": round(thr, 4), "collected": n_col, "tokens": sum(g["tokens"] for g in got),
        "new": n_col - shared if prev_collected is not None else n_col,
        "overlap_with_previous": round(overlap(n_col, shared), 4) if prev_collected is not None else None,
        "train_s": None, "score_s": round(time.perf_counter() - ts, 2),
    }
    if has_truth:
        rec.update(_prf(*_sum([g["prf"] for g in got])))
        tp, pred, true, held = _sum([g["heldout"] for g in got])
        rec["heldout_classifier"] = {**_prf(tp, pred, true), "pages": held}
    return rec, thr, last


def _discover_domains(job: _Job, k: int, dirs: list[str], rec: dict[str, Any]) -> tuple[int, int]:
    """After round ``k``: the math domains and URL prefixes of its collection, the accepted ones' pages added to the
    positives (their proposals in reports/domains-round<k>.tsv); returns (pages added, pages still eligible)."""
    p, mp = job.p, job.mp
    domain_dir = job.work / f"domains-r{k}"
    parts = mp(tasks.domain_partition, [dict(
        files=[str(domain_dir / f"part-{q:05d}-{Path(d).name}.json") for d in dirs],
        domain_fraction=p.domains.domain_fraction,
        min_domain_pages=p.domains.min_domain_pages, prefix_fraction=p.domains.prefix_fraction,
        min_prefix_pages=p.domains.min_prefix_pages) for q in range(len(dirs))])
    mdoms = sorted(d_ for m, _ in parts for d_ in m)
    props = sorted((x for _, pr in parts for x in pr), key=lambda x: (x.domain, x.prefix))
    acc = dom.accept(props, mdoms, p.domains.approve)
    dom.write_proposals(job.out / "reports" / f"domains-round{k}.tsv", props, acc)
    added = mp(tasks.add_shard, [dict(shard_dir=d, accepted=acc, uncollected=p.classifier.negatives == "uncollected")
                                 for d in dirs])
    n_new = sum(a for a, _ in added)
    rec.update({"math_domains": len(mdoms), "prefixes_proposed": len(props), "prefixes_accepted": len(acc),
                "pages_added_to_seed": n_new})
    return n_new, sum(e for _, e in added)


def _write_outputs(job: _Job, prep: dict[str, Any], index_file: str, sizes: Any, model_path: str,
                   rounds: list[dict[str, Any]], dedup_report: dict[str, Any], dup_kind: Any, n_seed: int,
                   n_candidates: int) -> dict[str, Any]:
    """4. The outputs: the math and general corpora, the classifier, the decontaminated problems, the reports and
    the rounds' plot table; returns the stage's metrics."""
    p, mp, work, out, dirs = job.p, job.mp, job.work, job.out, prep["dirs"]
    has_truth, truth, report = prep["has_truth"], prep["truth"], prep["report"]
    t = time.perf_counter()
    n_math = rounds[-1]["collected"]
    if n_math == 0:
        raise PipelineError("the classifier collected no page in the last round; lower corpus.recall.min_score or raise the budgets")
    parts = mp(tasks.write_shard, [dict(shard_dir=d, math_file=str(work / f"math-{s}.jsonl"),
                                        general_file=str(work / f"general-{s}.jsonl")) for s, d in enumerate(dirs)])
    for name, prefix in (("math_corpus.jsonl", "math"), ("general.jsonl", "general")):
        with open(out / name, "wb") as fo:
            for s in range(len(dirs)):
                with open(work / f"{prefix}-{s}.jsonl", "rb") as fi:
                    shutil.copyfileobj(fi, fo)
    shutil.copyfile(model_path, out / "classifier.bin")
    splits = ("sft", "rl")
    (work / "problems").mkdir()
    res = mp(tasks.decontaminate_problems, [dict(src=_abs(str(Path(p.problems_dir) / f"{split}.jsonl")), index_file=index_file,
                                                 out_file=str(work / "problems" / f"{split}.jsonl")) for split in splits])
    problems_removed = dict(zip(splits, res, strict=True))
    shutil.copytree(work / "problems", out / "problems")
    decon = {"ngram": p.decontam.ngram, "min_overlap": p.decontam.min_overlap, "crawl": report.to_dict(sizes),
             "problems": problems_removed}
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
    job.timings["write"] = round(time.perf_counter() - t, 2)
    return _metrics(prep, parts, rounds, problems_removed, decon, dedup_report, dup_kind, n_seed, n_candidates)


def _metrics(prep: dict[str, Any], parts: list[Any], rounds: list[dict[str, Any]], problems_removed: dict[str, Any],
             decon: dict[str, Any], dedup_report: dict[str, Any], dup_kind: Any, n_seed: int,
             n_candidates: int) -> dict[str, Any]:
    """The stage's metrics from the phases' figures (and against the planted truth when the crawl is labelled)."""
    metrics: dict[str, Any] = {
        "pages_in": prep["pages_in"], "skipped": dict(prep["skipped"]), "seed_pages": n_seed,
        "contaminated_removed": dict(prep["report"].removed), "duplicates_removed": dict(dup_kind),
        "candidates": n_candidates, "rounds_run": len(rounds), "math_pages": rounds[-1]["collected"],
        "math_tokens": int(sum(x[2] for x in parts)), "general_pages": int(sum(x[1] for x in parts)),
        "problems_removed": {s: v["removed"] for s, v in problems_removed.items()},
        "rounds": [{k_: v for k_, v in r.items() if k_ not in ("heldout_classifier",)} for r in rounds],
    }
    if prep["has_truth"]:
        last, first = rounds[-1], rounds[0]
        metrics["final"] = {"precision": last["precision"], "recall": last["recall"], "f1": last["f1"],
                            "round1_recall": first["recall"],
                            "recall_gain_points": round(100 * (last["recall"] - first["recall"]), 1),
                            "heldout_classifier_f1": last["heldout_classifier"]["f1"]}
        metrics["decontam_vs_truth"] = decon["crawl_vs_truth"]
        metrics["dedup_vs_truth"] = dedup_report["vs_truth"]
    return metrics

"""Schema of params.yaml's ``corpus`` section: the math corpus (paper section 2.1)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from stages.schema.base import RUNTIME, DataPath, Fraction, NonNegInt, PosFloat, PosInt, Section, Workers


class ClassifierParams(Section):
    """The fastText math classifier (paper 2.1: dim 256, lr 0.1, word n-grams 3, min count 3, 3 epochs)."""

    dim: PosInt = 256
    """Word-vector dimension (paper 2.1: 256)."""
    lr: PosFloat = 0.1
    """Learning rate (paper 2.1: 0.1)."""
    word_ngrams: PosInt = 3
    """Longest word n-gram used as a feature (paper 2.1: 3)."""
    min_count: PosInt = 3
    """Minimum word occurrences to enter the vocabulary (paper 2.1: 3)."""
    epochs: PosInt = 3
    """Training epochs (paper 2.1: 3)."""
    bucket: PosInt = 2_000_000
    """Hash buckets for n-gram features (not in the paper: fastText's default, 2M; <= 200k keeps the model small)."""
    thread: PosInt = 16
    """fastText training threads (not in the paper; 1 makes training deterministic)."""
    max_positives: PosInt = 500_000
    """At most this many positive pages (seed + discovered) per round, sampled at random (paper 2.1: 500k seed pages)."""
    negatives_per_positive: PosFloat = 1.0
    """Random crawl negatives per positive (paper 2.1: 500k Common Crawl negatives for 500k positives = 1.0)."""
    negatives: Literal["random", "uncollected"] = "random"
    """Negatives in rounds >= 2: random crawl pages, or random pages not collected in the previous round (the paper does not say)."""


class RecallParams(Section):
    """Scoring, ranking and selection, iterated over rounds."""

    rounds: Annotated[int, Field(ge=1, le=20)] = 4
    """Rounds of train -> score -> discover domains -> extend the seed (paper 2.1: 4)."""
    min_score: Fraction = 0.0
    """Keep only pages whose P(math) is at least this (0 = no threshold, rank by budget only: the paper 2.1 keeps the
    top-scoring pages by a token budget)."""
    max_pages: list[PosInt] | None = None
    """Page budget per round (the last value repeats for later rounds); null = no page budget."""
    max_tokens: list[PosInt] | None = [40_000_000_000, 120_000_000_000]
    """Token budget per round, tokens counted as ceil(chars / 4) (paper 2.1: 40B in round 1, 120B tokens in the final corpus); null = no token budget."""
    stop_overlap: Fraction | None = 0.98
    """Stop early once this fraction of a round's pages were already collected the round before (paper 2.1: ~98% of round 4 was collected in round 3); null = run every round."""
    bins: Annotated[int, Field(ge=10, le=1_000_000)] = 100_000
    """Score histogram bins used to turn a budget into a threshold across shards (a budget is met to within one bin; ours)."""


class DomainParams(Section):
    """Domain discovery: math-related domains and the URL prefixes whose pages join the seed corpus."""

    domain_fraction: Fraction = 0.1
    """A domain is math-related when more than this fraction of its pages were collected (paper 2.1: 10%)."""
    min_domain_pages: PosInt = 10
    """Domains with fewer crawl pages are never called math-related (not in the paper)."""
    prefix_depth: Annotated[int, Field(ge=1, le=5)] = 1
    """URL path segments forming a prefix (1: /questions/, as the paper 2.1's mathoverflow.net/questions)."""
    prefix_fraction: Fraction = 0.5
    """A prefix of a math-related domain is proposed when at least this fraction of its pages were collected (not in
    the paper: it has humans annotate the URLs)."""
    min_prefix_pages: PosInt = 10
    """Prefixes with fewer pages are never proposed (not in the paper)."""
    approve: str = "auto"
    """"auto": accept every proposed prefix; else a file listing approved "domain<TAB>/prefix/" lines (the paper's human annotation)."""


class DedupParams(Section):
    """URL, exact and MinHash-LSH near-duplicate removal, global across shards (stages/corpus/dedup.py)."""

    url: bool = True
    """Remove pages whose normalised URL (stages/core/text.py normalize_url) an earlier page has (paper 2.1: URL-based dedup first)."""
    exact: bool = True
    """Remove pages whose normalised text is identical to an earlier page's."""
    near: bool = True
    """Remove near-duplicates found by MinHash LSH (the paper's near-dedup method is not stated)."""
    threshold: Fraction = 0.8
    """Estimated Jaccard similarity of word shingles above which two pages are near-duplicates (ours)."""
    num_perm: Annotated[int, Field(ge=16, le=1024)] = 128
    """MinHash permutations (more: finer similarity estimates, more memory)."""
    shingle: Annotated[int, Field(ge=1, le=20)] = 5
    """Words per shingle."""
    partition_size: Annotated[int, Field(ge=1000), RUNTIME] = 2_000_000
    """Bucket entries (24 bytes each; one per page per LSH band, plus its URL and text hash) per dedup partition task:
    bounds each worker's memory; any value gives the same result."""


class DecontamParams(Section):
    """Benchmark decontamination of the crawl and of the SFT / RL problems (stages/corpus/decontaminate.py)."""

    ngram: Annotated[int, Field(ge=3, le=256)] = 10
    """n of the n-gram rule (paper 2.1: 10; the tiny default uses 20 because template-generated problems share
    10-grams by construction)."""
    min_short: Annotated[int, Field(ge=1)] = 3
    """Benchmark questions with at least this many (and fewer than ngram) grams are matched whole (paper 2.1: 3)."""
    min_overlap: Fraction = 0.7
    """A page is removed when it holds this share of the distinct n-grams of one benchmark question or solution;
    0 = one shared n-gram (the paper 2.1's literal rule). Real math: 0.7 (measured, docs/results/corpus.md), the default."""
    testsets: DataPath
    """The benchmarks: the testsets stage's directory (data/testsets: every test set), or one of its files; the
    word problems' test split (problems_dir/test.jsonl) is always one too."""
    samples: NonNegInt = 20
    """Removed pages quoted per benchmark in the decontamination report (ours)."""


class CorpusParams(Section):
    """Section ``corpus``: the math corpus (paper section 2.1): classifier, iterative recall, domains, dedup, decontamination."""

    SECTION = "corpus"

    seed: NonNegInt = 0
    """Seed for negative sampling and fastText."""
    crawl_path: str
    """The crawl: a JSONL / Parquet file, a directory of them, or a datasets save_to_disk directory (rows: id?, url, text)."""
    seed_path: str
    """The seed math corpus (same formats; rows: url, text)."""
    problems_dir: str
    """Directory of the word-problem splits (sft.jsonl, rl.jsonl, test.jsonl); test.jsonl is always a benchmark."""
    n_shards: PosInt = 256
    """Shards the crawl is split into (at least one per file; one per WARC / WET file); every per-page step runs shard
    by shard (ours: 256 for a Common Crawl dump)."""
    html_extractor: Literal["trafilatura", "resiliparse", "none"] = "trafilatura"
    """Main-text extractor for the HTML of WARC responses, after the math pass (stages/corpus/extract.py); none: all visible text."""
    languages: list[str] | None = None
    """Keep only crawl pages whose language (py3langid codes, e.g. [en, zh]) is listed; null: no language filter (the
    paper's corpus is multilingual, mostly English and Chinese)."""
    work_dir: Annotated[str | None, RUNTIME] = None
    """Directory for the stage's working files (every worker must reach it: a shared file system on a cluster); null: data/."""
    task_runner: Annotated[Literal["local", "dask", "ray"], RUNTIME] = "local"
    """Prefect task runner for the shard tasks: local threads, or a Dask / Ray cluster (prefect-dask / prefect-ray)."""
    workers: Annotated[Workers, RUNTIME] = 1
    """Local threads (task_runner local) or local Dask workers; ignored for Ray."""
    address: Annotated[str | None, RUNTIME] = None
    """Address of an existing Dask scheduler or Ray cluster; null = start a local one."""
    max_in_flight: Annotated[PosInt | None, RUNTIME] = 8
    """Tasks of one step the driver keeps submitted at once (a sliding window; each submission holds a serialised
    Prefect context until it finishes), so the driver's memory does not grow with the shard count; at least twice
    the worker count keeps every worker busy; null = every task of the step at once."""
    classifier: ClassifierParams = ClassifierParams()
    """fastText settings."""
    recall: RecallParams = RecallParams()
    """Selection and rounds."""
    domains: DomainParams = DomainParams()
    """Domain discovery."""
    dedup: DedupParams = DedupParams()
    """Deduplication."""
    decontam: DecontamParams
    """Decontamination."""

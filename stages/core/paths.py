"""Where every artifact lives, relative to the project root (the directory holding dvc.yaml).

dvc.yaml lists the same paths as deps/outs; tests/flows/test_dvc_yaml.py checks that they agree.
"""

from __future__ import annotations

import os
from pathlib import Path

from stages.core.errors import PipelineError

DATA = Path("data")

# data stage
GENERATED = DATA / "generated"
CRAWL = GENERATED / "crawl.jsonl"  # web-like pages with ground-truth labels
SEED = GENERATED / "seed.jsonl"  # the OpenWebMath stand-in
PROBLEMS = GENERATED / "problems"  # sft.jsonl, rl.jsonl, test.jsonl

# testsets and ingest stages: evaluation sets and SFT / RL sets as pipeline rows
TESTSETS = DATA / "testsets"  # <name>.jsonl, one per testsets.datasets entry (what evaluate scores)
INGEST = DATA / "ingest"  # sft/<name>.jsonl and rl/<name>.jsonl, one per ingest.datasets entry
REPORTS = DATA / "reports"  # <stage>/<name>.json: what each data set kept and skipped

# corpus stage
CORPUS = DATA / "corpus"
MATH_CORPUS = CORPUS / "math_corpus.jsonl"  # rows: id, url, text, score, domain, round
GENERAL_TEXT = CORPUS / "general.jsonl"  # non-math crawl pages (id, url, text), deduplicated and decontaminated
CORPUS_PROBLEMS = CORPUS / "problems"  # sft.jsonl, rl.jsonl decontaminated against the evaluation sets
CLASSIFIER = CORPUS / "classifier.bin"  # the fastText model of the last round
CORPUS_REPORTS = CORPUS / "reports"  # rounds, domain proposals per round, dedup and decontamination reports

# models, each a Hugging Face directory (or a model_ref.json pointing at one in real mode)
MODELS = DATA / "models"
BASE_MODEL = MODELS / "base"
PRETRAIN_MODEL = MODELS / "pretrain"  # pretrain stage (continual pretraining; sft starts from it)
SFT_MODEL = MODELS / "sft"  # sft stage (GRPO starts from it)
GRPO_MODEL = MODELS / "grpo"  # grpo stage: final policy
SFT_CONTINUED = MODELS / "sft_continued"  # grpo stage: continued-SFT baseline (same steps and questions)
REWARD_MODEL = MODELS / "reward_model"  # reward_model stage: outcome / process RM (+ examples.jsonl replay history)
GRPO_ITERS = MODELS / "grpo_iters"  # grpo stage, iterative RL (Algorithm 1): iter<k>/ policy, rm_iter<k>/ reward model
GRPO_LEDGER = DATA / "ledger" / "grpo"  # grpo stage: the rollout ledger (one Parquet file per step; stages/rl/ledger.py)
RL_PROMPTS = DATA / "corpus" / "problems" / "rl.jsonl"  # corpus stage: the RL questions

# small reports: the headline metrics and plots (git-tracked dvc metrics / plots), every result metric (DVC-cached)
METRICS = DATA / "metrics"  # headline metrics per stage (dvc metrics)
DETAILS = DATA / "details"  # every result metric per stage (the dict the stage returns, timings excepted)
PARAMS = DATA / "params"  # the values each stage ran with, resolved (stages.params.record)
PLOTS = DATA / "plots"
# what a run measured about itself (wall / CPU times, throughputs, peak memory): no DVC output, git-ignored; the
# same inputs give the same bytes everywhere else, and these files say how long that took this time
TIMINGS = DATA / "timings"
DVCLIVE = DATA / "dvclive"  # dvclive's per-step metrics and plots of a run (data/dvclive/grpo), git-tracked

# resumable training state, outside DVC outputs (DVC deletes outputs before re-running a stage)
CHECKPOINTS = Path("checkpoints")

# evaluate stage: one directory of completions per evaluated model (evaluate.models.<name>)
EVAL = DATA / "eval"

# report stage: one self-contained HTML page of the whole run (+ its markdown summary)
REPORT = DATA / "report"
REPORT_HTML = REPORT / "index.html"
REPORT_SUMMARY = REPORT / "summary.md"

# committed results of the benchmark scripts that the report shows when present (benchmarks/SUMMARY.md)
BENCH_RESULTS = Path("benchmarks") / "results"
PARADIGM_RESULT = BENCH_RESULTS / "paradigm.json"  # benchmarks/paradigm.py: Figure 5 (unified paradigm)
PARADIGM_RM_RESULT = BENCH_RESULTS / "paradigm_rm.json"  # benchmarks/paradigm.py with the learned RMs
ITERATIVE_RESULT = BENCH_RESULTS / "iterative_rl.json"  # benchmarks/paradigm.py --iterative-out: Figure 6 (iterative RL)


def problems_file(split: str) -> Path:
    """The JSONL file of one problem split: ``sft``, ``rl`` or ``test``."""
    return PROBLEMS / f"{split}.jsonl"


def testset_file(name: str) -> Path:
    """The rows of test set ``name``: ``data/testsets/<name>.jsonl``."""
    return TESTSETS / f"{name}.jsonl"


def ingest_file(role: str, name: str) -> Path:
    """The rows of ingested data set ``name``: ``data/ingest/<role>/<name>.jsonl`` (role sft or rl)."""
    return INGEST / role / f"{name}.jsonl"


def report_file(stage: str, name: str) -> Path:
    """The report of one data set of the testsets / ingest stage: ``data/reports/<stage>/<name>.json``."""
    return REPORTS / stage / f"{name}.json"


def metrics_file(stage: str) -> Path:
    """The small JSON file of a stage's headline metrics (a dvc ``metrics:`` entry; git-tracked, so DVC experiments
    record it and ``dvc exp show`` displays it)."""
    return METRICS / f"{stage}.json"


def details_file(stage: str) -> Path:
    """The JSON file of every result metric a stage computed (a DVC-cached output: the same bytes for the same inputs,
    so it has no timings; those are in :func:`timings_file`)."""
    return DETAILS / f"{stage}.json"


def timings_file(stage: str) -> Path:
    """The JSON file of what a stage's run measured about itself (wall and CPU times, throughputs, peak memory): no
    DVC output and git-ignored, so a rerun of the same inputs changes nothing that DVC or git tracks."""
    return TIMINGS / f"{stage}.json"


def plots_dir(stage: str) -> Path:
    """The directory of a stage's DVC plots (TSV / JSON curves)."""
    return PLOTS / stage


def eval_dir(model: str) -> Path:
    """The evaluate stage's completions directory for one model: ``data/eval/<model>``."""
    return EVAL / model


DATA_ROOT_ENV = "DSM_DATA_ROOT"
"""Directories (``:``-separated) outside the project where a params file may name paths to write (a scratch or shared
file system for ``corpus.work_dir``, a data disk for hub snapshots): the explicit data roots; none by default."""


def write_target(value: str, key: str) -> Path:
    """The absolute path a params field (``key``) names for the project to write: symlinks followed, it must lie
    inside the project (the working directory: every command runs from the project root) or inside a data root of
    :data:`DATA_ROOT_ENV`; a one-line :class:`PipelineError` naming the key and the fix otherwise (before any work)."""
    target = (Path.cwd() / Path(value).expanduser()).resolve()
    roots = [Path.cwd().resolve(), *(Path(r).expanduser().resolve()
                                     for r in os.environ.get(DATA_ROOT_ENV, "").split(os.pathsep) if r.strip())]
    if any(target.is_relative_to(r) for r in roots):
        return target
    raise PipelineError(f"{key}: {value} is {target}, outside the project ({roots[0]}): give a path inside it, or name "
                        f"its directory in {DATA_ROOT_ENV} (e.g. {DATA_ROOT_ENV}={target.parent}) to allow it")


def replaceable(target: Path, key: str, made_by: str, marker: str) -> None:
    """Raise a one-line :class:`PipelineError` unless writing ``target`` replaces nothing that ``made_by`` did not make:
    it is absent, or a directory holding ``marker`` (the file ``made_by`` writes into every directory it makes)."""
    if not target.exists() and not target.is_symlink():
        return
    if target.is_dir() and not target.is_symlink() and (target / marker).is_file():
        return
    kind = "a directory" if target.is_dir() else "a file"
    raise PipelineError(f"{key}: {target} is {kind} that {made_by} did not make (no {marker} in it), so it is not "
                        "replaced: move it away, or give another path")

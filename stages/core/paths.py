"""Where every artifact lives, relative to the project root (the directory holding dvc.yaml).

dvc.yaml lists the same paths as deps/outs; tests/flows/test_dvc_yaml.py checks that they agree.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path("data")

# data stage
GENERATED = DATA / "generated"
CRAWL = GENERATED / "crawl.jsonl"  # web-like pages with ground-truth labels
SEED = GENERATED / "seed.jsonl"  # the OpenWebMath stand-in
PROBLEMS = GENERATED / "problems"  # sft.jsonl, rl.jsonl, test.jsonl

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
RL_PROMPTS = DATA / "corpus" / "problems" / "rl.jsonl"  # corpus stage: the RL questions

# small, git-committable reports
METRICS = DATA / "metrics"
PLOTS = DATA / "plots"

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
ITERATIVE_RESULT = BENCH_RESULTS / "iterative_rl.json"  # benchmarks/iterative_rl.py: Figure 6 (iterative RL)


def problems_file(split: str) -> Path:
    """The JSONL file of one problem split: ``sft``, ``rl`` or ``test``."""
    return PROBLEMS / f"{split}.jsonl"


def metrics_file(stage: str) -> Path:
    """The small JSON metrics file a stage writes (a dvc ``metrics:`` entry)."""
    return METRICS / f"{stage}.json"


def plots_dir(stage: str) -> Path:
    """The directory of a stage's DVC plots (TSV / JSON curves)."""
    return PLOTS / stage


def eval_dir(model: str) -> Path:
    """The evaluate stage's completions directory for one model: ``data/eval/<model>``."""
    return EVAL / model

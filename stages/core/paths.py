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

# models, each a Hugging Face directory (or a model_ref.json pointing at one in real mode)
MODELS = DATA / "models"
BASE_MODEL = MODELS / "base"

# small, git-committable reports
METRICS = DATA / "metrics"
PLOTS = DATA / "plots"

# resumable training state, outside DVC outputs (DVC deletes outputs before re-running a stage)
CHECKPOINTS = Path("checkpoints")


def problems_file(split: str) -> Path:
    """The JSONL file of one problem split: ``sft``, ``rl`` or ``test``."""
    return PROBLEMS / f"{split}.jsonl"


def metrics_file(stage: str) -> Path:
    """The small JSON metrics file a stage writes (a dvc ``metrics:`` entry)."""
    return METRICS / f"{stage}.json"


def plots_dir(stage: str) -> Path:
    """The directory of a stage's DVC plots (TSV / JSON curves)."""
    return PLOTS / stage

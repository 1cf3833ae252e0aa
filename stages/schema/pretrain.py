"""Schema of params.yaml's ``pretrain`` section: continual pretraining on a text mixture (paper 2.3)."""

from __future__ import annotations

from pydantic import field_validator

from stages.schema.base import Fraction, NonNegInt, PosInt, Section
from stages.schema.train import LauncherParams, TrainLoopParams


class MixtureSource(Section):
    """One source of the pretraining mixture."""

    path: str
    """JSONL file with a "text" field per row (relative to the project root)."""
    ratio: Fraction
    """Share of training tokens drawn from this source (the ratios must sum to 1)."""


PAPER_MIXTURE = [MixtureSource(path="data/corpus/math_corpus.jsonl", ratio=0.56),
                 MixtureSource(path="data/external/algebraic_stack.jsonl", ratio=0.04),
                 MixtureSource(path="data/external/arxiv.jsonl", ratio=0.10),
                 MixtureSource(path="data/external/github_code.jsonl", ratio=0.20),
                 MixtureSource(path="data/external/common_crawl.jsonl", ratio=0.10)]
"""Paper 2.3: 56% DeepSeekMath Corpus, 4% AlgebraicStack, 10% arXiv, 20% GitHub code, 10% Common Crawl text. The math
corpus is the corpus stage's output; the other four are JSONL files with a "text" field that you provide."""


class PretrainParams(Section):
    """Section ``pretrain``: continual pretraining of the base model on a mixture of text sources."""

    SECTION = "pretrain"

    enabled: bool = True
    """false: no continual pretraining; data/models/pretrain passes the base model through (a model_ref.json)."""
    mixture: list[MixtureSource] = PAPER_MIXTURE
    """Sources and token shares; the first one is the math corpus (its first eval_docs rows are held out); default:
    the paper's mixture (:data:`PAPER_MIXTURE`). A list is replaced whole by a params file's."""
    eval_docs: NonNegInt = 2000
    """Rows of the first source held out (never trained on) to measure math-text loss and perplexity (not in the
    paper)."""
    eval_tokens: PosInt = 2_000_000
    """At most this many held-out tokens are scored per evaluation (not in the paper)."""
    train: TrainLoopParams = TrainLoopParams(steps=50_000, micro_batch_size=2, grad_accum=19, seq_len=4096, lr=4.2e-4,
                                             schedule="multistep", warmup_steps=2000, eval_every=1000)
    """The training loop. Paper 2.2.1 / 2.3 (DeepSeekMath-Base 7B): 500B tokens at a batch of 10M tokens, so 50,000
    steps; peak LR 4.2e-4, multistep schedule, 2,000 warm-up steps, AdamW 0.9 / 0.95, weight decay 0.1. 10M tokens a
    step = 2 sequences x 19 accumulation steps x 64 ranks x 4096 tokens (9.96M): the micro-batch, accumulation and
    rank counts are ours (the paper gives the batch); eval_every is not in the paper."""
    launcher: LauncherParams = LauncherParams()
    """How the stage's ranks start: in this process, or under torchrun / the deepspeed launcher (multi-GPU)."""

    @field_validator("mixture")
    @classmethod
    def _check_mixture(cls, v: list[MixtureSource]) -> list[MixtureSource]:
        if not v:
            raise ValueError("give at least one {path, ratio} source")
        total = sum(s.ratio for s in v)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"mixture ratios must sum to 1, they sum to {total:g}")
        paths = [s.path for s in v]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a source is listed twice: {paths}")
        return v

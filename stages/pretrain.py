"""The ``pretrain`` stage: continual pretraining of the base model on a mixture of text sources.

Paper (arXiv 2402.03300 sections 2.2.1 and 2.3; docs/training.md): 500B tokens, 56% math corpus, 4%
AlgebraicStack, 10% arXiv, 20% code, 10% general text; AdamW (0.9, 0.95, wd 0.1); multi-step LR (warm-up
2000 steps, 31.6% of the peak after 80% of the steps, 10% after 90%); 4K context. The tiny default mixes
the corpus stage's math corpus with its general crawl text. The first ``eval_docs`` rows of the first
source (the math corpus) are held out: their loss and perplexity are measured before and after training.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from stages.core import hardware, paths
from stages.core.cli import cli
from stages.core.dist import train_device
from stages.core.io import write_metrics
from stages.schema.pretrain import PretrainParams
from stages.train.checkpoint import run_hash
from stages.train.common import (
    export_model,
    is_main_process,
    load_start_model,
    loop_metrics,
    n_parameters,
    partitioned,
    pass_through,
    write_curves,
)
from stages.train.data import PackedMixture, read_heldout_texts, text_eval_batches
from stages.train.loop import eval_loss, gathered_params, train


def pretrain(p: PretrainParams, *, base_dir: str | Path, out_dir: str | Path, ckpt_root: str | Path,
             plots_dir: str | Path) -> dict[str, Any]:
    """Train the model in ``base_dir`` on ``p.mixture``; save it to ``out_dir``; return metrics (no wall_s)."""
    t = p.train
    model, tok = load_start_model(base_dir, t, "pretrain")
    sources = [(s.path, s.ratio) for s in p.mixture]
    stream = PackedMixture(sources, tok, t.seq_len, t.seed, skip_first_rows=p.eval_docs)
    heldout = text_eval_batches(read_heldout_texts(p.mixture[0].path, p.eval_docs), tok, t.seq_len, p.eval_tokens,
                                t.micro_batch_size)

    def eval_fn(m: Any) -> float:
        return eval_loss(m, heldout, chunk_tokens=t.logprob_chunk_tokens)

    with gathered_params(model, partitioned(model)):
        before = eval_fn(model) if heldout else float("nan")
    rh = run_hash(p.tracked_dump(), [base_dir, *[s.path for s in p.mixture]])
    res = train(model, stream, t, Path(ckpt_root) / rh, eval_fn=eval_fn if heldout else None, desc="pretrain")
    after = res.evals[-1]["eval_loss"] if res.evals else float("nan")
    hw = hardware.record(train_device(), t.precision, res.precision == "bf16")
    metrics: dict[str, Any] = {
        **loop_metrics(res),
        "hardware": hw,
        "n_params": n_parameters(model),
        "heldout_tokens": sum(int((b["labels"] != -100).sum()) for b in heldout),
        "eval_loss_before": round(before, 4),
        "eval_loss_after": round(after, 4),
        "perplexity_before": round(math.exp(before), 2) if math.isfinite(before) else None,
        "perplexity_after": round(math.exp(after), 2) if math.isfinite(after) else None,
        "mixture_tokens": {s.path: n for s, n in zip(p.mixture, stream.tokens_by_source, strict=True)},
        "source_epochs": {s.path: r.epoch for s, r in zip(p.mixture, stream.readers, strict=True)},
    }
    export_model(model, tok, out_dir, res, extra={"stage": "pretrain", "params": p.tracked_dump(), "run_hash": rh, "hardware": hw})
    if is_main_process():
        metrics["plots"] = write_curves("pretrain", Path(plots_dir), res, "pretrain: loss on the mixture")
    return metrics


def run(p: PretrainParams) -> dict[str, Any]:
    """Pretrain data/models/base on the mixture into data/models/pretrain; write data/metrics/pretrain.json."""
    t0 = time.perf_counter()
    if not p.enabled:
        metrics = pass_through("pretrain", paths.BASE_MODEL, paths.PRETRAIN_MODEL, paths.plots_dir("pretrain"))
    else:
        metrics = pretrain(p, base_dir=paths.BASE_MODEL, out_dir=paths.PRETRAIN_MODEL,
                           ckpt_root=paths.CHECKPOINTS / "pretrain", plots_dir=paths.plots_dir("pretrain"))
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    if is_main_process():
        write_metrics("pretrain", metrics, ["enabled", "steps", "world_size", "train_loss_last", "eval_loss_*",
                                             "perplexity_after", "hardware"])
    return metrics


if __name__ == "__main__":
    raise SystemExit(cli(PretrainParams, run))

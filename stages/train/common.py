"""What both training stages share around the loop: loading the start model, checks, outputs, metrics."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from stages.core.dist import init_distributed_env, is_main_process, train_device
from stages.core.errors import PipelineError
from stages.core.modeling import check_compatible, load_model, load_tokenizer, save_model
from stages.schema.base import Section
from stages.schema.train import TrainLoopParams
from stages.train.ds_config import deepspeed_config
from stages.train.loop import TrainResult, full_state_dict, use_bf16
from stages.train.report import plot_curves, write_tsv
from stages.train.update import use_deepspeed


def load_start_model(model_dir: str | os.PathLike[str], t: TrainLoopParams, where: str
                     ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the model and tokenizer training starts from, the weights read directly in the training dtype (bf16
    under DeepSpeed's bf16 mode, else float32) onto this rank's device, partitioned under ZeRO-3 (``zero.Init``),
    with ``t.attn_implementation``; one-line errors when they do not fit each other or ``t.seq_len``."""
    tok = load_tokenizer(model_dir)
    device = train_device()
    bf16 = use_bf16(t.precision, device)
    ds_cfg = deepspeed_config(t, bf16=bf16) if use_deepspeed(t.deepspeed.enabled) else None
    if ds_cfg is not None and t.deepspeed.zero_stage == 3:
        init_distributed_env()  # zero.Init joins the process group while the model is built
    dtype = torch.bfloat16 if ds_cfg is not None and bf16 else torch.float32
    model = load_model(model_dir, dtype=dtype, device=device, attn_implementation=t.attn_implementation,
                       ds_config=ds_cfg)
    check_compatible(model, tok, where)
    if tok.eos_token_id is None:
        raise PipelineError(f"{where}: the tokenizer in {model_dir} has no EOS token; training targets end with EOS")
    n_pos = getattr(model.config, "max_position_embeddings", None)
    if n_pos is not None and t.seq_len > n_pos:
        raise PipelineError(f"{where}.train.seq_len: {t.seq_len} is above the model's context length "
                            f"(max_position_embeddings = {n_pos}); use at most {n_pos}")
    return model, tok


def partitioned(model: torch.nn.Module) -> int:
    """3 when the model's weights are ZeRO-3 partitions (built under ``zero.Init``), else 0: the ``zero_stage`` to
    give :func:`stages.train.loop.gathered_params` for a pass outside the DeepSpeed engine (evaluation before it)."""
    return 3 if any(hasattr(q, "ds_id") for q in model.parameters()) else 0


def n_parameters(model: torch.nn.Module) -> int:
    """Parameter count (of the whole model, also when it is ZeRO-3 partitioned)."""
    return sum(int(getattr(q, "ds_numel", q.numel())) for q in model.parameters())


def export_model(model: PreTrainedModel, tok: PreTrainedTokenizerBase, out_dir: str | os.PathLike[str],
                 res: TrainResult, extra: dict[str, Any]) -> None:
    """Save the trained model as a HF directory (rank 0). Under ZeRO-3 the partitioned weights are gathered
    first and loaded into a fresh copy of the model, which is what gets saved."""
    if res.zero_stage == 3:
        sd = full_state_dict(model, 3)
        if not is_main_process():
            return
        fresh = type(model)(model.config)
        fresh.load_state_dict(sd, strict=False)
        fresh.tie_weights()
        model = fresh
    elif not is_main_process():
        return
    save_model(model.to("cpu"), tok, out_dir, extra=extra)


def write_curves(stage: str, plots_dir: Path, res: TrainResult, title: str) -> list[str]:
    """Loss / LR / grad-norm / throughput TSVs (DVC plots) and a PNG of the loss curve; returns the files."""
    write_tsv(plots_dir / "train.tsv", res.history, ["step", "loss", "lr", "grad_norm", "tokens_per_s", "skipped"])
    write_tsv(plots_dir / "lr.tsv", res.history, ["step", "lr"])
    write_tsv(plots_dir / "eval.tsv", res.evals, ["step", "eval_loss"])
    plot_curves(plots_dir / "loss.png", res.history, res.evals, title, res.best_step)
    return [str(plots_dir / f) for f in ("train.tsv", "lr.tsv", "eval.tsv", "loss.png")]


def loop_metrics(res: TrainResult) -> dict[str, Any]:
    """The metrics every training stage reports about its loop."""
    hist = res.history
    return {
        "steps": res.total_steps,
        "steps_run": res.steps_run,
        "resumed_from_step": res.start_step,
        "skipped_steps": res.skipped_steps,
        "precision": res.precision,
        "world_size": res.world_size,
        "tokens_this_run": res.tokens,
        "tokens_per_s": round(res.tokens_per_s, 1),
        "train_wall_s": round(res.train_wall_s, 2),
        "eval_wall_s": round(res.eval_wall_s, 2),
        "checkpoint_wall_s": round(res.checkpoint_wall_s, 2),
        "train_loss_first": _r(hist[0]["loss"]) if hist else None,
        "train_loss_last": _r(hist[-1]["loss"]) if hist else None,
        "run_dir": res.run_dir,
    }


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


def cli(section: type[Section], run: Callable[[Any], dict[str, Any]]) -> int:
    """``python -m stages.<stage> --params FILE``: the entry for ``deepspeed`` / ``torchrun`` launches (every
    rank runs the stage; rank 0 writes the outputs). The single-process entry stays ``python -m flows.<stage>``.
    The whole file is validated first (stages/params.py: validation only), then ``section`` is loaded."""
    from stages.params import load_params

    stage = section.SECTION
    assert stage is not None
    ap = argparse.ArgumentParser(prog=f"python -m stages.{stage}")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    args = ap.parse_args()
    try:
        load_params(args.params)
        metrics = run(section.from_file(args.params))
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if is_main_process():
        print(metrics)
    return 0

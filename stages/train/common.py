"""What both training stages share around the loop: loading the start model, checks, outputs, metrics."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from stages.core import threads
from stages.core.dist import init_distributed_env, is_main_process, train_device
from stages.core.errors import PipelineError
from stages.core.modeling import check_compatible, load_model, load_tokenizer, save_model
from stages.core.plots import write_table
from stages.schema.train import TrainLoopParams
from stages.train.ds_config import deepspeed_config
from stages.train.loop import TrainResult, full_state_dict
from stages.train.report import plot_curves
from stages.train.update import use_bf16, use_deepspeed


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


def pass_through(stage: str, in_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], plots_dir: Path
                 ) -> dict[str, Any]:
    """A disabled training stage (``enabled: false``): ``out_dir`` becomes a ``model_ref.json`` pointing at
    ``in_dir`` (every loader follows it to the model it refers to, with its prompt format), the plots are
    written empty (their dvc outputs exist); returns the stage's metrics."""
    from stages.core.io import atomic_path
    from stages.core.modeling import MODEL_REF, resolve_model

    resolve_model(in_dir)  # one-line error when the input model is missing
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        (tmp / MODEL_REF).write_text(json.dumps({"path": str(in_dir), "stage": stage, "enabled": False}) + "\n")
    empty = TrainResult(total_steps=0, start_step=0, steps_run=0, skipped_steps=0, tokens=0, target_tokens=0,
                        train_wall_s=0.0, precision="none")
    write_curves(stage, plots_dir, empty, f"{stage}: disabled (enabled: false)")
    return {"enabled": False, "passes_through": str(in_dir)}


def write_curves(stage: str, plots_dir: Path, res: TrainResult, title: str) -> list[str]:
    """Loss / LR / grad-norm TSVs (DVC plots) and a PNG of the loss curve; returns the files. The throughput per
    logged step goes to ``data/timings/<stage>/steps.tsv`` (no DVC output: the plots are the same bytes for the same
    inputs)."""
    from stages.core import paths

    write_table(plots_dir / "train.tsv", res.history, ["step", "loss", "lr", "grad_norm", "skipped"])
    write_table(paths.TIMINGS / stage / "steps.tsv", res.history, ["step", "tokens_per_s"])
    write_table(plots_dir / "lr.tsv", res.history, ["step", "lr"])
    write_table(plots_dir / "eval.tsv", res.evals, ["step", "eval_loss"])
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
        "tokens": res.total_tokens,
        "tokens_this_run": res.tokens,
        "tokens_per_s": round(res.tokens_per_s, 1),
        "train_wall_s": round(res.train_wall_s, 2),
        "eval_wall_s": round(res.eval_wall_s, 2),
        "checkpoint_wall_s": round(res.checkpoint_wall_s, 2),
        "train_loss_first": _r(hist[0]["loss"]) if hist else None,
        "train_loss_last": _r(hist[-1]["loss"]) if hist else None,
        "run_dir": res.run_dir,
        "threads": threads.stats(),  # steps at each torch thread count (a timing: data/timings)
    }


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 4)

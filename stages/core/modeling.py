"""Model I/O, written once: every stage loads and saves models here, as Hugging Face directories.

A model directory holds config.json, model.safetensors and the tokenizer files (what each needs:
stages/core/model_files.py). In real mode the base_model stage writes ``model_ref.json`` ({"path": <local
dir or hub id>}) instead of copying a multi-GB checkpoint; :func:`resolve_model` follows it, and
transformers loads (or downloads) it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from stages.core.errors import PipelineError
from stages.core.io import atomic_path
from stages.core.model_files import MODEL_REF, model_dir_problem


def resolve_model(path: str | os.PathLike[str], *, tokenizer: bool = False) -> str:
    """Return what transformers should load for ``path``: the directory itself, or the target of
    its ``model_ref.json`` (followed again when the target holds one). Raises a one-line error when ``path`` is
    not a usable model directory (stages/core/model_files.py: config, weights and, with ``tokenizer``, tokenizer
    files)."""
    check_model_dir(path, tokenizer=tokenizer)
    p = Path(path)
    for _ in range(16):
        ref = p / MODEL_REF
        if not ref.is_file():
            break
        target = json.loads(ref.read_text())["path"]
        if not Path(target).exists():
            return str(target)  # a hub id
        p = Path(target)
    return str(p)


def model_ref_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``model_ref.json`` of ``path`` and of every model directory it points through, merged (nearest wins):
    what a model used in place records beside its path (its prompt format)."""
    out: dict[str, Any] = {}
    p = Path(path)
    for _ in range(16):
        ref = p / MODEL_REF
        if not ref.is_file():
            break
        info = json.loads(ref.read_text())
        out = {**info, **out}
        p = Path(info["path"])
    return out


def check_model_dir(path: str | os.PathLike[str], *, tokenizer: bool = False) -> None:
    """Raise a one-line :class:`PipelineError` unless ``path`` is a usable HF model directory."""
    p = Path(path)
    problem = model_dir_problem(p, tokenizer=tokenizer)
    if problem is None:
        return
    if not p.exists():
        raise PipelineError(f"{p}: model directory not found; run the stage that writes it (dvc repro) or fix the path")
    raise PipelineError(f"{p}: {problem}; point to a complete save_pretrained() directory")


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a model directory (left padding, pad token set)."""
    tok = AutoTokenizer.from_pretrained(resolve_model(path, tokenizer=True))
    style = model_ref_info(path).get("prompt_format")
    if style is not None:  # a checkpoint used in place: its prompt format is recorded in model_ref.json
        tok.init_kwargs["pipeline_prompt_format"] = style
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, **kwargs: Any) -> PreTrainedModel:
    """Load a causal LM from a model directory with AutoModelForCausalLM."""
    try:
        return AutoModelForCausalLM.from_pretrained(resolve_model(path), dtype=dtype, **kwargs)
    except (OSError, ValueError) as e:
        raise PipelineError(f"{path}: cannot load model ({str(e).splitlines()[0]})") from None


def check_compatible(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Raise a one-line error when tokenizer ids do not fit the model's embedding table."""
    n_emb = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > n_emb:
        raise PipelineError(
            f"{where}: tokenizer has {len(tokenizer)} tokens but the model embeds only {n_emb}; "
            "use the tokenizer saved with this model"
        )


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike[str],
               extra: dict[str, Any] | None = None) -> None:
    """Save model (safetensors) and tokenizer to ``path`` atomically; ``extra`` goes to pipeline.json."""
    with atomic_path(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if extra is not None:
            (tmp / "pipeline.json").write_text(json.dumps(extra, indent=2) + "\n")

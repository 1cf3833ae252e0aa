"""What a usable Hugging Face model directory holds, checked without loading it (no torch import: milliseconds).

A model directory needs config.json (a JSON object with ``model_type``), weights (``model.safetensors``,
``pytorch_model.bin``, or a sharded ``*.index.json`` whose shards are all present) and a tokenizer
(``tokenizer.json``, ``tokenizer.model`` or ``vocab.json`` + ``merges.txt``). A directory may instead hold
``model_ref.json`` (``{"path": <local dir or hub id>}``, written by the base_model stage in real mode); its
target is checked in turn when it is a local directory. Used by stages/core/modeling.py when a stage loads a
model, and by stages/preflight.py before any stage runs, so both give the same one-line reasons.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODEL_REF = "model_ref.json"
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def model_dir_problem(path: str | os.PathLike[str], *, tokenizer: bool = True) -> str | None:
    """Why ``path`` is not a usable model directory (a phrase such as ``has no weights (...)``), or None.
    ``tokenizer``: require tokenizer files too (a reward model saved without one is loaded with another's)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_dir():
        return "does not exist" if not p.exists() else "is not a directory"
    ref = p / MODEL_REF
    if ref.is_file():
        try:
            target = json.loads(ref.read_text(encoding="utf-8"))["path"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"has an unreadable {MODEL_REF} (expected {{\"path\": ...}}); re-run the stage that wrote it"
        if Path(os.path.expanduser(str(target))).exists():
            inner = model_dir_problem(target, tokenizer=tokenizer)
            return None if inner is None else f"points at {target}, which {inner}"
        return None  # a hub id: transformers resolves it when the stage loads it
    cfg = p / "config.json"
    if not cfg.is_file():
        return "has no config.json (not a save_pretrained() directory)"
    try:
        conf = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "has a config.json that is not valid JSON"
    if not isinstance(conf, dict) or "model_type" not in conf:
        return "has a config.json without model_type (not a transformers model config)"
    if not any((p / w).is_file() for w in _WEIGHTS):
        index = next((p / i for i in _INDEXES if (p / i).is_file()), None)
        if index is None:
            return f"has no weights ({' or '.join(_WEIGHTS)}, or a sharded *.index.json)"
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return f"has an unreadable {index.name}"
        missing = sorted(s for s in shards if not (p / s).is_file())
        if missing:
            return f"lacks weight shard(s) {missing[:3]} listed in {index.name}"
    if tokenizer and not ((p / "tokenizer.json").is_file() or (p / "tokenizer.model").is_file()
                          or ((p / "vocab.json").is_file() and (p / "merges.txt").is_file())):
        return "has no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt)"
    return None


def context_length(path: str | os.PathLike[str]) -> int | None:
    """``max_position_embeddings`` of a local model directory's config (following model_ref.json), or None."""
    p = Path(os.path.expanduser(str(path)))
    try:
        if (p / MODEL_REF).is_file():
            target = json.loads((p / MODEL_REF).read_text(encoding="utf-8"))["path"]
            return context_length(target) if Path(os.path.expanduser(str(target))).exists() else None
        conf = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    n = conf.get("max_position_embeddings") if isinstance(conf, dict) else None
    return int(n) if isinstance(n, int) else None

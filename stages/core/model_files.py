"""What a usable Hugging Face model directory holds, checked without loading it (no torch import: milliseconds).

A model directory needs config.json (a JSON object with ``model_type``), weights (``model.safetensors``,
``pytorch_model.bin``, or a sharded ``*.index.json`` whose shards are all present) and a tokenizer
(``tokenizer.json``, ``tokenizer.model`` or ``vocab.json`` + ``merges.txt``). The weights are read as far as their
headers: every safetensors file's header must parse and agree with the file's size (a truncated or overwritten file
is found here, not by a later stage), every tensor's byte range must fit its dtype and shape, every tensor that a
sharded index lists must be in its shard; a ``pytorch_model.bin`` must be a readable zip archive. The tokenizer's
JSON files must parse. (Whether the tensors are the ones the config needs is checked by the base_model stage,
which builds the model's skeleton: stages/base_model.py.) A directory may instead hold
``model_ref.json`` (``{"path": <local dir or hub id>}``, written by the base_model stage in real mode); its
target is checked in turn when it is a local directory. Used by stages/core/modeling.py when a stage loads a
model, and by stages/preflight.py before any stage runs, so both give the same one-line reasons.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

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
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = set(weight_map.values())
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            return f"has an unreadable {index.name}"
        missing = sorted(s for s in shards if not (p / s).is_file())
        if missing:
            return f"lacks weight shard(s) {missing[:3]} listed in {index.name}"
        problem = weights_problem(p, weight_map)
    else:
        problem = weights_problem(p)
    if problem is not None:
        return problem
    if tokenizer and not ((p / "tokenizer.json").is_file() or (p / "tokenizer.model").is_file()
                          or ((p / "vocab.json").is_file() and (p / "merges.txt").is_file())):
        return "has no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt)"
    return tokenizer_problem(p)


# safetensors dtypes and their sizes in bytes (the format's own list; F8 variants are one byte)
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "F4": 0.5, "F6_E2M3": 0.75,
                "F6_E3M2": 0.75, "C64": 8}
_MAX_HEADER = 100 << 20  # the safetensors library's own limit


def safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tensors of a safetensors file, ``{name: {"dtype", "shape", "data_offsets"}}``, checked against the file:
    the header parses, each tensor's byte range has the size its dtype and shape need, the ranges tile the data
    that follows the header, and the file ends where the last one does. Raises ValueError saying what is wrong."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise ValueError(f"its header claims {n} bytes, the file has {size} (truncated or not safetensors)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ValueError("its header is not valid JSON (corrupt or not safetensors)") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if not tensors:
        raise ValueError("it holds no tensor")
    data = size - 8 - n
    spans = []
    for name, t in tensors.items():
        try:
            dtype, shape, (b, e) = t["dtype"], t["shape"], t["data_offsets"]
            need = math.prod(int(d) for d in shape) * _DTYPE_BYTES[dtype]
            b, e = int(b), int(e)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r} has a malformed header entry") from None
        if e - b != math.ceil(need) or b < 0:
            raise ValueError(f"tensor {name!r} ({dtype} {shape}) spans {e - b} bytes, needs {math.ceil(need)}")
        spans.append((b, e, name))
    spans.sort()
    end = 0
    for b, e, name in spans:
        if b != end:
            raise ValueError(f"tensor {name!r} starts at byte {b} of the data, expected {end} (overlap or gap)")
        end = e
    if end != data:
        what = "truncated" if end > data else "has trailing bytes"
        raise ValueError(f"{what}: the header's tensors need {end} bytes of data, the file has {data}")
    return tensors


def weights_problem(path: str | os.PathLike[str], weight_map: dict[str, str] | None = None) -> str | None:
    """Why the weight files of model directory ``path`` are unusable (headers checked against the files, the tensors
    an index lists present in their shards), or None. ``weight_map``: a sharded index's tensor -> file map."""
    p = Path(path)
    if weight_map is None:
        files = [w for w in _WEIGHTS if (p / w).is_file()][:1]
        wanted: dict[str, list[str]] = {}
    else:
        files = sorted(set(weight_map.values()))
        wanted = {}
        for name, f in weight_map.items():
            wanted.setdefault(f, []).append(name)
    for f in files:
        if f.endswith(".safetensors"):
            try:
                tensors = safetensors_header(p / f)
            except (OSError, ValueError) as e:
                return f"has a corrupt {f}: {e}"
            missing = sorted(set(wanted.get(f, [])) - set(tensors))
            if missing:
                return f"has a {f} that lacks {len(missing)} tensor(s) its index lists ({missing[0]}, ...)"
        elif f.endswith(".bin"):
            try:
                with zipfile.ZipFile(p / f) as z:
                    if not z.namelist():
                        return f"has an empty {f}"
            except (OSError, zipfile.BadZipFile) as e:
                return f"has a corrupt {f} ({e}; truncated, or not a torch.save archive)"
    return None


def tokenizer_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a model directory's tokenizer files are unreadable (a JSON file that does not parse), or None."""
    p = Path(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "special_tokens_map.json"):
        f = p / name
        if not f.is_file():
            continue
        try:
            obj = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return f"has a corrupt {name} ({type(e).__name__}: {str(e)[:80]})"
        if not isinstance(obj, dict) or (name == "tokenizer.json" and "model" not in obj):
            return f"has a {name} that is not a tokenizer file (no 'model' object)"
    sp = p / "tokenizer.model"
    if sp.is_file() and not (p / "tokenizer.json").is_file() and sp.stat().st_size < 16:
        return "has an empty tokenizer.model"
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

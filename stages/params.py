"""Typed schemas for params.yaml: one pydantic model per section, one section per stage.

Rules (tests/test_params.py checks them):
- extra keys are forbidden and every field is required, so the committed params.yaml spells out
  every value (DVC tracks params.yaml values, not schema defaults);
- every field has a docstring (pydantic's ``use_attribute_docstrings``);
- a bad value is reported as one line naming the key and what is expected, before any stage
  does work (see :func:`load_params`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from stages.core.errors import PipelineError


class Section(BaseModel):
    """Base for every params section: frozen, no unknown keys, docstrings as descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# ---------------------------------------------------------------------------------------------
# reusable field types

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _check_model_ref(value: str | None) -> str | None:
    """A local HF model directory (must hold config.json) or a hub id ``org/name``."""
    if value is None:
        return None
    p = Path(os.path.expanduser(value))
    if p.exists():
        if not p.is_dir() or not (p / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face model directory (no config.json in it)")
        return value
    if _HUB_ID.match(value) and not value.startswith((".", "/", "~")):
        return value  # a hub id: resolved (downloaded) by transformers when the stage runs
    raise ValueError(f"model path {value!r} does not exist; give a HF model directory or a hub id org/name")


def _check_existing_file(value: str | None) -> str | None:
    if value is None:
        return None
    if not Path(os.path.expanduser(value)).is_file():
        raise ValueError(f"file {value!r} not found; give an existing file or null")
    return value


ModelRef = Annotated[str | None, AfterValidator(_check_model_ref)]
"""null, a local Hugging Face model directory, or a hub id (``org/name``)."""

ExistingFile = Annotated[str | None, AfterValidator(_check_existing_file)]
"""null or the path of an existing file (relative to the project root)."""

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0.0)]


# ---------------------------------------------------------------------------------------------
# data


class ProblemParams(Section):
    """Generated GSM8K-style word problems (the SFT, RL and held-out test sets)."""

    n_sft: PosInt
    """Problems in the SFT training split."""
    n_rl: PosInt
    """Problems in the RL (GRPO) prompt split."""
    n_test: PosInt
    """Held-out test problems (evaluation only; 500+ keeps the standard error near 2 points)."""
    min_steps: Annotated[int, Field(ge=1, le=4)]
    """Fewest arithmetic steps in a problem."""
    max_steps: Annotated[int, Field(ge=1, le=4)]
    """Most arithmetic steps in a problem (the difficulty knob, with max_value)."""
    max_value: Annotated[int, Field(ge=5, le=10_000)]
    """Largest starting quantity and operand; every intermediate result also stays in [0, max_value * 10]."""


class CrawlParams(Section):
    """The generated web crawl and seed math corpus (stand-ins for Common Crawl and OpenWebMath)."""

    n_pages: PosInt
    """Pages in the crawl (math and non-math, before duplicates are added)."""
    n_seed_pages: PosInt
    """Pages in the seed math corpus."""


class DataParams(Section):
    """Section ``data``: everything the pipeline generates itself, deterministically from ``seed``."""

    seed: NonNegInt
    """Random seed; the same seed and params give byte-identical outputs."""
    problems: ProblemParams
    """Word problems and their CoT / PoT / tool-integrated solutions."""
    crawl: CrawlParams
    """The crawl and the seed corpus."""


# ---------------------------------------------------------------------------------------------
# base_model


class BaseModelParams(Section):
    """Section ``base_model``: the starting model (tiny Llama trained here, or a real checkpoint)."""

    checkpoint: ModelRef
    """null: train a tokenizer and initialise a tiny Llama here; else a HF directory or hub id to start from."""
    seed: NonNegInt
    """Seed for weight initialisation."""
    vocab_size: Annotated[int, Field(ge=300, le=256_000)]
    """Byte-level BPE vocabulary size (tiny mode); digits are always single tokens."""
    tokenizer_texts: PosInt
    """How many texts from the data stage the tokenizer is trained on (tiny mode)."""
    hidden_size: PosInt
    """Model width (tiny mode)."""
    intermediate_size: PosInt
    """MLP width (tiny mode)."""
    num_layers: PosInt
    """Transformer layers (tiny mode)."""
    num_heads: PosInt
    """Attention heads; hidden_size / num_heads must be a head size vLLM's CPU backend supports (32-256, x16)."""
    num_kv_heads: PosInt
    """Key/value heads (grouped-query attention when below num_heads)."""
    max_position_embeddings: PosInt
    """Longest sequence the model accepts."""
    rope_theta: PosFloat
    """RoPE base frequency."""


# ---------------------------------------------------------------------------------------------
# the whole file


class Params(BaseModel):
    """The whole params.yaml: one section per dvc.yaml stage."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    data: DataParams
    """Generated crawl, seed corpus and word problems."""
    base_model: BaseModelParams
    """Tokenizer and initial model."""


def _format_error(source: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "missing":
            parts.append(f"{key}: missing; add it (the committed params.yaml lists every key)")
        elif e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key; remove it or check its spelling")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"{key}: {msg} (got {e.get('input')!r})")
    return f"{source}: " + "; ".join(parts)


def parse_params(raw: Any, source: str = "params") -> Params:
    """Validate an already-loaded mapping; raise a one-line :class:`PipelineError` on bad input."""
    if not isinstance(raw, dict):
        raise PipelineError(f"{source}: expected a mapping of sections (data:, base_model:, ...), got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        raise PipelineError(_format_error(source, e)) from None


def load_params(path: str | os.PathLike[str] = "params.yaml") -> Params:
    """Read and validate a params file (default ``params.yaml`` in the project root)."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: params file not found; run from the project root or pass --params PATH")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise PipelineError(f"{p}:{line} is not valid YAML; fix the syntax") from None
    return parse_params(raw, str(p))

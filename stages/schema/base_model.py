"""Schema of params.yaml's ``base_model`` section: the tokenizer and the initial model."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from stages.schema.base import ModelRef, NonNegInt, PosFloat, PosInt, Section


class BaseModelParams(Section):
    """Section ``base_model``: the starting model (tiny Llama trained here, or a real checkpoint)."""

    SECTION = "base_model"

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

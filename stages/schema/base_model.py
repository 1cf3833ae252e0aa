"""Schema of params.yaml's ``base_model`` section: the tokenizer and the initial model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from stages.schema.base import ModelRef, NonNegInt, PosFloat, PosInt, Section


class BaseModelParams(Section):
    """Section ``base_model``: the starting model (tiny Llama trained here, or a real checkpoint). The tiny model's
    sizes are not the paper's (its model is the checkpoint's): they size a small Llama, ignored with a checkpoint."""

    SECTION = "base_model"

    checkpoint: ModelRef = "deepseek-ai/deepseek-coder-7b-base-v1.5"
    """null: train a tokenizer and initialise a tiny Llama here; else a HF directory or hub id to start from (paper 2.3:
    DeepSeek-Coder-Base-v1.5 7B)."""
    prompt_format: Literal["deepseekmath", "chat_template"] = "deepseekmath"
    """Zero-shot prompt style of every later stage (SFT, RL, RM, evaluation), recorded with the model:
    deepseekmath = ``User: {question}\\n{instruction}\\n\\nAssistant:``; chat_template = the tokenizer's own chat
    template with the same instruction (a checkpoint whose tokenizer has one; stages/core/prompts.py)."""
    seed: NonNegInt = 0
    """Seed for weight initialisation."""
    vocab_size: Annotated[int, Field(ge=300, le=256_000)] = 2048
    """Byte-level BPE vocabulary size (tiny mode); digits are always single tokens."""
    tokenizer_texts: PosInt = 6000
    """How many texts from the data stage the tokenizer is trained on (tiny mode)."""
    hidden_size: PosInt = 256
    """Model width (tiny mode)."""
    intermediate_size: PosInt = 768
    """MLP width (tiny mode)."""
    num_layers: PosInt = 4
    """Transformer layers (tiny mode)."""
    num_heads: PosInt = 4
    """Attention heads; hidden_size / num_heads must be a head size vLLM's CPU backend supports (32-256, x16)."""
    num_kv_heads: PosInt = 4
    """Key/value heads (grouped-query attention when below num_heads)."""
    max_position_embeddings: PosInt = 4096
    """Longest sequence the model accepts (4096: the paper's 4K context)."""
    rope_theta: PosFloat = 10000.0
    """RoPE base frequency."""

    @model_validator(mode="after")
    def _check_heads(self) -> BaseModelParams:
        if self.checkpoint is not None:
            return self  # a real checkpoint brings its own shapes
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads}) and "
                             f"num_heads by num_kv_heads ({self.num_kv_heads})")
        head_dim = self.hidden_size // self.num_heads
        if head_dim % 16 or not 32 <= head_dim <= 256:
            raise ValueError(f"head size hidden_size / num_heads = {head_dim}; use a multiple of 16 in [32, 256] "
                             "(vLLM CPU kernels)")
        return self

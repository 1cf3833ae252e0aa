"""Tiny local HF models for tests of real mode: a non-Llama architecture (Qwen2) whose tokenizer has its own chat
template, as the instruct models real mode starts from (no hub download: everything is built from configs).

- :func:`chat_tokenizer`: the project's byte-level BPE (stages.base_model.train_tokenizer) plus ChatML's
  ``<|im_start|>`` / ``<|im_end|>`` special tokens, ``<|im_end|>`` as EOS and a ChatML chat template. ``style``:
  ``qwen`` (as Qwen2.5-Instruct: no BOS token at all), ``llama3`` (the tokenizer adds BOS and the template writes
  ``{{ bos_token }}`` first, as Llama 3's: doubled unless the prompt format removes one), ``bos_no_template`` (the
  tokenizer adds BOS, the template does not write it).
- :func:`tiny_qwen2`: a random 2-layer Qwen2 (hidden 64, 2 query heads of 32 sharing 1 KV head, q/k/v biases) with
  that tokenizer, saved as a HF directory; head size 32 fits vLLM's CPU kernels.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHATML = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def chat_tokenizer(texts: Iterable[str], vocab_size: int = 700, *, style: str = "qwen") -> Any:
    """A tiny tokenizer with a ChatML chat template (see the module docstring)."""
    from tokenizers import processors

    from stages.base_model import train_tokenizer

    tok = train_tokenizer(texts, vocab_size)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    if style == "qwen":
        tok.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.bos_token = None
    elif style not in ("llama3", "bos_no_template"):
        raise ValueError(f"style {style!r}")
    tok.chat_template = ("{{ bos_token }}" if style == "llama3" else "") + CHATML
    return tok


def tiny_qwen2(texts: Iterable[str], out: Path, *, vocab_size: int = 700, style: str = "qwen", seed: int = 0) -> Path:
    """Save a random tiny Qwen2 with :func:`chat_tokenizer` to ``out``; returns ``out``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stages.core.modeling import save_model

    tok = chat_tokenizer(texts, vocab_size, style=style)
    cfg = Qwen2Config(vocab_size=len(tok) + 16, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True, initializer_range=0.1)
    torch.manual_seed(seed)
    save_model(Qwen2ForCausalLM(cfg), tok, out)
    return out

"""The ``base_model`` stage: the model every later stage starts from.

Tiny mode (``base_model.checkpoint: null``): train a byte-level BPE tokenizer on the data stage's
text, with every digit a token of its own (digit-level numbers help arithmetic), and initialise a
small Llama-style causal LM from params; both are saved as one Hugging Face directory.

Real mode (``checkpoint`` set): write ``model_ref.json`` pointing at the checkpoint (a local HF
directory or a hub id such as ``deepseek-ai/deepseek-coder-7b-base-v1.5``); its own tokenizer is used.

Either way the model records ``prompt_format`` (stages/core/prompts.py): in its tokenizer config (tiny mode) or
in ``model_ref.json``; every later stage builds its prompts in that format.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, iter_jsonl, write_metrics
from stages.core.modeling import MODEL_REF, save_model
from stages.core.problems import read_rows
from stages.core.prompts import record_style
from stages.schema.base_model import BaseModelParams

BOS, EOS, PAD = "<s>", "</s>", "<pad>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer; digits are split into single tokens before BPE.

    The tokenizer adds BOS at the start of each encoded text (as DeepSeekMath's does) and no EOS;
    training code appends EOS to targets itself.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        padding_side="left", clean_up_tokenization_spaces=False,
    )


def init_model(p: BaseModelParams, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A randomly initialised Llama-style causal LM sized by params, matching ``tokenizer`` (the schema checks the
    head shapes when params are loaded)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        max_position_embeddings=p.max_position_embeddings,
        rope_theta=p.rope_theta,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(p.seed)
    return LlamaForCausalLM(config)


def corpus_texts(generated: Path, limit: int) -> Iterator[str]:
    """Texts the tokenizer learns from: SFT problems with their solutions, then crawl and seed pages."""
    def problems() -> Iterator[str]:
        for row in read_rows(generated / "problems" / "sft.jsonl", what="SFT problem"):
            yield "\n".join(str(row[k]) for k in ("question", "cot", "pot", "tir") if isinstance(row.get(k), str))

    def pages(name: str) -> Iterator[str]:
        f = generated / name
        if f.is_file():
            for row in iter_jsonl(f):
                if isinstance(row.get("text"), str) and row["text"]:  # a page without text teaches nothing
                    yield row["text"]

    # interleave so that a small limit still sees every kind of text
    mixed = (t for trio in itertools.zip_longest(problems(), pages("crawl.jsonl"), pages("seed.jsonl")) for t in trio if t)
    return itertools.islice(mixed, limit)


def run(p: BaseModelParams) -> dict[str, Any]:
    """Build the base model directory (tiny mode) or its reference (real mode); return metrics."""
    t0 = time.perf_counter()
    metrics: dict[str, Any]
    if p.checkpoint is not None:
        try:
            config = AutoConfig.from_pretrained(p.checkpoint)
        except (OSError, ValueError) as e:
            raise PipelineError(f"base_model.checkpoint: cannot read a model config from {p.checkpoint!r} ({str(e).splitlines()[0]})") from None
        if p.prompt_format == "chat_template":
            try:
                record_style(AutoTokenizer.from_pretrained(p.checkpoint), p.prompt_format)
            except PipelineError as e:
                raise PipelineError(f"base_model.prompt_format: {e} ({p.checkpoint})") from None
        with atomic_path(paths.BASE_MODEL) as tmp:
            tmp.mkdir()
            (tmp / MODEL_REF).write_text(json.dumps({"path": p.checkpoint, "prompt_format": p.prompt_format}) + "\n")
        metrics = {"mode": "checkpoint", "model_type": config.model_type, "prompt_format": p.prompt_format}
    else:
        tokenizer = train_tokenizer(corpus_texts(paths.GENERATED, p.tokenizer_texts), p.vocab_size)
        try:
            record_style(tokenizer, p.prompt_format)
        except PipelineError as e:
            raise PipelineError(f"base_model.prompt_format: {e} (the tiny tokenizer has none)") from None
        model = init_model(p, tokenizer)
        n_params = sum(t.numel() for t in model.parameters())
        save_model(model, tokenizer, paths.BASE_MODEL, extra={"stage": "base_model", "params": p.tracked_dump()})
        sample = "Tom has 17 apples. 17 + 25 = 42."
        metrics = {
            "mode": "tiny",
            "n_params": n_params,
            "vocab_size": len(tokenizer),
            "sample_tokens": tokenizer.convert_ids_to_tokens(tokenizer(sample)["input_ids"]),
        }
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    write_metrics("base_model", metrics, ["mode", "n_params", "vocab_size", "model_type"])
    return metrics

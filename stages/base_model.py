"""The ``base_model`` stage: the model every later stage starts from.

Tiny mode (``base_model.checkpoint: null``): train a byte-level BPE tokenizer on the data stage's
text, with every digit a token of its own (digit-level numbers help arithmetic), and initialise a
small Llama-style causal LM from params; both are saved as one Hugging Face directory.

Real mode (``checkpoint`` set): write ``model_ref.json`` pointing at the checkpoint (a local HF
directory or a hub id such as ``deepseek-ai/deepseek-coder-7b-base-v1.5``); its own tokenizer is used. A local
checkpoint is checked first, so that no later stage is the one to find it broken: its files (config, tokenizer
files, every weight file's header against its size: stages/core/model_files.py) and its tensors against its config
(:func:`weights_match_config`: every parameter the architecture needs is present with its shape, found by building
the model's skeleton on the meta device, no memory used).

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


def weights_match_config(path: str | Path) -> str | None:
    """Why the tensors of local checkpoint ``path`` are not those its config.json needs (a missing parameter, a
    shape that differs), or None. The architecture's parameters come from ``AutoModelForCausalLM.from_config`` on
    the meta device; tied weights (``tie_word_embeddings``) may be absent; a name may carry or lack the base model
    prefix (``model.``), as transformers accepts. The tensors come from the weight files' headers only."""
    import json as _json

    from transformers import AutoModelForCausalLM

    from stages.core.model_files import safetensors_header

    p = Path(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(_json.loads(index.read_text())["weight_map"].values()))
    elif (p / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        return None  # pytorch_model.bin: transformers reads it (and reports) when a stage loads it
    found: dict[str, list[int]] = {}
    for f in files:
        found.update({k: list(v["shape"]) for k, v in safetensors_header(p / f).items()})
    config = AutoConfig.from_pretrained(p)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    prefix = getattr(model, "base_model_prefix", "") or ""
    tied = {k for k in model.state_dict() if getattr(config, "tie_word_embeddings", False) and k.startswith("lm_head.")}
    missing, wrong = [], []
    for name, tensor in model.state_dict().items():
        alts = [name, name.removeprefix(prefix + "."), f"{prefix}.{name}"]
        hit = next((a for a in alts if a in found), None)
        if hit is None:
            if name not in tied:
                missing.append(name)
        elif found[hit] != list(tensor.shape):
            wrong.append(f"{hit} is {found[hit]}, the config needs {list(tensor.shape)}")
    if missing:
        return f"lacks {len(missing)} tensor(s) its config needs ({', '.join(missing[:2])}{', ...' if len(missing) > 2 else ''})"
    if wrong:
        return f"has tensors of the wrong shape: {wrong[0]}" + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else "")
    return None


def check_checkpoint(path: str) -> None:
    """Raise a one-line PipelineError naming ``base_model.checkpoint`` unless the local checkpoint's files and
    tensors are usable (module docstring); a hub id is left to transformers."""
    from stages.core.model_files import model_dir_problem

    p = Path(path).expanduser()
    if not p.exists():
        return
    problem = model_dir_problem(p) or weights_match_config(p)
    if problem is not None:
        raise PipelineError(f"base_model.checkpoint: {path} {problem}; point it at a complete, intact "
                            "save_pretrained() directory")


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
        check_checkpoint(p.checkpoint)
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
        problem = weights_match_config(paths.BASE_MODEL)  # what was written is what the next stage will read
        if problem is not None:
            raise PipelineError(f"{paths.BASE_MODEL}: the model just saved {problem}; check the disk")
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

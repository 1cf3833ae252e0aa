"""Model I/O, written once: every stage loads and saves models here, as Hugging Face directories.

A model directory holds config.json, model.safetensors and the tokenizer files (what each needs:
stages/core/model_files.py). In real mode the base_model stage writes ``model_ref.json`` ({"path": <local
dir or hub id>}) instead of copying a multi-GB checkpoint; :func:`resolve_model` follows it, and
transformers loads (or downloads) it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from stages.core import flops
from stages.core.errors import PipelineError, cause
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
    """Load the tokenizer of a model directory (left padding, pad token set); files that do not load are a
    one-line error naming the directory."""
    where = resolve_model(path, tokenizer=True)
    try:
        tok = AutoTokenizer.from_pretrained(where)
    except Exception as e:  # noqa: BLE001 - tokenizers / sentencepiece raise many types for corrupt files
        raise PipelineError(f"{where}: cannot load the tokenizer ({cause(e)}); point to a complete "
                            "save_pretrained() directory") from None
    style = model_ref_info(path).get("prompt_format")
    if style is not None:  # a checkpoint used in place: its prompt format is recorded in model_ref.json
        tok.init_kwargs["pipeline_prompt_format"] = style
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def resolve_attn_implementation(name: str | None) -> str | None:
    """transformers' ``attn_implementation`` for a params value: ``auto`` = flash_attention_2 on CUDA when the
    flash-attn package is installed, else sdpa; flash_attention_2 without it (or without CUDA) is a one-line error;
    None leaves transformers' default."""
    if name is None:
        return None
    flash = torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
    if name == "auto":
        return "flash_attention_2" if flash else "sdpa"
    if name == "flash_attention_2" and not flash:
        raise PipelineError("attn_implementation: flash_attention_2 needs a CUDA GPU and the flash-attn package "
                            "(pip install flash-attn); use sdpa or auto")
    return name


@contextlib.contextmanager
def zero3_init(ds_config: dict[str, Any] | None) -> Iterator[None]:
    """Inside: transformers builds models under DeepSpeed's ``zero.Init`` (ZeRO-3: every rank allocates and loads only
    its partition of the weights), when ``ds_config`` is a ZeRO-3 config; a no-op otherwise."""
    if not ds_config or ds_config.get("zero_optimization", {}).get("stage") != 3:
        yield
        return
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    cfg = dict(ds_config)
    cfg.setdefault("train_batch_size", cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
                   * int(os.environ.get("WORLD_SIZE", "1")))
    keep = HfDeepSpeedConfig(cfg)  # transformers reads it through a weak reference while it is alive
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del keep


def load_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
               attn_implementation: str | None = None, ds_config: dict[str, Any] | None = None,
               auto_class: Any = None, **kwargs: Any) -> PreTrainedModel:
    """Load a model from a model directory (AutoModelForCausalLM, or ``auto_class``), its weights read directly in
    ``dtype`` and onto ``device`` (no float32 copy in CPU memory first; CPU when None), with ``attn_implementation``
    (:func:`resolve_attn_implementation`). ``ds_config`` of ZeRO-3: built under ``zero.Init``, partitioned across
    the ranks as it loads (then ``device`` is DeepSpeed's)."""
    kw = dict(kwargs)
    impl = resolve_attn_implementation(attn_implementation)
    if impl is not None:
        kw["attn_implementation"] = impl
    zero3 = bool(ds_config) and ds_config.get("zero_optimization", {}).get("stage") == 3  # type: ignore[union-attr]
    if device is not None and torch.device(device).type != "cpu" and not zero3:
        kw["device_map"] = {"": torch.device(device)}
    cls = auto_class or AutoModelForCausalLM
    try:
        with zero3_init(ds_config):
            return flops.watch(cls.from_pretrained(resolve_model(path), dtype=dtype, **kw))
    except (OSError, ValueError) as e:
        raise PipelineError(f"{path}: cannot load model ({str(e).splitlines()[0]})") from None


def enable_checkpointing(model: Any, on: bool) -> None:
    """Gradient (activation) checkpointing of a transformers model's layers: each layer's activations are recomputed
    in the backward pass instead of kept (non-reentrant, so no input needs requires_grad). A no-op when ``on`` is
    false or the model does not support it."""
    if on and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def embedding_rows(model: Any) -> int:
    """Rows of the input embedding table (the full count under ZeRO-3, whose local tensor is a partition)."""
    w = model.get_input_embeddings().weight
    return int(getattr(w, "ds_shape", w.shape)[0])


def check_compatible(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Raise a one-line error when tokenizer ids do not fit the model's embedding table."""
    n_emb = embedding_rows(model)
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


def frozen_copy(model: Any, device: str | torch.device | None = None) -> Any:
    """A copy of ``model`` with no gradients, in eval mode (RL's reference model pi_ref), on ``device`` (None: the
    model's). The copy is made tensor by tensor on ``device``, so a policy on a GPU is not duplicated there."""
    if device is None:
        ref = copy.deepcopy(model)
    else:
        with torch.device("meta"):
            ref = type(model)(model.config)
        ref.load_state_dict({k: v.detach().to(device, copy=True) for k, v in model.state_dict().items()},
                            assign=True, strict=False)
        for name, buf in model.named_buffers():  # non-persistent buffers too (rotary frequencies)
            owner, _, leaf = name.rpartition(".")
            ref.get_submodule(owner)._buffers[leaf] = buf.detach().to(device, copy=True)
        ref.tie_weights()
    ref.eval()
    for prm in ref.parameters():
        prm.requires_grad_(False)
    return ref


def n_trainable(model: Any) -> int:
    """Parameters of ``model`` that train (``requires_grad``)."""
    return sum(q.numel() for q in model.parameters() if q.requires_grad)


def peak_memory() -> dict[str, float]:
    """This process's peak resident memory (MiB, ``ru_maxrss``) and, on a GPU, torch's peak allocated memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    out = {"peak_rss_mib": round(rss, 1)}
    if torch.cuda.is_available():
        out["peak_cuda_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


@contextlib.contextmanager
def on_device(module: torch.nn.Module | None, device: torch.device, offload: bool) -> Iterator[None]:
    """Inside: ``module`` is on ``device``; after, back in CPU memory when ``offload`` and ``device`` is not the CPU
    (the reference / reward model idle between their scoring passes). A no-op on the CPU or for None."""
    if module is None or device.type == "cpu":
        yield
        return
    module.to(device)
    try:
        yield
    finally:
        if offload:
            module.to("cpu")
            torch.cuda.empty_cache()


def release_memory() -> None:
    """Collect garbage (a finished DeepSpeed engine holds reference cycles) and return cached accelerator memory."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

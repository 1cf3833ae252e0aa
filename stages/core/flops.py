"""Model FLOPs of this process's passes, counted where they run, for each stage's timings (``model_flops`` in
data/timings/<stage>.json): divided by the stage's wall time, its achieved FLOP/s, which benchmarks/stage_mfu.py sets
against the machine's measured matmul peak.

Counted from shapes only (no device sync): every ``nn.Linear`` call of a watched model, ``2 x in x out`` per input row;
the attention of its decoder, ``4 x layers x heads x head_dim`` per (query, key) pair, causal, keys from the KV cache
included; an output head whose log-probs are computed in chunks (stages.core.logprobs) only for the positions it
scores. A pass with autograd on counts 3x its forward (the backward's two products per matmul; PaLM, appendix B,
and stages.plan.train_flops count the same way), recomputation under gradient checkpointing counted again, a frozen
weight's missing weight gradient not subtracted. Not counted: vLLM's engine, elementwise operations."""

from __future__ import annotations

from typing import Any

import torch

counts: dict[str, float] = {"forward": 0.0, "backward": 0.0}
"""FLOPs of this process so far: forward passes (with or without autograd), and the backward passes of the former."""


def add(flops: float) -> None:
    """Count ``flops`` of forward work (and twice that of backward work when autograd records it)."""
    counts["forward"] += flops
    if torch.is_grad_enabled():
        counts["backward"] += 2 * flops


def _linear_hook(mod: torch.nn.Linear, args: tuple[Any, ...]) -> None:
    if not getattr(mod, "_flops_elsewhere", False) and args:
        x = args[0]
        add(2.0 * mod.in_features * mod.out_features * (x.numel() // max(1, x.shape[-1])))


def _decoder_hook(layers_width: int) -> Any:
    def hook(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        if x is None:
            return
        rows, new = int(x.shape[0]), int(x.shape[1])
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        add(4.0 * layers_width * rows * (new * past + new * (new + 1) / 2))

    return hook


def watch(model: Any) -> Any:
    """Count ``model``'s passes from now on (once per model; returns it)."""
    if getattr(model, "_flops_watched", False):
        return model
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(_linear_hook)
    cfg = getattr(model, "config", None)
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is not None and cfg is not None and getattr(cfg, "num_hidden_layers", None):
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        decoder.register_forward_pre_hook(_decoder_hook(int(cfg.num_hidden_layers) * heads * head_dim),
                                          with_kwargs=True)
    model._flops_watched = True
    return model


def record() -> dict[str, float] | None:
    """``{"forward": F, "backward": B, "total": F + B}`` of this process, or None when it counted nothing."""
    if not counts["forward"]:
        return None
    return {k: float(f"{v:.4g}") for k, v in {**counts, "total": counts["forward"] + counts["backward"]}.items()}

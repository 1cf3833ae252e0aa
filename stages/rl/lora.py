"""LoRA for the RL policy (``grpo.lora``; Hu et al. 2021, arXiv 2106.09685): the policy's linear maps W are frozen and
each targeted one learns a low-rank update, W' = W + (alpha / r) B A with A (r, in) and B (out, r), B = 0 at the start
(peft's ``LoraConfig``, injected in place with ``peft.inject_adapter_in_model``: the model object stays the transformers
causal LM, so the driver's forward passes, chunked log-probs and checkpointing work on it unchanged).

What LoRA changes in a run, and nothing else:

- **What trains**: the adapter alone (``requires_grad`` on A and B); AdamW holds moments for it only
  (stages.rl.update.rl_updater), plain or under DeepSpeed ZeRO 0-2.
- **The reference model** pi_ref of the KL is the frozen base: the policy with its adapter disabled
  (:class:`BaseReference`, as TRL's GRPOTrainer does with peft: no second copy of the weights). Iterative RL resets
  pi_ref to the current policy at each iteration (Algorithm 1): :func:`fold` adds the adapter into the base weights
  and starts a new adapter (B = 0), so "adapter disabled" is again the policy the iteration starts from.
- **The sampler** gets merged weights, W + (alpha / r) B A per targeted map under the base model's own names
  (:func:`merged_state_dict`): vLLM receives them through its in-memory weight sync (:class:`MergedWeights` is what
  ``sync_weights`` reads), the hf backend decodes with a plain copy of the architecture refreshed with them. The
  merge is computed, never applied in place: TRL's ``merge_adapter()`` / ``unmerge_adapter()`` adds and subtracts
  the update in the weights' dtype, which in bf16 leaves rounding drift in the frozen base at every sync.
- **The outputs**: the stage's model is the merged plain HF model (loadable by evaluate with no peft), and
  ``adapter/`` beside its files holds the adapter in peft's format (``PeftModel.from_pretrained(base, dir)``).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from stages.core import paths

ADAPTER = "default"
"""peft's adapter name (one adapter per policy)."""
ADAPTER_DIR = "adapter"
"""The adapter's directory inside the saved policy."""


def lora_config(cfg: Any) -> Any:
    """peft's ``LoraConfig`` of the ``grpo.lora`` group ``cfg`` (rank, alpha, dropout, target modules; no bias)."""
    from peft import LoraConfig

    targets = cfg.target_modules[0] if list(cfg.target_modules) == ["all-linear"] else list(cfg.target_modules)
    return LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def attach(model: torch.nn.Module, cfg: Any, seed: int) -> torch.nn.Module:
    """Inject a LoRA adapter of ``cfg`` (the ``grpo.lora`` group) into ``model`` in place and return it, when
    ``cfg.enabled`` (else ``model`` unchanged). A is drawn from a generator seeded by ``seed`` (B = 0, so the policy
    starts equal to the base); the adapter takes the base weights' device and dtype (bf16 under DeepSpeed's bf16 mode,
    whose optimizer keeps the fp32 master copy). Only the adapter trains afterwards. A target naming no module of the
    model is a one-line error."""
    if not cfg.enabled:
        return model
    if has_lora(model):
        raise ValueError("the policy already holds a LoRA adapter")
    from peft import inject_adapter_in_model

    state = torch.random.get_rng_state()
    torch.manual_seed(seed * 7919 + 17)
    try:
        inject_adapter_in_model(lora_config(cfg), model, adapter_name=ADAPTER)
    except ValueError as e:
        from stages.core.errors import PipelineError

        raise PipelineError(f"grpo.lora.target_modules: {str(e).splitlines()[0]}") from None
    finally:
        torch.random.set_rng_state(state)
    for layer in lora_layers(model):
        w = layer.base_layer.weight
        for part in (layer.lora_A[ADAPTER], layer.lora_B[ADAPTER]):
            part.to(device=w.device, dtype=w.dtype)
    return model


def has_lora(model: Any) -> bool:
    """Whether ``model`` (or the module a DeepSpeed engine / view wraps) holds a LoRA adapter."""
    return next(lora_layers(getattr(model, "module", model)), None) is not None


def lora_layers(model: torch.nn.Module) -> Iterator[Any]:
    """The LoRA-wrapped linear maps of ``model`` (peft ``LoraLayer`` modules; none while peft was never imported:
    a run without LoRA does not import it)."""
    if "peft" not in sys.modules:
        return iter(())
    from peft.tuners.lora import LoraLayer

    return (m for m in model.modules() if isinstance(m, LoraLayer))


def _layer_names(model: torch.nn.Module) -> dict[str, Any]:
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights as the plain model's state dict: every targeted map's ``weight`` = W + (alpha / r) B A
    (peft's ``get_delta_weight``, summed in float32 and rounded once to W's dtype), the adapter's own tensors left
    out, ``.base_layer`` dropped from the names; every other tensor as it is (not copied). Detached."""
    layers = _layer_names(model)
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        owner, _, leaf = key.rpartition(".")
        if owner.endswith(".base_layer"):
            name = owner[: -len(".base_layer")]
            if leaf == "weight" and name in layers:
                layer = layers[name]
                with torch.no_grad():
                    delta = layer.get_delta_weight(ADAPTER).float() if ADAPTER in layer.lora_A else 0.0
                    value = (value.float() + delta).to(value.dtype)
            key = f"{name}.{leaf}"
        out[key] = value.detach()
    return out


class _View(torch.nn.Module):
    """A module that stands for the policy without owning it: no parameters or submodules of its own, so moving or
    switching the view (``to``, ``eval``) leaves the policy alone. ``module`` is the policy, as a DeepSpeed engine's
    is, so helpers that look through wrappers (stages.core.logprobs, stages.rl.rollout) find its head and forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "module", model)  # not registered: the policy is not the view's submodule

    @property
    def config(self) -> Any:
        return self.module.config

    @property
    def generation_config(self) -> Any:
        return getattr(self.module, "generation_config", None)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        return self.module.parameters(recurse)


class BaseReference(_View):
    """pi_ref of a LoRA policy: the policy's forward with its adapter disabled, i.e. the frozen base weights."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with adapter_disabled(self.module):
            return self.module(*args, **kwargs)


class MergedWeights(_View):
    """The policy's merged weights as a sampler reads them: ``state_dict()`` is :func:`merged_state_dict`,
    ``save_pretrained(dir)`` writes them as a plain HF model (config and safetensors)."""

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return merged_state_dict(self.module)

    def save_pretrained(self, path: str | os.PathLike[str], **_: Any) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.module.config.save_pretrained(path)
        save_file(
            _untied({k: v.to("cpu").contiguous() for k, v in merged_state_dict(self.module).items()}),
            str(path / "model.safetensors"),
            metadata={"format": "pt"},
        )


def _untied(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors sharing storage kept once (safetensors refuses duplicates; the config's tying restores them)."""
    out, seen = {}, set()
    for k, v in sd.items():
        if v.numel() and v.data_ptr() in seen:
            continue
        seen.add(v.data_ptr())
        out[k] = v
    return out


class adapter_disabled:  # noqa: N801 - a context manager, used as ``with adapter_disabled(model):``
    """Inside: every LoRA layer of ``model`` computes the base map alone (peft's ``enable_adapters(False)``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = list(lora_layers(model))

    def __enter__(self) -> None:
        for layer in self.layers:
            layer.enable_adapters(False)

    def __exit__(self, *exc: Any) -> None:
        for layer in self.layers:
            layer.enable_adapters(True)


def plain_copy(model: torch.nn.Module, *, device: Any = None, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A plain model of ``model``'s architecture holding its merged weights (its own tensors, on ``device`` / in
    ``dtype``, default the policy's), in eval mode, no gradients: the hf sampler of a LoRA policy, and what is
    saved. ``model`` without LoRA: a copy of it."""
    ref = next(model.parameters())
    device = ref.device if device is None else torch.device(device)
    with torch.device("meta"):
        out = type(model)(model.config)
    sd = {
        k: v.to(device=device, dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype, copy=True)
        for k, v in merged_state_dict(model).items()
    }
    out.load_state_dict(sd, assign=True, strict=False)
    for name, buf in model.named_buffers():  # non-persistent buffers too (rotary frequencies)
        if ".lora_" in name:
            continue
        owner, _, leaf = name.replace(".base_layer", "").rpartition(".")
        out.get_submodule(owner)._buffers[leaf] = buf.detach().to(device, copy=True)
    out.tie_weights()
    if getattr(model, "generation_config", None) is not None:
        out.generation_config = copy.deepcopy(model.generation_config)
    out.eval()
    for prm in out.parameters():
        prm.requires_grad_(False)
    return out


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model of ``model``'s architecture on its merged weights without copying the unadapted tensors (they
    are shared with the policy; only each adapted map's merge is new): for no-gradient forward passes, e.g. the
    weight-sync check's trainer side (stages/rl/sync.py)."""
    with torch.device("meta"):
        out = type(model)(model.config)
    out.load_state_dict(merged_state_dict(model), assign=True, strict=False)
    for name, buf in model.named_buffers():
        if ".lora_" not in name:
            owner, _, leaf = name.replace(".base_layer", "").rpartition(".")
            out.get_submodule(owner)._buffers[leaf] = buf
    out.tie_weights()
    return out.eval()


class MergedSampler:
    """A rollout generator of a LoRA policy: ``sync_weights(policy)`` hands the inner generator the policy's merged
    weights (:class:`MergedWeights`); everything else is the inner generator's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.inner.sync_weights(MergedWeights(model))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


def merged_sampler(model: torch.nn.Module, build: Callable[[Any], Any], backend: str, *, bf16: bool) -> Any:
    """The rollout generator ``build(source)`` of ``model``: ``build(model)`` without LoRA; with LoRA, vLLM is built
    from :class:`MergedWeights` (its engine loads them in memory) and hf from a plain merged copy (in bf16 when
    ``bf16``), both wrapped in :class:`MergedSampler` so that every later sync sends merged weights."""
    if not has_lora(model):
        return build(model)
    if backend == "vllm":
        source: Any = MergedWeights(model)
    else:
        source = plain_copy(model, dtype=torch.bfloat16 if bf16 else None)
    return MergedSampler(build(source))


def reference(model: torch.nn.Module) -> BaseReference:
    """pi_ref of a LoRA policy (:class:`BaseReference`)."""
    return BaseReference(model)


def fold(model: torch.nn.Module, seed: int) -> None:
    """Add the adapter into the base weights (W <- W + (alpha / r) B A, in float32, rounded once) and start a new
    adapter (A redrawn from ``seed``, B = 0): the policy is unchanged, and with the adapter disabled it is the policy
    (iterative RL's reference reset)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            for layer in lora_layers(model):
                w = layer.base_layer.weight
                w.copy_((w.float() + layer.get_delta_weight(ADAPTER).float()).to(w.dtype))
                layer.reset_lora_parameters(ADAPTER, True)
    finally:
        torch.random.set_rng_state(state)


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (``base_model.model.<module>.lora_A.weight`` ...)."""
    from peft import get_peft_model_state_dict

    return {
        f"base_model.model.{k}": v.detach().to("cpu").contiguous()
        for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()
    }


def save_adapter(
    model: torch.nn.Module, path: str | os.PathLike[str], base: str, state: dict[str, torch.Tensor] | None = None
) -> None:
    """Write the adapter in peft's format to the directory ``path``: ``adapter_config.json`` (``base`` as
    ``base_model_name_or_path``) and ``adapter_model.safetensors`` (``state``: these tensors, an earlier
    :func:`adapter_state_dict`, instead of the adapter's now); ``PeftModel.from_pretrained(base model, path)`` loads
    it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(model.peft_config[ADAPTER])
    cfg.base_model_name_or_path = str(base)
    cfg.inference_mode = True
    if isinstance(cfg.target_modules, (set, frozenset)):  # peft writes a set in the hash seed's order: sorted instead
        cfg.target_modules = sorted(cfg.target_modules)
    cfg.save_pretrained(str(path))
    save_file(
        adapter_state_dict(model) if state is None else state,
        str(path / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )


def exported(model: torch.nn.Module) -> torch.nn.Module:
    """What is saved as the policy: ``model`` itself without LoRA; else a plain copy with the merged weights on the CPU
    (the policy keeps its adapter)."""
    return plain_copy(model, device="cpu") if has_lora(model) else model


def summary(model: torch.nn.Module, cfg: Any) -> dict[str, Any]:
    """The LoRA facts of a run (for pipeline.json and the stage metrics): rank, alpha, targets, adapted maps,
    adapter and total parameters."""
    layers = list(lora_layers(model))
    n_adapter = sum(
        p.numel() for layer in layers for part in (layer.lora_A, layer.lora_B) for p in part[ADAPTER].parameters()
    )
    return {
        "rank": cfg.rank,
        "alpha": cfg.alpha,
        "dropout": cfg.dropout,
        "target_modules": list(cfg.target_modules),
        "adapted_maps": len(layers),
        "adapter_parameters": n_adapter,
        "total_parameters": sum(p.numel() for p in model.parameters()),
    }


def adapter_base(init: Path, iteration: int) -> str:
    """The base of an adapter trained in ``iteration``: the start model, or (iterative RL folds the adapter into the
    base at each iteration) the policy after the iteration before, data/models/grpo_iters/iter<k-1>."""
    return str(init) if iteration == 1 else str(paths.GRPO_ITERS / f"iter{iteration - 1}")

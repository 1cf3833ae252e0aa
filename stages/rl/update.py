"""The RL stage's use of the one update path (stages/train/update.py): an :class:`Updater` for the policy (and PPO's
value model) from the grpo params, and moving idle models between CPU and GPU memory.

DeepSpeed (ZeRO 0-2; ``grpo.deepspeed``, or a deepspeed / torchrun launch): the config comes from
``stages.train.ds_config.build_deepspeed_config`` (the training stages' builder): micro-batch
``grpo.optim.micro_batch_size``, clipping ``grpo.optim.max_grad_norm``, ZeRO stage / optimizer offload from ``grpo.deepspeed``,
bf16 from ``grpo.compute.precision`` (``auto``: CUDA with bf16, AMX CPUs). The optimizer is torch AdamW. Without DeepSpeed the
update is fp32, or bf16 autocast with fp32 weights when ``grpo.compute.precision`` is ``bf16`` (not ``auto``). Several ranks:
each samples and scores its share of the step's questions (whole groups, so group advantages stay local); the loss
normalisers are summed over ranks and the update pads with dummy passes (stages/rl/step.py). ZeRO-3 is not
supported (the ranks' log-prob passes differ in number, and ZeRO-3 makes every forward a collective).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from stages.core import threads
from stages.core.dist import train_device
from stages.core.modeling import load_model
from stages.train.ds_config import build_deepspeed_config
from stages.train.loop import use_bf16
from stages.train.update import Updater, use_deepspeed


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


def load_policy(path: Any, p: Any) -> Any:
    """A causal LM of the stage (the policy, the baseline's start), its weights read directly in the update's dtype
    (bf16 under DeepSpeed's bf16 mode, else float32) onto this rank's device, with ``compute.attn_implementation``."""
    dev = train_device()
    bf16 = use_deepspeed(p.deepspeed.enabled) and use_bf16(p.compute.precision, dev)
    return load_model(path, dtype=torch.bfloat16 if bf16 else torch.float32, device=dev,
                      attn_implementation=p.compute.attn_implementation)


def rl_updater(model: torch.nn.Module, p: Any, *, lr: float | None = None, weight_decay: float | None = None,
               micro_batch_size: int | None = None, max_grad_norm: float | None = None) -> Updater:
    """The :class:`Updater` of ``model`` from the grpo params ``p``: AdamW at ``lr`` (default ``p.optim.lr``) with
    ``weight_decay`` (default ``p.optim.weight_decay``), clipping at ``max_grad_norm`` (default ``p.optim.max_grad_norm``), DeepSpeed as the module docstring
    says (micro-batch ``micro_batch_size``, default ``p.optim.micro_batch_size``)."""
    ds_cfg = None
    clip = p.optim.max_grad_norm if max_grad_norm is None else max_grad_norm
    if use_deepspeed(p.deepspeed.enabled):
        if p.deepspeed.zero_stage == 3:
            raise ValueError("the grpo stage's update does not support ZeRO-3")
        ds_cfg = build_deepspeed_config(zero_stage=p.deepspeed.zero_stage, offload_optimizer=p.deepspeed.offload_optimizer,
                                        micro_batch_size=micro_batch_size or p.optim.micro_batch_size, grad_accum=1,
                                        max_grad_norm=clip,
                                        bf16=use_bf16(p.compute.precision, train_device()))
    trained = [q for q in model.parameters() if q.requires_grad]  # a LoRA policy: the adapter alone (grpo.lora)
    opt = torch.optim.AdamW(trained, lr=p.optim.lr if lr is None else lr,
                            weight_decay=p.optim.weight_decay if weight_decay is None else weight_decay)
    return Updater(model, optimizer=opt, max_grad_norm=clip, deepspeed=ds_cfg,
                   autocast_bf16=ds_cfg is None and p.compute.precision == "bf16")


def release_memory() -> None:
    """Collect garbage (a finished DeepSpeed engine holds reference cycles) and return cached accelerator memory."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def update_adapts(*updaters: Any) -> bool:
    """Whether RL updates on ``updaters`` (the policy's, a value model's) may follow the machine's load
    (stages.core.threads.training_adapts): plain float32 under MKL's strict mode; their micro-batches vary in shape,
    so bf16 autocast and DeepSpeed hold the thread limit."""
    return all(threads.training_adapts(autocast_bf16=bool(getattr(u, "autocast_bf16", False)), fixed_shape=False,
                                       deepspeed=getattr(u, "engine", None) is not None) for u in updaters)


def as_updater(model: torch.nn.Module, optimizer: Any, p: Any) -> Updater:
    """``optimizer`` as an :class:`Updater` (benchmarks and tests may pass a plain torch optimizer)."""
    if isinstance(optimizer, Updater):
        return optimizer
    return Updater(model, optimizer=optimizer, max_grad_norm=p.optim.max_grad_norm)

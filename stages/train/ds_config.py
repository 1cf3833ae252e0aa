"""DeepSpeed configuration generated from the training params (nothing is hand-written in JSON)."""

from __future__ import annotations

from typing import Any

from stages.schema.train import TrainLoopParams


def deepspeed_config(p: TrainLoopParams, *, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config for :func:`stages.train.loop.train`.

    The optimizer (torch AdamW with the params' betas, eps and decoupled weight decay) and the LR scheduler
    are built by the loop and handed to ``deepspeed.initialize``, so they are identical with and without
    DeepSpeed; the config only sets batch geometry, clipping, precision and ZeRO. ``bf16``: DeepSpeed's
    bf16 mode (bf16 weights and activations, fp32 master weights in the optimizer), which replaces autocast.
    """
    return build_deepspeed_config(zero_stage=p.deepspeed.zero_stage, offload_optimizer=p.deepspeed.offload_optimizer,
                                  micro_batch_size=p.micro_batch_size, grad_accum=p.grad_accum, max_grad_norm=p.max_grad_norm,
                                  bf16=bf16)


def build_deepspeed_config(*, zero_stage: int, offload_optimizer: bool, micro_batch_size: int, grad_accum: int,
                           max_grad_norm: float, bf16: bool) -> dict[str, Any]:
    """The config of :func:`deepspeed_config` from plain values (the grpo stage builds its own from its params)."""
    zero: dict[str, Any] = {"stage": zero_stage}
    if zero_stage > 0:
        zero.update({"contiguous_gradients": True, "overlap_comm": False, "reduce_scatter": True})
        if offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if zero_stage == 3:
        # export: consolidate the partitioned weights into one state dict at save time
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": max_grad_norm,
        "bf16": {"enabled": bf16},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }

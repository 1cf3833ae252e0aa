"""The policy update of the grpo stage: plain PyTorch, or a DeepSpeed engine (ZeRO 0-2) on one or many ranks.

:class:`PolicyUpdater` hides the difference: ``backward(loss, last=)`` per micro-batch, ``step(bad)`` per optimizer
step. The DeepSpeed config comes from ``stages.train.ds_config.build_deepspeed_config`` (the training stages'
builder): micro-batch ``grpo.micro_batch_size``, clipping ``grpo.max_grad_norm``, ZeRO stage / optimizer offload
from ``grpo.deepspeed``, bf16 from ``grpo.precision`` (``auto``: CUDA with bf16, AMX CPUs).
The optimizer is torch AdamW (``grpo.lr``, ``grpo.weight_decay``), handed to ``deepspeed.initialize``.

GRPO accumulates a variable number of micro-batches per optimizer step (outputs whose loss mask is empty are
skipped), so the accumulation boundary is set by hand before every backward instead of DeepSpeed's fixed count;
the losses carry batch-wide normalisers, so DeepSpeed must not divide them again (``scale_wrt_gas=False``).

Several ranks (launched by deepspeed / torchrun): each rank samples and scores its share of the step's questions
(whole groups, so group advantages stay local); the loss normalisers (outputs, tokens) are summed over ranks, and
ranks with fewer micro-batches run zero-loss dummy passes so that every rank calls backward equally often
(ZeRO-2 reduces gradients inside backward). DeepSpeed averages gradients over ranks, so each rank's loss is
multiplied by the world size. ZeRO-3 is not supported (GrpoParams refuses it).

A step with a non-finite loss is skipped: plain PyTorch stops the accumulation and does not step; under DeepSpeed
the rest of the accumulation runs as dummy passes and the step runs at learning rate 0 (as stages.train.loop).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch

from stages.train.ds_config import build_deepspeed_config
from stages.train.loop import init_distributed_env, launched_distributed, use_bf16


def train_device() -> torch.device:
    """This rank's accelerator: cuda:LOCAL_RANK when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Sum (``op="sum"``) or max (``"max"``) of ``values`` over ranks; the values themselves on one process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
            torch.distributed.get_world_size() == 1:
        return list(values)
    dev = train_device() if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return [float(x) for x in t.cpu()]


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


class PolicyUpdater:
    """Backward and optimizer step of the policy (module docstring).

    Args:
        model: the policy (moved to this rank's device).
        lr, weight_decay: AdamW.
        max_grad_norm: gradient-norm clip per optimizer step.
        deepspeed: ``grpo.deepspeed`` (enabled, zero_stage, offload_optimizer); DeepSpeed is also used when
            launched with several processes.
        micro_batch_size: outputs per forward/backward (DeepSpeed's ``train_micro_batch_size_per_gpu``).
        optimizer: an existing torch optimizer to use instead of a new AdamW (plain mode only).
        precision: "auto" | "bf16" | "fp32", DeepSpeed's bf16 mode or not (stages.train.loop.use_bf16); plain: fp32.
    """

    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float, max_grad_norm: float,
                 deepspeed: Any = None, micro_batch_size: int = 1, optimizer: torch.optim.Optimizer | None = None,
                 precision: str = "auto") -> None:
        self.model = model
        self.max_grad_norm = max_grad_norm
        self.engine: Any = None
        self.rank, self.world = 0, 1
        self.device = train_device()
        use_ds = bool(deepspeed is not None and deepspeed.enabled) or launched_distributed()
        self.bf16 = use_ds and use_bf16(precision, self.device)
        model.to(self.device)
        opt = optimizer or torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        if use_ds:
            import deepspeed as ds

            if deepspeed is not None and deepspeed.zero_stage == 3:
                raise ValueError("PolicyUpdater: ZeRO-3 is not supported")
            init_distributed_env()
            ds.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
            self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
            cfg = build_deepspeed_config(zero_stage=deepspeed.zero_stage if deepspeed is not None else 2,
                                         offload_optimizer=bool(deepspeed is not None and deepspeed.offload_optimizer),
                                         micro_batch_size=micro_batch_size, grad_accum=1, grad_clip=max_grad_norm,
                                         bf16=self.bf16)
            self.engine, opt, _, _ = ds.initialize(model=model, optimizer=opt, config=cfg)
            self.device = self.engine.device
        self.optimizer = opt

    @property
    def distributed(self) -> bool:
        """True under DeepSpeed (one or more ranks)."""
        return self.engine is not None

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage in use (0 without DeepSpeed)."""
        return int(self.engine.zero_optimization_stage()) if self.engine is not None else 0

    @property
    def forward_model(self) -> Any:
        """What the training forward calls: the DeepSpeed engine, or the model."""
        return self.engine if self.engine is not None else self.model

    def zero_grad(self) -> None:
        """Clear gradients before an optimizer step's accumulation (plain mode; DeepSpeed clears after its step)."""
        if self.engine is None:
            self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Accumulate the gradient of one micro-batch's loss; ``last``: the step's final micro-batch."""
        if self.engine is None:
            loss.backward()
            return
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * self.world, scale_wrt_gas=False)

    def dummy_backward(self, *, last: bool) -> None:
        """A zero-gradient backward (DeepSpeed only): keeps every rank's number of backward calls equal."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        out = self.engine(input_ids=ids, use_cache=False).logits
        self.backward(out.float().sum() * 0.0, last=last)

    def step(self, bad: bool) -> tuple[float, bool]:
        """End an optimizer step; ``bad``: a micro-batch loss was not finite on this rank. Returns (grad norm,
        whether the weights were updated); a non-finite gradient norm also skips the step (plain mode)."""
        if self.engine is None:
            if bad:
                self.optimizer.zero_grad(set_to_none=True)
                return math.nan, False
            gn = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
            ok = math.isfinite(gn)
            if ok:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return gn, ok
        bad = all_reduce([1.0 if bad else 0.0], "max")[0] > 0
        own_norm = None
        if self.zero_stage == 0:  # DeepSpeed reports no global norm without ZeRO: the module's grads are whole
            grads = [q.grad.detach().float().norm() for q in self.model.parameters() if q.grad is not None]
            own_norm = float(torch.stack(grads).norm()) if grads else 0.0
        saved = [g["lr"] for g in self.optimizer.param_groups]
        if bad:
            for g in self.optimizer.param_groups:
                g["lr"] = 0.0
        self.engine.step()
        for g, lr in zip(self.optimizer.param_groups, saved, strict=True):
            g["lr"] = lr
        gn = self.engine.get_global_grad_norm() if own_norm is None else own_norm
        gn = float(gn) if gn is not None else math.nan
        return (math.nan, False) if bad else (gn, math.isfinite(gn))

    def state_dicts(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(model state, optimizer state) for a plain checkpoint; the optimizer state is None under DeepSpeed
        (its partitioned state is not in a plain checkpoint: a resumed DeepSpeed run restarts the optimizer)."""
        return self.model.state_dict(), (self.optimizer.state_dict() if self.engine is None else None)

"""The one update path of every model that trains: the pretrain / sft loop (stages/train/loop.py), the RL policy and
PPO's value model (stages/rl/update.py), the reward model (stages/rl/rm/train.py) and the continued-SFT baseline
(stages/rl/baseline.py).

:class:`Updater` owns a model's optimizer (and LR schedule, when given) and hides plain PyTorch versus a DeepSpeed
engine (ZeRO 0-3, one or many ranks): a caller runs ``zero_grad()``, then ``backward(loss, last=)`` per micro-batch
(the forward through ``forward_model``), then ``step(bad)`` per optimizer step::

    upd.zero_grad()
    for j, mb in enumerate(micro_batches):
        loss = loss_of(upd.forward_model, mb)            # normalised over the whole optimizer batch
        upd.backward(loss, last=j == len(micro_batches) - 1)
    grad_norm, stepped = upd.step(bad=False)

- The loss of each micro-batch carries the optimizer batch's normaliser, so DeepSpeed must not divide it again
  (``scale_wrt_gas=False``); DeepSpeed averages gradients over ranks, so the loss is multiplied by the world size.
- The accumulation boundary is set by hand before every backward (``last``), so a caller may accumulate a different
  number of micro-batches per step (GRPO skips outputs with an empty loss mask); ranks with fewer micro-batches, or a
  rank whose loss was not finite, run :meth:`dummy_backward` (a zero-gradient pass) so that every rank calls
  backward equally often (ZeRO-2/3 reduce gradients inside backward).
- Non-finite: ``step(bad=True)`` (a micro-batch loss was not finite) or a non-finite gradient norm skips the update:
  plain PyTorch clears the gradients and does not step; DeepSpeed runs its step at learning rate 0. The LR schedule
  advances either way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from stages.core.dist import all_reduce, init_distributed_env, launched_distributed, train_device
from stages.core.hardware import resolve_precision


class Updater:
    """Backward and optimizer step of one model (module docstring).

    Args:
        model: the module to train (moved to this rank's device).
        optimizer: its optimizer (built on ``model``'s parameters); None = AdamW(``lr``, ``weight_decay``).
        max_grad_norm: gradient-norm clip per optimizer step (``inf``: no clip, the norm is still measured).
        scheduler: an LR scheduler stepped once per optimizer step, skipped or not (None: constant LR).
        deepspeed: a DeepSpeed config dict (stages.train.ds_config), or None for plain PyTorch.
        lr, weight_decay: the default optimizer's settings.
        autocast_bf16: plain PyTorch only: forward passes under bf16 autocast (:meth:`autocast`).
    """

    def __init__(self, model: torch.nn.Module, *, max_grad_norm: float, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, deepspeed: dict[str, Any] | None = None, lr: float = 1e-5,
                 weight_decay: float = 0.0, autocast_bf16: bool = False) -> None:
        self.model = model
        self.autocast_bf16 = bool(autocast_bf16) and deepspeed is None  # DeepSpeed's bf16 mode replaces autocast
        self.max_grad_norm = max_grad_norm
        self.engine: Any = None
        self.rank, self.world = 0, 1
        self.bf16 = bool(deepspeed is not None and deepspeed.get("bf16", {}).get("enabled"))
        self.device = train_device()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL collectives and object gathers use the current device
        model.to(self.device)
        opt = optimizer or torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        if deepspeed is not None:
            import deepspeed as ds

            init_distributed_env()
            ds.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
            self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
            self.engine, opt, _, scheduler = ds.initialize(model=model, optimizer=opt, lr_scheduler=scheduler,
                                                           config=deepspeed)
            self.device = self.engine.device
        self.optimizer = opt
        self.scheduler = scheduler
        self._params = [q for q in model.parameters() if q.requires_grad]

    def autocast(self) -> Any:
        """The context the model's forward passes run in: bf16 autocast (fp32 weights and optimizer) when the plain
        updater was built with ``autocast_bf16``, else a no-op."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16)

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

    @property
    def module(self) -> torch.nn.Module:
        """The trained module itself (under DeepSpeed the engine's, partitioned under ZeRO-3)."""
        return self.engine.module if self.engine is not None else self.model

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

    def dummy_backward(self, *, last: bool, forward: Callable[[Any], torch.Tensor] | None = None) -> None:
        """A zero-gradient backward (DeepSpeed only): keeps every rank's number of backward calls equal.
        ``forward(module) -> tensor`` makes the pass (default: a causal LM's logits on two zero tokens)."""
        if forward is None:
            ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
            out = self.engine(input_ids=ids, use_cache=False).logits
        else:
            out = forward(self.engine)
        self.backward(out.float().sum() * 0.0, last=last)

    def _own_norm(self) -> float:
        grads = [q.grad.detach().float().norm() for q in self.model.parameters() if q.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0

    def step(self, bad: bool) -> tuple[float, bool]:
        """End an optimizer step; ``bad``: a micro-batch loss was not finite on this rank. Returns (grad norm, whether
        the weights were updated); a non-finite gradient norm also skips the update."""
        if self.engine is None:
            if bad:
                gn, ok = math.nan, False
            else:
                gn = float(torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm))
                ok = math.isfinite(gn)
                if ok:
                    self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.scheduler is not None:
                self.scheduler.step()
            return gn, ok
        bad = all_reduce([1.0 if bad else 0.0], "max")[0] > 0
        own_norm = self._own_norm() if self.zero_stage == 0 else None  # DeepSpeed reports no norm without ZeRO
        saved = [g["lr"] for g in self.optimizer.param_groups]
        if bad:
            for g in self.optimizer.param_groups:
                g["lr"] = 0.0
        self.engine.step()  # also steps the LR schedule handed to deepspeed.initialize
        if bad and self.scheduler is None:
            for g, lr in zip(self.optimizer.param_groups, saved, strict=True):
                g["lr"] = lr
        gn = self.engine.get_global_grad_norm() if own_norm is None else own_norm
        gn = float(gn) if gn is not None else math.nan
        return (math.nan, False) if bad else (gn, math.isfinite(gn))

    def last_lr(self) -> float:
        """The learning rate of the first parameter group now."""
        return float(self.optimizer.param_groups[0]["lr"])

    def save_state(self, path: str | os.PathLike[str]) -> None:
        """Write the model's weights, the optimizer's and the LR schedule's state into the directory ``path`` (which
        exists and every rank can reach). Plain: ``model.safetensors`` (tied weights once) and ``optimizer.pt``
        ({"optimizer", "scheduler"}). DeepSpeed: the engine's own checkpoint in ``path/ds`` (ZeRO partitions of the
        optimizer state, one file per rank, and the LR schedule); every rank must call it."""
        path = Path(path)
        if self.engine is not None:
            self.engine.save_checkpoint(str(path / DS_DIR), tag=DS_TAG, save_latest=False)
            return
        save_file(untied_state(self.model), str(path / MODEL_FILE))
        torch.save({"optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None},
                   path / OPTIMIZER_FILE)

    def load_state(self, path: str | os.PathLike[str], *, scheduler_state: dict[str, Any] | None = None) -> None:
        """Restore what :meth:`save_state` wrote into ``path`` (weights, optimizer, LR schedule); every rank calls it.
        Raises ``ValueError`` naming what does not load (callers turn it into their one-line checkpoint error)."""
        path = Path(path)
        if self.engine is not None:
            if not (path / DS_DIR).is_dir():
                raise ValueError("DeepSpeed state missing (a checkpoint of a run without DeepSpeed?)")
            loaded, _ = self.engine.load_checkpoint(str(path / DS_DIR), tag=DS_TAG, load_optimizer_states=True,
                                                    load_lr_scheduler_states=True)
            if loaded is None:
                raise ValueError("DeepSpeed state missing")
            return
        if not (path / MODEL_FILE).is_file():
            raise ValueError(f"{MODEL_FILE} missing (a checkpoint of a DeepSpeed run? resume it with DeepSpeed)")
        sd = load_file(str(path / MODEL_FILE))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        tied = {k for k in missing if _is_tied(self.model, k, sd)}
        if unexpected or set(missing) - tied:
            raise ValueError(f"weights do not match the model ({len(set(missing) - tied)} missing, {len(unexpected)} "
                             "unexpected)")
        st = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(st["optimizer"])
        sched = st.get("scheduler") if st.get("scheduler") is not None else scheduler_state
        if self.scheduler is not None and sched is not None:
            self.scheduler.load_state_dict(sched)


MODEL_FILE, OPTIMIZER_FILE, DS_DIR, DS_TAG = "model.safetensors", "optimizer.pt", "ds", "state"
"""The files of :meth:`Updater.save_state`."""


def untied_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as contiguous CPU tensors without duplicates (tied weights once; safetensors refuses them)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in model.state_dict().items():
        if v.numel() and v.data_ptr() in seen:
            continue
        seen.add(v.data_ptr())
        out[k] = v.detach().to("cpu").contiguous()
    return out


def _is_tied(model: torch.nn.Module, key: str, saved: dict[str, torch.Tensor]) -> bool:
    """Whether the missing ``key`` shares its storage with a saved weight (a tied weight, saved once)."""
    sd = model.state_dict()
    ptr = sd[key].data_ptr() if key in sd else None
    return ptr is not None and any(k in saved and sd[k].data_ptr() == ptr for k in sd if k != key)


def use_bf16(precision: str, device: torch.device) -> bool:
    """Whether to train with bf16: ``bf16`` always, ``fp32`` never, ``auto`` where bf16 matmuls are fast
    (CUDA with bf16 support; CPUs with AMX tiles, whose oneDNN kernels run bf16 matmuls on AMX)."""
    return resolve_precision(precision, device) == "bf16"


def use_deepspeed(enabled: bool) -> bool:
    """DeepSpeed is used when the params enable it or when launched with several processes."""
    return bool(enabled) or launched_distributed()


def micro_slices(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``rows`` (a 1-D index tensor) in consecutive chunks of ``size`` (none when empty)."""
    return list(rows.split(size)) if rows.numel() else []

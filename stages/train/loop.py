"""The one training loop (pretrain and sft): AdamW, LR schedule, accumulation, clipping, bf16 autocast,
non-finite step skipping, atomic resumable checkpoints, held-out evaluation with best-checkpoint
keeping, progress bar; plain PyTorch or a DeepSpeed engine (ZeRO 0-3) with the same optimizer,
schedule and data.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from stages.core import threads
from stages.core.dist import train_device
from stages.core.errors import PipelineError
from stages.core.io import atomic_path
from stages.core.modeling import enable_checkpointing
from stages.core.progress import Throughput
from stages.schema.train import TrainLoopParams
from stages.train import checkpoint as ck
from stages.train.data import BatchSource
from stages.train.ds_config import deepspeed_config
from stages.train.losses import lm_nll_sum
from stages.train.schedule import lr_factor
from stages.train.update import Updater, use_bf16, use_deepspeed

EvalFn = Callable[[torch.nn.Module], float]


# ---------------------------------------------------------------------------------------------
# small pieces


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices (weights, embeddings), none on 1-D tensors (norm scales, biases)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:  # a ZeRO-3 partition (zero.Init) is flat: its full shape is ds_shape
            (decay if len(getattr(p, "ds_shape", p.shape)) >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, p: TrainLoopParams) -> torch.optim.AdamW:
    """AdamW with the params' betas, eps and decoupled weight decay (paper: 0.9, 0.95, 0.1)."""
    return torch.optim.AdamW(param_groups(model, p.weight_decay), lr=p.lr, betas=(p.adam_beta1, p.adam_beta2),
                             eps=p.adam_eps, foreach=False)


def make_scheduler(opt: torch.optim.Optimizer, p: TrainLoopParams) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over :func:`stages.train.schedule.lr_factor` (stepped once per optimizer step, skipped or not)."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, p.steps, p.warmup_steps, p.schedule))


def _rng_state() -> dict[str, Any]:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


@contextlib.contextmanager
def gathered_params(model: torch.nn.Module, zero_stage: int) -> Iterator[None]:
    """Inside: ZeRO-3 partitioned parameters are whole on every rank (a no-op otherwise)."""
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            yield
    else:
        yield


def full_state_dict(model: torch.nn.Module, zero_stage: int = 0) -> dict[str, torch.Tensor]:
    """A CPU copy of the full state dict (gathered under ZeRO-3; tied weights kept once)."""
    with gathered_params(model, zero_stage):
        out: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for k, v in model.state_dict().items():
            if v.data_ptr() in seen and v.numel() > 0:
                continue
            seen.add(v.data_ptr())
            out[k] = v.detach().to("cpu", copy=True).contiguous()
        return out


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass
class TrainResult:
    """What a call of :func:`train` did."""

    total_steps: int
    start_step: int
    steps_run: int
    skipped_steps: int
    tokens: int
    """Input tokens of this call's steps (a resumed run's part: a measurement)."""
    target_tokens: int
    train_wall_s: float
    precision: str
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    best_eval_loss: float | None = None
    best_step: int | None = None
    run_dir: str = ""
    world_size: int = 1
    zero_stage: int = 0
    total_tokens: int = 0
    """Input tokens of all ``total_steps`` steps, those before a resume included (a result)."""

    eval_wall_s: float = 0.0
    checkpoint_wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Input tokens processed per second of this call's training steps (all ranks; evaluation and
        checkpoint time excluded)."""
        step_s = self.train_wall_s - self.eval_wall_s - self.checkpoint_wall_s
        return self.tokens / step_s if step_s > 0 else 0.0


def forward_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor], bf16: bool, device: torch.device,
                chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and scored-token count of one batch (packed rows: block-diagonal attention via position_ids); the
    vocabulary in chunks of ``chunk_tokens`` positions (stages.train.losses.lm_nll_sum; 0 = whole logits)."""
    b = {k: v.to(device) for k, v in batch.items()}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        return lm_nll_sum(model, b["labels"], chunk_tokens=chunk_tokens, input_ids=b["input_ids"],
                          position_ids=b["position_ids"], use_cache=False)


@torch.no_grad()
def eval_loss(model: torch.nn.Module, batches: Sequence[dict[str, torch.Tensor]], *, bf16: bool = False,
              device: torch.device | None = None, chunk_tokens: int | None = None) -> float:
    """Mean per-token NLL over fixed batches (nan when there are none)."""
    device = device or next(model.parameters()).device
    was = model.training
    model.eval()
    tot, n = 0.0, 0
    for b in batches:
        s, c = forward_nll(model, b, bf16, device, chunk_tokens)
        tot, n = tot + float(s), n + int(c)
    model.train(was)
    return tot / n if n else float("nan")


def train(model: torch.nn.Module, data: BatchSource, p: TrainLoopParams, run_dir: str | os.PathLike[str], *,
          eval_fn: EvalFn | None = None, keep_best: bool = False, desc: str = "train",
          fault_hook: Callable[[int], None] | None = None) -> TrainResult:
    """Train ``model`` in place for ``p.steps`` optimizer steps, resuming from ``run_dir`` when it holds a checkpoint.

    Each step draws ``micro_batch_size * grad_accum * world_size`` rows; every rank scores its slice and the loss is
    token-weighted over the whole step (:func:`_optimizer_step`; a non-finite loss or gradient norm skips the update,
    counted; the LR schedule still advances). ``eval_fn(model) -> loss`` runs every ``eval_every`` steps and at the
    end; with ``keep_best`` the lowest eval loss's weights are loaded into ``model`` before returning. DeepSpeed when
    ``p.deepspeed.enabled`` or launched by deepspeed / torchrun. ``fault_hook(step)`` runs before each step (tests)."""
    run_dir = Path(run_dir)
    threads.use(p.num_threads)  # at most num_threads, fewer while other work competes (stages/core/threads.py)
    upd, bf16 = _updater(model, p)
    engine, rank, world = upd.engine, upd.rank, upd.world
    zero_stage = p.deepspeed.zero_stage if engine is not None else 0
    net: torch.nn.Module = engine.module if engine is not None else model
    autocast_bf16 = bf16 and engine is None  # DeepSpeed's bf16 mode replaces autocast
    adapt = threads.training_adapts(autocast_bf16=autocast_bf16, fixed_shape=bool(getattr(data, "fixed_shape", False)),
                                    deepspeed=engine is not None)
    is_main = rank == 0
    state = _start_state(run_dir, upd, data, is_main)
    start = int(state["step"])
    side = _SideWork(run_dir, upd, data, state, is_main, eval_fn, net, zero_stage, keep_best)
    log = _StepLog(p, start, desc, is_main)
    t0, tokens0 = time.perf_counter(), state["tokens"]
    for step in range(start, p.steps):
        threads.step(adapt=adapt)  # float32 under strict MKL and bf16 of one shape follow the load (threads.TRAINING)
        if fault_hook is not None:
            fault_hook(step)
        big = data.next_batch(p.micro_batch_size * p.grad_accum * world)
        n_target = int((big["labels"][:, 1:] != -100).sum())
        mine = {k: v[rank::world] for k, v in big.items()} if world > 1 else big
        step_loss, grad_norm, bad = _optimizer_step(upd, mine, n_target, p, autocast_bf16)
        n_tok = int(big["input_ids"].numel())
        state.update(step=step + 1, skipped=state["skipped"] + int(bad), tokens=state["tokens"] + n_tok,
                     target_tokens=state["target_tokens"] + n_target)
        log.step(step + 1, None if bad else step_loss, grad_norm, upd.scheduler.get_last_lr()[0], n_tok, state)
        with log.paused():  # logged tokens/s counts training steps only
            if (p.eval_every and (step + 1) % p.eval_every == 0) or step + 1 == p.steps:
                side.evaluate(step + 1)
            if (p.checkpoint_every and (step + 1) % p.checkpoint_every == 0) or step + 1 == p.steps:
                side.save(step + 1)
    log.bar.close()
    wall = time.perf_counter() - t0
    if start == p.steps and eval_fn is not None and not state["evals"]:
        side.evaluate(p.steps)
    if keep_best and (run_dir / "best" / "model.safetensors").is_file():
        sd = load_file(str(run_dir / "best" / "model.safetensors"))
        with gathered_params(net, zero_stage):
            net.load_state_dict(sd, strict=False)
    if engine is not None:
        torch.distributed.barrier()
    return TrainResult(
        total_steps=p.steps, start_step=start, steps_run=p.steps - start, skipped_steps=int(state["skipped"]),
        tokens=int(state["tokens"] - tokens0), target_tokens=int(state["target_tokens"]), train_wall_s=wall,
        eval_wall_s=side.timers["eval"], checkpoint_wall_s=side.timers["checkpoint"],
        precision="bf16" if bf16 else "fp32", history=list(state["history"]), evals=list(state["evals"]),
        best_eval_loss=state["best_eval_loss"], best_step=state["best_step"], run_dir=str(run_dir), world_size=world,
        zero_stage=zero_stage, total_tokens=int(state["tokens"]),
    )


def _start_state(run_dir: Path, upd: Updater, data: BatchSource, is_main: bool) -> dict[str, Any]:
    """The loop's state: from the latest checkpoint in ``run_dir`` (its update state and the data's position
    restored), else a fresh one."""
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    latest = ck.latest_checkpoint(run_dir)
    if latest is not None:
        return _load_checkpoint(latest, upd, data)
    return {"step": 0, "skipped": 0, "tokens": 0, "target_tokens": 0, "history": [], "evals": [],
            "best_eval_loss": None, "best_step": None}


class _StepLog:
    """The loss window, tokens per second and the progress bar: a history row every ``p.log_every`` steps (and the
    last); :meth:`paused` leaves time spent evaluating and checkpointing out of tokens per second."""

    def __init__(self, p: TrainLoopParams, start: int, desc: str, is_main: bool) -> None:
        self.p, self.tok_w, self.tw = p, 0, time.perf_counter()
        self.bar = tqdm(total=p.steps, initial=start, desc=desc, disable=not is_main, mininterval=2.0,
                        dynamic_ncols=True)
        self.live = Throughput()  # cores used and load beside tokens/s: why a step is slow

    def step(self, done: int, loss: float | None, grad_norm: float, lr: float, n_tok: int,
             state: dict[str, Any]) -> None:
        """After step ``done`` (``loss`` None: skipped). The losses since the last row are in ``state`` (so in the
        checkpoint): a resumed run logs the mean an uninterrupted one would."""
        self.tok_w += n_tok
        window = state.setdefault("loss_window", [])
        if loss is not None:
            window.append(loss)
        if done % self.p.log_every == 0 or done == self.p.steps:
            now = time.perf_counter()
            rec = {"step": done, "loss": float(np.mean(window)) if window else float("nan"), "lr": lr,
                   "grad_norm": grad_norm, "tokens_per_s": self.tok_w / max(now - self.tw, 1e-9),
                   "skipped": state["skipped"]}
            state["history"].append(rec)
            rate = self.live.tick()
            self.bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{rec['tokens_per_s']:.0f}",
                                 cores=f"{rate['cores']:.1f}", load=f"{rate['load']:.1f}")
            window.clear()
            self.tw, self.tok_w = now, 0
        self.bar.update(1)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.tw += time.perf_counter() - t


class _SideWork:
    """Evaluations (``eval_fn``; with ``keep_best`` the best weights to ``run_dir/best``) and checkpoints of the
    loop, each timed (``timers``)."""

    def __init__(self, run_dir: Path, upd: Updater, data: BatchSource, state: dict[str, Any], is_main: bool,
                 eval_fn: EvalFn | None, net: torch.nn.Module, zero_stage: int, keep_best: bool) -> None:
        self.run_dir, self.upd, self.data, self.state, self.is_main = run_dir, upd, data, state, is_main
        self.eval_fn, self.net, self.zero_stage, self.keep_best = eval_fn, net, zero_stage, keep_best
        self.timers = {"eval": 0.0, "checkpoint": 0.0}

    def save(self, step: int) -> None:
        t = time.perf_counter()
        _save_checkpoint(self.run_dir, step, self.upd, self.data, self.state, self.is_main)
        self.timers["checkpoint"] += time.perf_counter() - t

    def evaluate(self, step: int) -> None:
        if self.eval_fn is None:
            return
        t = time.perf_counter()
        try:
            self._evaluate(step)
        finally:
            self.timers["eval"] += time.perf_counter() - t

    def _evaluate(self, step: int) -> None:
        assert self.eval_fn is not None
        state = self.state
        with gathered_params(self.net, self.zero_stage):
            loss = float(self.eval_fn(self.net))
        state["evals"].append({"step": step, "eval_loss": loss})
        if self.keep_best and math.isfinite(loss) and (state["best_eval_loss"] is None or
                                                       loss < state["best_eval_loss"]):
            state["best_eval_loss"], state["best_step"] = loss, step
            sd = full_state_dict(self.net, self.zero_stage)
            if self.is_main:
                with atomic_path(self.run_dir / "best") as tmp:
                    tmp.mkdir()
                    save_file(sd, str(tmp / "model.safetensors"))


def _updater(model: torch.nn.Module, p: TrainLoopParams) -> tuple[Updater, bool]:
    """``model`` on this rank's device in training mode (no KV cache, checkpointing per ``p``) and its update path:
    AdamW with the LR schedule, clipping, DeepSpeed when enabled or launched by deepspeed / torchrun; and whether it
    trains in bf16."""
    device = train_device()
    bf16 = use_bf16(p.precision, device)
    seed_everything(p.seed)
    model.to(device)
    model.train()
    if getattr(model.config, "use_cache", None) is not None:
        model.config.use_cache = False
    enable_checkpointing(model, p.gradient_checkpointing)
    opt = make_optimizer(model, p)
    upd = Updater(model, optimizer=opt, scheduler=make_scheduler(opt, p),
                  max_grad_norm=p.max_grad_norm if p.max_grad_norm > 0 else float("inf"),
                  deepspeed=deepspeed_config(p, bf16=bf16) if use_deepspeed(p.deepspeed.enabled) else None)
    return upd, bf16


def _optimizer_step(upd: Updater, mine: dict[str, torch.Tensor], n_target: int, p: TrainLoopParams,
                    autocast_bf16: bool) -> tuple[float, float, bool]:
    """One optimizer step over this rank's rows ``mine`` in ``p.grad_accum`` micro-batches, the loss token-weighted
    over the step's ``n_target`` target tokens; returns (loss, gradient norm, skipped: a non-finite loss or norm)."""
    rows_per_micro, step_loss, bad = p.micro_batch_size, 0.0, False
    upd.zero_grad()
    for a in range(p.grad_accum):
        last = a == p.grad_accum - 1
        if bad:  # DeepSpeed only (plain mode stops at a bad micro-batch): keep the ranks' backward counts equal
            upd.dummy_backward(last=last)
            continue
        mb = {k: v[a * rows_per_micro:(a + 1) * rows_per_micro] for k, v in mine.items()}
        nll, _ = forward_nll(upd.forward_model, mb, autocast_bf16, upd.device, p.logprob_chunk_tokens)
        loss = nll / max(n_target, 1)
        if not torch.isfinite(loss):
            bad = True
            if upd.engine is None:
                break
            upd.dummy_backward(last=last)
            continue
        upd.backward(loss, last=last)
        step_loss += float(loss.detach())
    grad_norm, stepped = upd.step(bad)
    return step_loss, grad_norm, not stepped


def _save_checkpoint(run_dir: Path, step: int, upd: Updater, data: BatchSource, state: dict[str, Any],
                     is_main: bool) -> None:
    target = ck.step_dir(run_dir, step)
    tmp = run_dir / f".{target.name}.tmp"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    trainer_state = {"trainer": dict(state), "data": data.state_dict(), "rng": _rng_state()}
    if upd.distributed:
        torch.distributed.barrier()
    if upd.distributed or is_main:
        upd.save_state(tmp)  # weights, optimizer, LR schedule (DeepSpeed: every rank its partition)
    if upd.distributed:
        torch.distributed.barrier()
    if is_main:
        torch.save(trainer_state, tmp / "state.pt")
        ck.write_manifest(tmp, step)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        ck.prune(run_dir)
    if upd.distributed:
        torch.distributed.barrier()


def _load_checkpoint(ckpt: Path, upd: Updater, data: BatchSource) -> dict[str, Any]:
    step = ck.verify_manifest(ckpt)
    try:
        st = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise ck.corrupt(ckpt, f"state.pt does not load: {type(e).__name__}") from None
    try:
        upd.load_state(ckpt, scheduler_state=st.get("scheduler"))
    except PipelineError:
        raise
    except ValueError as e:
        raise ck.corrupt(ckpt, str(e)) from None
    except Exception as e:  # noqa: BLE001
        raise ck.corrupt(ckpt, f"weights or optimizer do not load: {type(e).__name__}") from None
    data.load_state_dict(st["data"])
    _set_rng_state(st["rng"])
    trainer = dict(st["trainer"])
    if int(trainer["step"]) != step:
        raise ck.corrupt(ckpt, f"state step {trainer['step']} != manifest step {step}")
    return trainer

"""Ranks and devices, written once: which process this is in a deepspeed / torchrun launch, its accelerator, and
a sum / max of plain numbers over ranks. A plain single process is rank 0 of a world of 1 everywhere.

Every stage that trains reads these (stages/train/update.py, stages/train/loop.py, the grpo stage); nothing else
reads RANK / WORLD_SIZE / LOCAL_RANK.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch


def rank() -> int:
    """This process's global rank (``RANK``; 0 for a plain process)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Processes in the launch (``WORLD_SIZE``; 1 for a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Rank 0 (or a plain single process): the one that writes outputs."""
    return rank() == 0


def launched_distributed() -> bool:
    """True when launched by ``deepspeed`` / ``torchrun`` with several processes (WORLD_SIZE > 1); a single
    process uses DeepSpeed only when its params enable it."""
    return world_size() > 1


def train_device() -> torch.device:
    """This rank's accelerator: cuda:LOCAL_RANK when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick), for a rendezvous or a server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed_env() -> None:
    """Make a single plain process look like rank 0 of a world of 1 (deepspeed/torchrun set these themselves)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Sum (``op="sum"``) or max (``"max"``) of ``values`` over ranks; the values themselves on one process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
            torch.distributed.get_world_size() == 1:
        return list(values)
    dev = train_device() if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return [float(x) for x in t.cpu()]


def barrier() -> None:
    """Wait for every rank (a no-op without an initialised process group of several ranks)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def ensure_process_group() -> None:
    """Join the launch's process group (NCCL on CUDA, else gloo) when several ranks were launched and nothing has
    joined it yet; DeepSpeed's initialisation later reuses it. A no-op for a single process."""
    if world_size() == 1 or not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    init_distributed_env()
    dev = train_device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")


def block(n: int) -> tuple[int, int]:
    """This rank's contiguous share ``[start, end)`` of ``n`` items (the first ``n % world`` ranks take one more)."""
    ensure_process_group()
    w, r = world_size(), rank()
    base, extra = divmod(n, w)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def all_gather_list(local: list[Any]) -> list[Any]:
    """The concatenation, in rank order, of every rank's ``local`` list (picklable items); ``local`` on one process."""
    if world_size() == 1:
        return list(local)
    ensure_process_group()
    parts: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, list(local))
    return [x for part in parts for x in part]

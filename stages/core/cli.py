"""``python -m stages.<stage> --params FILE``: the entry of one rank of a training stage (pretrain, sft,
reward_model, grpo) under torchrun / deepspeed (flows/_launch.py starts the ranks): the params checked, the world
size checked against the launcher block, the stage's ``run``, each rank's exit status reported."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stages.core.dist import is_main_process
from stages.core.errors import PipelineError
from stages.schema.base import Section


def check_world_size(p: Any) -> None:
    """The processes this stage runs in are the ones its params ask for: WORLD_SIZE (1 for a plain process) equals
    ``launcher.nproc_per_node x launcher.nnodes``; the world size changes what is trained, and DVC tracks it."""
    launcher = getattr(p, "launcher", None)
    if launcher is None:
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != launcher.world_size:
        raise PipelineError(f"{p.SECTION}.launcher: the stage runs as {world} rank(s) (WORLD_SIZE) but nproc_per_node x "
                            f"nnodes = {launcher.world_size}; launch it with that many ranks (runtime.{p.SECTION}."
                            "launcher.kind: torchrun / deepspeed starts them) or fix the counts")


def _write_status(code: int, error: str | None = None, metrics: dict[str, Any] | None = None) -> None:
    """Under flows/_launch.py (DSM_RANK_STATUS_DIR): this rank's exit status, and rank 0's metrics."""
    d = os.environ.get("DSM_RANK_STATUS_DIR")
    if not d:
        return
    rank = int(os.environ.get("RANK", "0"))
    row = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "host": socket.gethostname(),
           "pid": os.getpid(), "exit_code": code, "error": error}
    Path(d, f"rank-{rank}.json").write_text(json.dumps(row) + "\n")
    if metrics is not None and rank == 0:
        Path(d, "metrics.json").write_text(json.dumps(metrics, default=str) + "\n")


def cli(section: type[Section], run: Callable[[Any], dict[str, Any]]) -> int:
    """``python -m stages.<stage> --params FILE``: the entry of every rank under ``torchrun`` / ``deepspeed`` (rank 0
    writes the outputs). The ranks are started by the stage command when ``runtime.<stage>.launcher.kind`` says so
    (flows/_launch.py), or by hand. The whole file is validated and checked first (stages/params.py,
    stages/preflight.py), then ``section`` is loaded and the world size checked against its launcher block. Each
    rank's exit status (and rank 0's metrics) is written to ``$DSM_RANK_STATUS_DIR`` when set."""
    from stages import preflight
    from stages.params import load_params

    stage = section.SECTION
    assert stage is not None
    ap = argparse.ArgumentParser(prog=f"python -m stages.{stage}",
                                 description=f"One rank of the {stage} stage (start it with torchrun / deepspeed, or "
                                             f"let `python -m flows.{stage}` do so: runtime.{stage}.launcher).")
    ap.add_argument("--params", default="params.yaml", metavar="FILE", help="params file (default: params.yaml)")
    ap.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    args = ap.parse_args()

    def _terminated(signum: int, _frame: Any) -> None:
        _write_status(128 + signum, f"terminated by {signal.Signals(signum).name}")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, _terminated)
    try:
        params = load_params(args.params)
        preflight.check(params, [stage])
        p = section.from_file(args.params)
        check_world_size(p)
        metrics = run(p)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        _write_status(2, str(e))
        return 2
    except BaseException as e:
        _write_status(1, f"{type(e).__name__}: {e}")
        raise
    _write_status(0, metrics=metrics if is_main_process() else None)
    if is_main_process():
        print(metrics)
    return 0

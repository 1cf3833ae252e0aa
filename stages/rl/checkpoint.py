"""Resumable GRPO state, with the training stages' checkpoint layout (stages.train.checkpoint).

``checkpoints/grpo/<run hash>/step-<N>/`` holds ``state.pt`` (policy and optimizer state dicts, the
next step, the per-step metric rows and sampled-completion rows so far) and ``manifest.json``
(written last: a directory without it is never used). The run hash covers the grpo params section
and fingerprints of the start model and the prompt file, so a checkpoint of another configuration is
never resumed. Question order and sampling seeds are pure functions of (seed, step)
(stages.rl.data.step_questions), so a resumed run continues with the same questions and seeds.
The two most recent checkpoints are kept; the stage deletes its run directory when it finishes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from stages.train import checkpoint as ck

STATE = "state.pt"


def run_dir(root: str | os.PathLike[str], params: dict[str, Any], inputs: Iterable[str | os.PathLike[str]]) -> Path:
    """``root/<run hash>``: the checkpoint directory of this params section and these inputs."""
    return Path(root) / ck.run_hash(params, inputs)


def save_checkpoint(rdir: str | os.PathLike[str], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    step: int, history: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> Path:
    """Write ``rdir/step-<step>/`` atomically (temporary sibling, manifest last, rename); keep the last two.
    ``optimizer`` None stores no optimizer state (a DeepSpeed update: a resumed run restarts AdamW's moments)."""
    rdir = Path(rdir)
    final = ck.step_dir(rdir, step)
    tmp = rdir / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    opt_state = None if optimizer is None else optimizer.state_dict()
    torch.save({"model": model.state_dict(), "optimizer": opt_state, "step": step, "history": history,
                "extra": extra or {}}, tmp / STATE)
    ck.write_manifest(tmp, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    ck.prune(rdir, keep=2)
    return final


def load_latest(rdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state of the latest complete checkpoint in ``rdir``, or None; a corrupt one is a one-line error."""
    latest = ck.latest_checkpoint(Path(rdir))
    if latest is None:
        return None
    ck.verify_manifest(latest)
    try:
        return torch.load(latest / STATE, map_location="cpu", weights_only=False)
    except Exception as e:  # unreadable pickle: report which checkpoint and how to recover
        raise ck.corrupt(latest, f"{STATE} does not load: {type(e).__name__}") from None

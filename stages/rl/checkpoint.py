"""Resumable GRPO state, with the training stages' checkpoint layout (stages.train.checkpoint).

``checkpoints/grpo/<run hash>/step-<N>/`` holds ``state.pt`` (the next step, the per-step metric rows and
sampled-completion rows so far, and any ``extra`` state), one directory per trained model written by its
:class:`stages.train.update.Updater` (``policy/``, PPO's ``critic/``: weights, optimizer and LR-schedule state;
under DeepSpeed the engine's own checkpoint, ZeRO partitions included, so a resumed DeepSpeed run continues with the
same AdamW moments) and ``manifest.json`` (written last: a directory without it is never used). The run hash covers
the grpo params section and fingerprints of the start model and the prompt file, so a checkpoint of another
configuration is never resumed. Question order and sampling seeds are pure functions of (seed, step)
(stages.rl.data.step_questions), so a resumed run continues with the same questions and seeds.
The two most recent checkpoints are kept; the stage deletes its run directory when it finishes.

Several ranks: every rank calls :func:`save_checkpoint` and :func:`load_updaters` (each writes / reads its
DeepSpeed partition); rank 0 writes the rest. The directory must be on a file system every rank sees (one node).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from stages.core.dist import barrier, is_main_process
from stages.train import checkpoint as ck
from stages.train.update import Updater

STATE = "state.pt"


def run_dir(root: str | os.PathLike[str], params: dict[str, Any], inputs: Iterable[str | os.PathLike[str]]) -> Path:
    """``root/<run hash>``: the checkpoint directory of this params section and these inputs."""
    return Path(root) / ck.run_hash(params, inputs)


def save_checkpoint(rdir: str | os.PathLike[str], *, updaters: Mapping[str, Updater], step: int,
                    history: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> Path:
    """Write ``rdir/step-<step>/`` atomically (temporary sibling, manifest last, rename); keep the last two.
    ``updaters``: the trained models by name (their weights, optimizer and schedule state); every rank calls it."""
    rdir = Path(rdir)
    final = ck.step_dir(rdir, step)
    tmp = rdir / f".{final.name}.tmp"
    main = is_main_process()
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in updaters:
            (tmp / name).mkdir()
    barrier()
    for name, upd in updaters.items():
        if upd.distributed or main:
            upd.save_state(tmp / name)
    barrier()
    if main:
        torch.save({"step": step, "history": history, "extra": extra or {}, "updaters": sorted(updaters)},
                   tmp / STATE)
        ck.write_manifest(tmp, step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        ck.prune(rdir, keep=2)
    barrier()
    return final


def load_updaters(state: dict[str, Any], updaters: Mapping[str, Updater]) -> None:
    """Restore every updater's model, optimizer and schedule from the checkpoint ``state`` came from (every rank);
    a missing or unreadable part is the one-line corrupt-checkpoint error."""
    ckpt = Path(state["path"])
    for name, upd in updaters.items():
        try:
            upd.load_state(ckpt / name)
        except Exception as e:  # noqa: BLE001 - any failure means the checkpoint does not fit
            msg = str(e).splitlines()[0] if isinstance(e, ValueError) else type(e).__name__
            raise ck.corrupt(ckpt, f"{name} does not load: {msg}") from None


def load_latest(rdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state of the latest complete checkpoint in ``rdir``, or None; a corrupt one is a one-line error."""
    latest = ck.latest_checkpoint(Path(rdir))
    if latest is None:
        return None
    ck.verify_manifest(latest)
    try:
        state = torch.load(latest / STATE, map_location="cpu", weights_only=False)
    except Exception as e:  # unreadable pickle: report which checkpoint and how to recover
        raise ck.corrupt(latest, f"{STATE} does not load: {type(e).__name__}") from None
    state["path"] = str(latest)
    return state


def save_state(run: Any, models: Any, state: Any) -> Path:
    """Save the RL loop's state after ``state.step`` steps in ``state.ckpt_dir`` (every rank): the policy's (and PPO's
    value model's) update state, the rows, the held-out records and validation state, the reward guards' statistics
    and the curriculum's pass rates (``run``, ``models``, ``state``: stages/rl/types.py)."""
    assert state.ckpt_dir is not None
    updaters = {"policy": models.updater, **({"critic": models.critic.updater} if models.critic is not None else {})}
    extra: dict[str, Any] = {"samples": state.samples, "heldout": run.heldout.records if run.heldout else [],
                             "validation": run.validation.state_dict() if run.validation is not None else None}
    if hasattr(models.scorer, "state_dict"):
        extra["reward_source"] = models.scorer.state_dict()  # the guards' running statistics
    if state.curriculum is not None:
        extra["curriculum"] = state.curriculum.state_dict()  # the pass rates: the next steps' questions
    return save_checkpoint(state.ckpt_dir, updaters=updaters, step=state.step, history=state.history, extra=extra)


def load_state(run: Any, models: Any, state: Any, ckpt_dir: Path | None) -> None:
    """Load the latest checkpoint of ``ckpt_dir`` (:func:`save_state`'s), if there is one, into the loop."""
    saved = load_latest(ckpt_dir) if ckpt_dir is not None else None
    if saved is None:
        return
    critic = models.critic is not None and "critic" in saved.get("updaters", [])
    load_updaters(saved, {"policy": models.updater, **({"critic": models.critic.updater} if critic else {})})
    extra = saved["extra"]
    state.step, state.history, state.samples = saved["step"], saved["history"], extra.get("samples", [])
    if run.heldout is not None:
        run.heldout.records = list(extra.get("heldout", run.heldout.records))
    if run.validation is not None and extra.get("validation") is not None:
        run.validation.load_state_dict(extra["validation"])
    if extra.get("reward_source") is not None and hasattr(models.scorer, "load_state_dict"):
        models.scorer.load_state_dict(extra["reward_source"])
    if state.curriculum is not None and extra.get("curriculum") is not None:
        state.curriculum.load_state_dict(extra["curriculum"])
    state.info["resumed_from_step"] = state.step

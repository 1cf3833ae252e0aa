"""Resumable checkpoints, atomically written, in ``checkpoints/<stage>/<run hash>/``.

The run hash covers the stage's params section and a fingerprint of every input (model directory,
data files), so a checkpoint of another configuration is never resumed. A checkpoint directory
``step-<N>/`` holds ``model.safetensors``, ``optimizer.pt``, ``state.pt`` (scheduler, data position,
RNG states, counters, history) and ``manifest.json`` (file sizes), written in a temporary sibling and
renamed into place; ``manifest.json`` is the last file written, so a directory without it is never used.
Under DeepSpeed the directory holds DeepSpeed's own checkpoint (``ds/``) plus ``state.pt``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError

_FULL_HASH_LIMIT = 512 * 2**20
_CHUNK = 16 * 2**20


def fingerprint_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes; for files over 512 MiB, of its size, first and last 16 MiB (fast on a 100 GB
    corpus; a change that keeps size, head and tail escapes it: delete checkpoints/ after editing such a file)."""
    p = Path(path)
    h = hashlib.sha256()
    size = p.stat().st_size
    with open(p, "rb") as f:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
        else:
            h.update(str(size).encode())
            h.update(f.read(_CHUNK))
            f.seek(size - _CHUNK)
            h.update(f.read(_CHUNK))
    return h.hexdigest()


def fingerprint_path(path: str | os.PathLike[str]) -> str:
    """Fingerprint of a file, or of every file under a directory (relative names included)."""
    p = Path(path)
    if p.is_file():
        return fingerprint_file(p)
    if not p.is_dir():
        raise PipelineError(f"{p}: input not found; run the stage that writes it (dvc repro)")
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        h.update(str(f.relative_to(p)).encode() + b"\0" + fingerprint_file(f).encode())
    return h.hexdigest()


def run_hash(params: dict[str, Any], inputs: Iterable[str | os.PathLike[str]]) -> str:
    """16 hex digits identifying a training run: its params and the fingerprints of its inputs."""
    blob = json.dumps({"params": params, "inputs": {str(i): fingerprint_path(i) for i in inputs}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_HINT = "delete that directory to resume from the previous checkpoint, or its parent to start over"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(run_dir: Path, step: int) -> Path:
    """Directory of the checkpoint taken after ``step`` optimizer steps."""
    return run_dir / f"step-{step:08d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the most steps in ``run_dir`` (one whose manifest exists), or None."""
    if not run_dir.is_dir():
        return None
    found = [(int(m.group(1)), d) for d in run_dir.iterdir() if (m := _STEP_DIR.match(d.name)) and d.is_dir()]
    found = [(s, d) for s, d in found if (d / "manifest.json").is_file()]
    return max(found)[1] if found else None


def write_manifest(ckpt: Path, step: int) -> None:
    """Record every file's size; written last, it marks the checkpoint complete."""
    files = {str(f.relative_to(ckpt)): f.stat().st_size for f in sorted(ckpt.rglob("*")) if f.is_file()}
    (ckpt / "manifest.json").write_text(json.dumps({"step": step, "files": files}, indent=1))


def verify_manifest(ckpt: Path) -> int:
    """Check a checkpoint against its manifest; return its step. One-line error when it is corrupt."""
    hint = _HINT
    try:
        man = json.loads((ckpt / "manifest.json").read_text())
        files, step = man["files"], int(man["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PipelineError(f"{ckpt}: corrupt checkpoint (unreadable manifest.json); {hint}") from None
    for name, size in files.items():
        f = ckpt / name
        if not f.is_file() or f.stat().st_size != size:
            raise PipelineError(f"{ckpt}: corrupt checkpoint ({name} missing or of the wrong size); {hint}")
    return step


def corrupt(ckpt: Path, what: str) -> PipelineError:
    """The one-line error for a checkpoint whose files do not load."""
    return PipelineError(f"{ckpt}: corrupt checkpoint ({what}); {_HINT}")


def prune(run_dir: Path, keep: int = 2) -> None:
    """Remove all but the ``keep`` most recent complete checkpoints (and stale temporaries)."""
    found = sorted((int(m.group(1)), d) for d in run_dir.iterdir() if (m := _STEP_DIR.match(d.name)))
    for _, d in found[:-keep]:
        shutil.rmtree(d, ignore_errors=True)
    for d in run_dir.glob(".step-*.tmp"):
        shutil.rmtree(d, ignore_errors=True)

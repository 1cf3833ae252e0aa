"""Atomic file and directory writes, JSON / JSONL helpers.

A stage never leaves a half-written output: files are written to a temporary sibling and
renamed into place (``os.replace`` is atomic on POSIX), directories are built in a temporary
sibling directory and swapped in at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it to ``path``.

    Works for files and directories: the caller writes whatever it wants at the yielded
    path. On an exception the temporary is removed and ``path`` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    tmp.rmdir()  # the caller decides whether it is a file or a directory
    try:
        yield tmp
        if target.is_dir() and not target.is_symlink():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as pretty JSON to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON Lines to ``path`` atomically; return the number of rows."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or malformed file is a one-line :class:`PipelineError`."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: file not found; run the stage that produces it (dvc repro) or fix the path")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(f"{p}: not valid UTF-8 JSON ({e}); regenerate or fix the file") from None


def iter_jsonl(path: str | os.PathLike[str], *, skip_bad: bool = False, counter: dict[str, int] | None = None
               ) -> Iterator[dict[str, Any]]:
    """Stream the objects of a JSONL file without loading it whole.

    Blank lines are ignored. A malformed line (bad JSON, bad UTF-8, not an object) raises a
    one-line :class:`PipelineError` naming file and line, unless ``skip_bad`` is set, in which
    case it is skipped and counted in ``counter["bad_lines"]``.
    """
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: file not found; run the stage that produces it (dvc repro) or fix the path")
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
            except (UnicodeDecodeError, ValueError) as e:
                if skip_bad:
                    if counter is not None:
                        counter["bad_lines"] = counter.get("bad_lines", 0) + 1
                    continue
                raise PipelineError(f"{p}:{lineno}: malformed JSONL line ({type(e).__name__}); fix or remove it") from None
            yield obj


def read_jsonl(path: str | os.PathLike[str], **kwargs: Any) -> list[dict[str, Any]]:
    """Read a whole JSONL file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path, **kwargs))

"""The one error type the pipeline shows to users.

Every problem caused by user input (params, data files, model paths) is raised as a
:class:`PipelineError` whose message is a single line naming the key or file and the fix.
Entry points (``python -m flows.<stage>``) print that line and exit with status 2 instead
of a traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A user-facing error: one line, naming what is wrong and how to fix it."""

    def __init__(self, message: str) -> None:
        # Keep the message on one line whatever the caller passed.
        super().__init__(" ".join(str(message).split()))


def cause(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 160 characters) of a library's exception, for the one-line
    errors that wrap it (a corrupt file's reader: pyarrow, datasets, safetensors)."""
    msg = (str(e).strip().splitlines() or [""])[0][:160]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__

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

"""Thin Prefect 3 flows, one per dvc.yaml stage (``python -m flows.<stage>``), and the pipeline.

Importing this package points Prefect at a project-local home (``.prefect/``, git-ignored) before
Prefect itself is imported, so runs never touch ``~/.prefect`` and tests stay isolated. Under
``python -m flows.pipeline`` or ``dvc repro`` a ``python -m flows.<stage>`` command is first offered to the
run's stage server (flows/_stage_server.py, flows/_servers.py), which runs it in a fork of a process that has
imported the stages already.
"""

import os
from pathlib import Path

ORIGINAL_ENV = dict(os.environ)
"""The environment this process was started with (what an on-demand stage server must match)."""

if os.environ.get("DSM_STAGE_SERVER") or os.environ.get("DVC_STAGE"):  # a run's stage command: try its fork server
    from flows._stage_server import forward

    forward()  # exits with the stage's status; returns when there is none or it refuses (then the stage runs here)

_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_HOME", str(_ROOT / ".prefect"))
# No telemetry, no UI build, quiet SQLite: we only use the ephemeral API for run records.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_UI_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

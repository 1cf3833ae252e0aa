"""Thin Prefect 3 flows, one per dvc.yaml stage (``python -m flows.<stage>``), and the pipeline.

Importing this package points Prefect at a project-local home (``.prefect/``, git-ignored) before
Prefect itself is imported, so runs never touch ``~/.prefect`` and tests stay isolated.
"""

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_HOME", str(_ROOT / ".prefect"))
# No telemetry, no UI build, quiet SQLite: we only use the ephemeral API for run records.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_UI_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

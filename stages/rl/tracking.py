"""Every RL step's metrics logged with dvclive (``grpo.tracking``), the DVC way of tracking experiments: dvclive writes
``data/dvclive/grpo/metrics.json`` (the latest step's values under ``grpo``: DVC's live metrics while the stage runs,
``dvc exp show``'s columns ``grpo.<metric>`` after) and ``data/dvclive/grpo/plots/metrics/grpo/<metric>.tsv`` (one row
per step: ``dvc plots show`` / ``dvc plots diff``), which the grpo stage of dvc.yaml declares as metrics and plots (``cache: false``: git records
them with each experiment, and DVC's run-cache stays on).

Only results are logged: the timings (``t_*``, ``cpu_*``, ``*_s``: :func:`stages.core.io.is_timing_key`) go to
data/timings/ alone, so a rerun of the same inputs writes the same bytes. The logger replays the run's rows when it
starts, so a resumed run (rows restored from its checkpoint) writes what an uninterrupted one would.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stages.core.io import is_timing_key

PREFIX = "grpo"
"""The metrics' namespace: ``grpo.kl`` in metrics.json and ``dvc exp show``, plots/metrics/grpo/kl.tsv."""
SKIP = ("step", "iteration")
"""Row keys that are coordinates, not metrics."""


def loggable(row: dict[str, Any]) -> dict[str, float]:
    """The finite numeric results of a step row (no timings, no coordinates, no booleans)."""
    out = {}
    for k, v in row.items():
        if k in SKIP or is_timing_key(k) or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class StepLog:
    """dvclive's ``Live`` on ``directory`` (module docstring); :meth:`log` one step row, :meth:`close` at the end.
    ``live``: write after every step (else once, in :meth:`close`)."""

    def __init__(self, directory: str | Path, *, live: bool = True) -> None:
        self.directory = Path(directory)
        self.live_updates = live
        self.rows: list[dict[str, Any]] = []
        self._live: Any = None
        self._logged = 0

    def _open(self) -> Any:
        if self._live is None:
            from dvclive import Live

            self._live = Live(dir=str(self.directory), resume=False, report=None, save_dvc_exp=False, dvcyaml=None)
        return self._live

    def log(self, row: dict[str, Any], history: list[dict[str, Any]] | None = None) -> None:
        """Log step row ``row`` (x = its ``step`` + 1: steps done); ``history``: the run's rows so far, of which any
        not yet logged (a resumed run's restored rows) are replayed first."""
        for r in (history or [])[len(self.rows) :]:
            if r is not row:
                self.rows.append(r)
        self.rows.append(row)
        if self.live_updates:
            self._flush()

    def _flush(self) -> None:
        live = self._open()
        for r in self.rows[self._logged :]:
            live.step = int(r["step"]) + 1
            for k, v in loggable(r).items():
                live.log_metric(f"{PREFIX}/{k}", v)
            live.make_summary()
        self._logged = len(self.rows)

    def close(self, history: list[dict[str, Any]] | None = None) -> None:
        """Write what is not written yet (``history``: the run's rows, any not logged yet are added: a run without
        live updates, or algorithm sft's continued-SFT rows) and end dvclive's run."""
        for r in (history or [])[len(self.rows) :]:
            self.rows.append(r)
        self._flush()
        if self._live is not None:
            self._live.end()

"""Live throughput of the long loops (training steps, GRPO steps, evaluation batches), so a user sees as it runs
why a step is slow: items per second of wall time, the CPU cores this process used meanwhile and the machine's load
average. ``2.0 cores, load 2.1`` on a 2-core machine is a stage running alone at full speed; ``0.7 cores, load
4.3`` is one that competes with other work for the cores (docs/results/speed.md).

Nothing here changes what a stage computes: the figures go to the console (and to data/timings/, never to a
DVC output)."""

from __future__ import annotations

import os
import time


def loadavg() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


class Throughput:
    """Rates since the previous :meth:`tick` (or the start): ``tick(n)`` after ``n`` more items returns
    ``{"per_s": n / wall seconds, "cores": this process's CPU seconds / wall seconds, "load": loadavg()}``."""

    def __init__(self) -> None:
        self._t, self._c = time.perf_counter(), time.process_time()

    def tick(self, n: float = 1.0) -> dict[str, float]:
        t, c = time.perf_counter(), time.process_time()
        dt = max(t - self._t, 1e-9)
        out = {"per_s": n / dt, "cores": (c - self._c) / dt, "load": loadavg()}
        self._t, self._c = t, c
        return out


def describe(rate: dict[str, float], unit: str) -> str:
    """``"1234 tok/s, 1.9 cores, load 2.1"`` for :meth:`Throughput.tick`'s dict."""
    per = rate["per_s"]
    head = f"{per:.0f} {unit}/s" if per >= 10 else f"{per:.2f} {unit}/s"
    return f"{head}, {rate['cores']:.1f} cores, load {rate['load']:.1f}"

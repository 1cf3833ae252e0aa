"""A markdown table of every evaluated model, from the evaluate stage's metrics files.

``python -m stages.evaluate.report`` prints, per model, benchmark and mode: greedy accuracy and, for
sampled runs, pass@k and maj@k at k = 1 and the largest k (read from data/metrics/evaluate_<model>.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from stages.core import paths


def rows(metrics: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Table rows ``[model, benchmark, mode, greedy, pass@1, pass@K, maj@1, maj@K, K]`` (K: most samples)."""
    out = []
    for model, m in metrics.items():
        for bench, modes in m.items():
            if not isinstance(modes, dict) or bench in {"model", "prompting", "checker", "seeds"}:
                continue
            for mode, decs in modes.items():
                if not isinstance(decs, dict):
                    continue
                g = decs.get("greedy", {}).get("acc")
                s = decs.get("sample")
                k = s["n_samples"] if s else None
                cells = [f"{s['pass@1']:.3f}", f"{s[f'pass@{k}']:.3f}", f"{s['maj@1']:.3f}", f"{s[f'maj@{k}']:.3f}",
                         str(k)] if s else ["", "", "", "", ""]
                out.append([model, bench, mode, "" if g is None else f"{g:.3f}", *cells])
    return out


def markdown(metrics: dict[str, dict[str, Any]]) -> str:
    """The rows of :func:`rows` as a markdown table."""
    head = ["model", "benchmark", "mode", "greedy", "pass@1", "pass@K", "maj@1", "maj@K", "K"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(metrics)]
    return "\n".join(lines)


def load_all(metrics_dir: Path = paths.METRICS) -> dict[str, dict[str, Any]]:
    """Every ``evaluate_<model>.json`` in ``metrics_dir``, by model name."""
    return {f.stem.removeprefix("evaluate_"): json.loads(f.read_text())
            for f in sorted(metrics_dir.glob("evaluate_*.json"))}


if __name__ == "__main__":
    found = load_all(Path(sys.argv[1]) if len(sys.argv) > 1 else paths.METRICS)
    print(markdown(found) if found else "no data/metrics/evaluate_*.json yet: run dvc repro evaluate@<model>")

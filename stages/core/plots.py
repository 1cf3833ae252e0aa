"""The dvc plot tables every stage writes, written one way: rows of metrics as a delimited text file with a header
(x = the first column; ``dvc plots`` and the report page read them). The training stages write ``train.tsv`` /
``lr.tsv`` / ``eval.tsv`` (stages/train/common.py), the RL stage one ``<metric>.csv`` per training signal
(:func:`write_metric_files`), the evaluation stage its pass@k and per-difficulty tables (stages/evaluate/stage.py).
Files are written atomically.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stages.core.io import write_text


def format_value(v: Any, missing: str = "nan") -> str:
    """An int as is, a float to 6 significant digits, None / NaN as ``missing``, anything else as ``str``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return missing
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int | str):
        return str(v)
    return f"{float(v):.6g}"


def write_table(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]], columns: Sequence[str], *,
                sep: str = "\t", missing: str = "nan") -> None:
    """``rows`` as a table with a header line of ``columns`` (a value a row lacks is ``missing``)."""
    lines = [sep.join(columns)]
    lines += [sep.join(format_value(r.get(c), missing) for c in columns) for r in rows]
    write_text(path, "\n".join(lines) + "\n")


def write_metric_files(out_dir: str | os.PathLike[str], history: Sequence[Mapping[str, Any]], names: Iterable[str],
                       prefix: str = "") -> list[Path]:
    """One CSV per metric of ``names`` that some row of ``history`` has (``<prefix><metric>.csv``, columns step and
    the metric; a row without it or with NaN leaves the value empty): dvc plots them with x = step."""
    out: list[Path] = []
    for name in names:
        if not any(name in r for r in history):
            continue
        path = Path(out_dir) / f"{prefix}{name}.csv"
        write_table(path, ({"step": r["step"], name: r.get(name)} for r in history), ["step", name], sep=",",
                    missing="")
        out.append(path)
    return out

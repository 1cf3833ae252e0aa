"""Everything the report reads, and reading it: a missing input is ``None`` (the page shows "not run"), a corrupt
one is a one-line :class:`PipelineError` naming the file.

:func:`input_files` is the exact list of files and directories read, in the order dvc.yaml's ``report`` stage
lists them as deps (tests/report/test_stage.py checks that they agree).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.core import paths
from stages.core.errors import PipelineError
from stages.schema.report import ReportParams

STAGES = ("data", "corpus", "base_model", "pretrain", "sft", "reward_model", "grpo")
"""The stages with one report of metrics each (data/details/<stage>.json), in dvc.yaml order."""
LOSS_CURVES = ("train", "eval")
"""The training stages' curves read (data/plots/<stage>/<curve>.tsv): train loss and held-out loss per step."""
TRAINING_STAGES = ("pretrain", "sft")

Row = dict[str, float | None]


def input_files(p: ReportParams) -> list[Path]:
    """Every file and directory the report reads (dvc.yaml deps of the ``report`` stage, same order)."""
    out = [paths.details_file(s) for s in STAGES]
    out += [paths.details_file(f"evaluate_{m}") for m in p.models]
    out += [paths.plots_dir(s) / f"{c}.tsv" for s in TRAINING_STAGES for c in LOSS_CURVES]
    out += [paths.plots_dir("grpo"), paths.PARADIGM_RESULT, paths.PARADIGM_RM_RESULT, paths.ITERATIVE_RESULT]
    return out


@dataclass
class Inputs:
    """What the report shows; ``None`` (or an absent key) where the producing stage has not run."""

    metrics: dict[str, dict[str, Any] | None]
    """stage -> its metrics (data/details/<stage>.json: every metric it computed)."""
    evaluate: dict[str, dict[str, Any] | None]
    """model -> data/details/evaluate_<model>.json."""
    curves: dict[str, dict[str, list[Row] | None]]
    """training stage -> curve name (train, eval) -> rows of data/plots/<stage>/<curve>.tsv."""
    grpo_curves: dict[str, list[Row]]
    """metric -> rows (step, <metric>) of data/plots/grpo/<metric>.csv (absent metrics: not in the dict)."""
    paradigm: dict[str, Any] | None
    """benchmarks/results/paradigm.json: Figure 5 with the rule reward and exact step labels."""
    iterative: dict[str, Any] | None
    """benchmarks/results/iterative_rl.json: Figure 6."""
    missing: list[str] = field(default_factory=list)
    """Inputs not found (relative paths), for the report's own metrics."""
    paradigm_rm: dict[str, Any] | None = None
    """benchmarks/results/paradigm_rm.json: Figure 5 with the learned reward models (same schema as paradigm)."""


def read_json_opt(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when absent; corrupt: a one-line PipelineError naming it."""
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(f"{path}: not valid JSON ({e}); re-run the stage that writes it or delete the file") from None
    if not isinstance(obj, dict):
        raise PipelineError(f"{path}: expected a JSON object, got {type(obj).__name__}; re-run the stage that writes it")
    return obj


def read_table(path: Path) -> list[Row] | None:
    """A TSV / CSV curve (header row, then numbers; an empty cell is None), or None when absent.

    A cell that is not a number, or a row with the wrong number of cells, is a one-line PipelineError naming the
    file and line."""
    if not path.is_file():
        return None
    delimiter = "\t" if path.suffix == ".tsv" else ","
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise PipelineError(f"{path}: not UTF-8 text; re-run the stage that writes it") from None
    reader = csv.reader(lines, delimiter=delimiter)
    header = next(reader, None)
    if not header:
        raise PipelineError(f"{path}: empty (no header row); re-run the stage that writes it")
    rows: list[Row] = []
    for lineno, cells in enumerate(reader, 2):
        if not cells:
            continue
        if len(cells) != len(header):
            raise PipelineError(f"{path}:{lineno}: {len(cells)} cells, the header has {len(header)}; "
                                "re-run the stage that writes it")
        row: Row = {}
        for name, cell in zip(header, cells, strict=True):
            try:
                v = float(cell) if cell.strip() else None
            except ValueError:
                raise PipelineError(f"{path}:{lineno}: {name} = {cell!r} is not a number; "
                                    "re-run the stage that writes it") from None
            row[name] = v if v is None or math.isfinite(v) else None
        rows.append(row)
    return rows


def load(p: ReportParams, root: Path = Path(".")) -> Inputs:
    """Read every input under ``root`` (the project root)."""
    missing: list[str] = []

    def opt_json(x: Path) -> dict[str, Any] | None:
        got = read_json_opt(root / x)
        if got is None:
            missing.append(str(x))
        return got

    def opt_table(x: Path) -> list[Row] | None:
        got = read_table(root / x)
        if got is None:
            missing.append(str(x))
        return got

    metrics = {s: opt_json(paths.details_file(s)) for s in STAGES}
    evaluate = {m: opt_json(paths.details_file(f"evaluate_{m}")) for m in p.models}
    curves = {s: {c: opt_table(paths.plots_dir(s) / f"{c}.tsv") for c in LOSS_CURVES} for s in TRAINING_STAGES}
    grpo_dir = root / paths.plots_dir("grpo")
    grpo_curves: dict[str, list[Row]] = {}
    if grpo_dir.is_dir():
        for f in sorted(grpo_dir.glob("*.csv")):
            grpo_curves[f.stem] = read_table(f) or []
    else:
        missing.append(str(paths.plots_dir("grpo")))
    paradigm = opt_json(paths.PARADIGM_RESULT) if p.benchmark_results else None
    iterative = opt_json(paths.ITERATIVE_RESULT) if p.benchmark_results else None
    paradigm_rm = opt_json(paths.PARADIGM_RM_RESULT) if p.benchmark_results else None
    return Inputs(metrics, evaluate, curves, grpo_curves, paradigm, iterative, missing, paradigm_rm)


def get(d: Any, dotted: str) -> Any:
    """``d["a"]["b"]`` for ``"a.b"``; None where any level is absent or not a mapping (never raises)."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def num(x: Any) -> float | None:
    """``x`` as a finite float, else None (bools, strings, NaN and absent values are None)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def seq(x: Any) -> list[Any]:
    """``x`` if it is a list, else an empty list (never raises)."""
    return x if isinstance(x, list) else []


def mapping(x: Any) -> dict[str, Any]:
    """``x`` if it is a dict, else an empty dict (never raises)."""
    return x if isinstance(x, dict) else {}

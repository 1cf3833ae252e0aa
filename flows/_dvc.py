"""dvc.yaml and dvc.lock read directly (YAML only, no DVC import: milliseconds), for the command lines.

The stage names (``foreach`` stages expanded over their params list, as ``dvc stage list`` names them:
``evaluate@sft``), each stage's description (``desc``), flow module and outputs, and whether dvc.lock records
a stage (then ``dvc checkout <stage>`` can restore its outputs). DVC itself stays the authority on what is up
to date; this is only for help texts, name checks and hints.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError
from stages.schema.base import load_yaml

_VAR = re.compile(r"\$\{([^}]+)\}")


@dataclass(frozen=True)
class StageInfo:
    """One dvc.yaml stage (a foreach stage gives one per item)."""

    name: str
    """The address DVC uses: ``sft``, ``evaluate@grpo``."""
    group: str
    """The dvc.yaml key (``evaluate`` for every ``evaluate@...``)."""
    desc: str
    module: str | None
    """The ``python -m`` module of its command (``flows.sft``)."""
    outs: tuple[str, ...] = field(default=())
    deps: tuple[str, ...] = field(default=())
    uncached: tuple[str, ...] = field(default=())
    """Outputs with ``cache: false`` (metrics, reports, plots): git records them, ``dvc checkout`` cannot."""


def _lookup(params: dict[str, Any], dotted: str) -> Any:
    cur: Any = params
    for part in dotted.split("."):
        cur = cur[part]
    return cur


def _subst(text: str, ctx: dict[str, Any]) -> str:
    def one(m: re.Match[str]) -> str:
        try:
            return str(_lookup(ctx, m.group(1).strip()))
        except (KeyError, TypeError):
            return m.group(0)
    return _VAR.sub(one, text)


def _uncached(entries: Any, ctx: dict[str, Any]) -> tuple[str, ...]:
    return tuple(_subst(str(next(iter(e))), ctx) for e in entries or []
                 if isinstance(e, dict) and isinstance(next(iter(e.values())), dict)
                 and next(iter(e.values())).get("cache") is False)


def _paths(entries: Any, ctx: dict[str, Any]) -> tuple[str, ...]:
    out = []
    for e in entries or []:
        key = next(iter(e)) if isinstance(e, dict) else e
        out.append(_subst(str(key), ctx))
    return tuple(out)


def stages(root: str | Path = ".", params_file: str = "params.yaml") -> list[StageInfo]:
    """Every stage of ``root/dvc.yaml`` in file order."""
    root = Path(root)
    path = root / "dvc.yaml"
    if not path.is_file():
        path.read_text(encoding="utf-8")  # the OSError its callers report
    try:
        doc = load_yaml(path, what="dvc.yaml") or {}  # no anchors / aliases (stages/schema/base.py)
    except PipelineError as e:
        raise ValueError(str(e)) from None  # its callers report a bad dvc.yaml (ValueError) in one line
    try:
        params = load_yaml(root / params_file, what="params file") or {}
    except PipelineError:
        params = {}
    out: list[StageInfo] = []
    for group, st in (doc.get("stages") or {}).items():
        items: list[tuple[str, dict[str, Any]]]
        if "foreach" in st:
            fe = st["foreach"]
            m = _VAR.fullmatch(fe.strip()) if isinstance(fe, str) else None
            try:
                coll = _lookup(params, m.group(1).strip()) if m else fe
            except (KeyError, TypeError):
                coll = {}
            if isinstance(coll, dict):
                items = [(f"{group}@{k}", {"key": k, "item": v}) for k, v in coll.items()]
            else:
                items = [(f"{group}@{i}", {"key": i, "item": v}) for i, v in enumerate(coll or [])]
            body = st["do"]
        else:
            items, body = [(group, {})], st
        for name, extra in items:
            ctx = {**params, **extra}
            cmd = _subst(str(body.get("cmd", "")), ctx)
            m = re.search(r"-m\s+([\w.]+)", cmd)
            outs = _paths(body.get("outs"), ctx) + _paths(body.get("metrics"), ctx) + _paths(body.get("plots"), ctx)
            out.append(StageInfo(name=name, group=group, desc=_subst(str(body.get("desc") or st.get("desc") or ""), ctx),
                                 module=m.group(1) if m else None, outs=outs, deps=_paths(body.get("deps"), ctx),
                                 uncached=sum((_uncached(body.get(k), ctx) for k in ("outs", "metrics", "plots")), ())))
    return out


def resolve(names: list[str], known: list[StageInfo]) -> list[str]:
    """Stage addresses for command-line names: a stage's name, or a foreach group (``evaluate``: all of them).
    Raises ValueError with a one-line message (and close matches) for an unknown name."""
    by_name = {s.name: s for s in known}
    groups: dict[str, list[str]] = {}
    for s in known:
        groups.setdefault(s.group, []).append(s.name)
    out: list[str] = []
    for n in names:
        if n in by_name:
            out.append(n)
        elif n in groups:
            out.extend(groups[n])
        else:
            close = difflib.get_close_matches(n, [*by_name, *groups], n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise ValueError(f"unknown stage {n!r}{hint} (stages: {', '.join(by_name)})")
    return list(dict.fromkeys(out))


def locked(name: str, root: str | Path = ".") -> bool:
    """True when dvc.lock records stage ``name`` (so ``dvc checkout <name>`` restores its outputs)."""
    try:
        doc = load_yaml(Path(root) / "dvc.lock", what="dvc.lock") or {}
    except PipelineError:
        return False
    return name in (doc.get("stages") or {})


def git_outputs(name: str, root: str | Path = ".") -> list[str]:
    """Stage ``name``'s ``cache: false`` outputs (git records them; DVC removes them before a run), or []."""
    try:
        known = stages(root)
    except (OSError, ValueError):
        return []
    return [o for s in known if s.name == name for o in s.uncached]


def git_recorded(known: list[StageInfo]) -> list[str]:
    """What git must record for a clone to get a run with ``dvc pull``: dvc.lock and the folders of the ``cache: false``
    outputs (``data/dvclive``, ``data/metrics``, ``data/plots``), which DVC neither caches nor pushes, the run-cache
    included. The pipeline's closing hint and docs/pipeline.md#sharing-results-through-a-dvc-remote name this list."""
    def area(o: str) -> str:  # data/plots/corpus/rounds.tsv -> data/plots
        parts = Path(o).parts
        return "/".join(parts[:2]) if len(parts) > 2 else o
    return ["dvc.lock", *sorted({area(o) for s in known for o in s.uncached})]


def produced_paths(names: list[str], known: list[StageInfo]) -> set[str]:
    """The outputs of the named stages (normalised relative paths)."""
    chosen = set(names)
    return {str(Path(o)) for s in known if s.name in chosen for o in s.outs}

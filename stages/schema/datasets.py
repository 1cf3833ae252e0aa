"""What the ``testsets`` and ``ingest`` sections share: one data set to read and convert into pipeline rows."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator

from stages.schema.base import PosInt, Section

Adapter = Literal["pipeline", "gsm8k", "math", "instruct", "pal", "generic"]
"""How source rows become pipeline rows (stages/core/ingestion.py, ``ADAPTERS``)."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def check_names(v: dict[str, object]) -> dict[str, object]:
    """Data set names are file and stage names: lowercase letters, digits, underscores."""
    bad = [k for k in v if not _NAME.match(k)]
    if bad:
        raise ValueError(f"data set names must match [a-z][a-z0-9_]* (used in file and stage names): {bad}")
    return v


class HubSource(Section):
    """A data set on the Hugging Face hub, read with ``datasets.load_dataset(id, config, split=, revision=)``."""

    id: str
    """Hub dataset id (``openai/gsm8k``), or a local dataset directory (what load_dataset accepts)."""
    config: str | None = None
    """Configuration name (``main`` for GSM8K); null: the default."""
    split: str = "train"
    """Split to read (``train``, ``test``)."""
    revision: str | None = None
    """Commit sha or tag the data set is pinned to; null: unpinned (the latest; warned about, once per fetch)."""


class DatasetSpec(Section):
    """One data set: where it is, which adapter converts its rows, and how many rows are read."""

    path: str
    """The local copy: a JSONL / Parquet file, a directory of them, or a datasets save_to_disk directory (a dvc
    dependency of this data set's stage). With ``hub`` set: the snapshot ``python -m stages.ingest fetch`` writes."""
    hub: HubSource | None = None
    """null: a local data set; else its hub source (fetched to ``path`` first, pinned by ``revision``)."""
    adapter: Adapter
    """pipeline (the pipeline's own rows), gsm8k, math, instruct (MathInstruct: instruction, output, source), pal
    (input, code, target), generic (any columns, mapped by ``fields``)."""
    fields: dict[str, str] = {}
    """Column renames, adapter name -> source column (generic: pipeline field -> source column); {} = as named."""
    match: dict[str, str] = {}
    """Keep only rows whose column (key) matches the regular expression (value, searched); {} = every row."""
    limit: PosInt | None = None
    """Read at most this many rows (the first ones, before any skip); null: all."""

    @field_validator("match")
    @classmethod
    def _check_match(cls, v: dict[str, str]) -> dict[str, str]:
        for col, pattern in v.items():
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"match.{col}: {pattern!r} is not a regular expression ({e})") from None
        return v

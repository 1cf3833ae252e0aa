"""Placeholder until the crawl generator lands (owned by the corpus work)."""
from __future__ import annotations
from typing import Any


def generate(p: Any, *, seed: int, test_problems: list[dict], crawl_path: Any, seed_path: Any) -> dict[str, Any]:
    raise NotImplementedError("crawl generator not written yet")

"""benchmarks/r1_zero.py: its params edits for --build and its --train variants are valid grpo params."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stages.params import resolve

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import r1_zero  # noqa: E402

from stages.params import load_params  # noqa: E402


def test_set_key_edits_nested_values_and_refuses_unknown_keys() -> None:
    doc = resolve(ROOT / "params.yaml")
    r1_zero.set_key(doc, "data.crawl.r1_share", "0.25")
    r1_zero.set_key(doc, "pretrain.train.steps", "1200")
    assert doc["data"]["crawl"]["r1_share"] == 0.25 and doc["pretrain"]["train"]["steps"] == 1200
    with pytest.raises(SystemExit, match="no such key"):
        r1_zero.set_key(doc, "pretrain.train.stepz", "1")


@pytest.mark.parametrize("variant", sorted(r1_zero.VARIANTS))
def test_every_variant_is_a_valid_grpo_section(variant: str) -> None:
    base = load_params(ROOT / "params.yaml").grpo
    p = base.updated({"start": "pretrain", **r1_zero.VARIANTS[variant]})
    assert p.template == "r1" and p.start == "pretrain"
    assert p.rollout.max_new_tokens == r1_zero.VARIANTS[variant].get("rollout.max_new_tokens",
                                                                      base.rollout.max_new_tokens)

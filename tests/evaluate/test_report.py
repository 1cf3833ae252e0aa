"""The markdown summary table built from evaluate metrics files."""

from __future__ import annotations

import json
from pathlib import Path

from stages.evaluate.report import load_all, markdown


def test_table_from_metrics_files(tmp_path: Path) -> None:
    sft = {"model": "sft", "prompting": "zero_shot", "wall_s": 3.0, "generated": {
        "cot": {"greedy": {"acc": 0.5}, "sample": {"n_samples": 4, "pass@1": 0.4, "pass@4": 0.8, "maj@1": 0.4,
                                                    "maj@4": 0.55}},
        "pot": {"greedy": {"acc": 0.25}}}}
    base = {"model": "base", "prompting": "few_shot", "generated": {"cot": {"greedy": {"acc": 0.0}}}}
    (tmp_path / "evaluate_sft.json").write_text(json.dumps(sft))
    (tmp_path / "evaluate_base.json").write_text(json.dumps(base))
    (tmp_path / "sft.json").write_text("{}")  # another stage's metrics are ignored
    table = markdown(load_all(tmp_path)).splitlines()
    assert table[0].startswith("| model | benchmark | mode | greedy |")
    assert table[2:] == [
        "| base | generated | cot | 0.000 |  |  |  |  |  |",
        "| sft | generated | cot | 0.500 | 0.400 | 0.800 | 0.400 | 0.550 | 4 |",
        "| sft | generated | pot | 0.250 |  |  |  |  |  |",
    ]

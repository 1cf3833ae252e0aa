"""Exact step labels as process rewards (process_rule): each step line checked against the problem's known running
values (the labeller the PRM is trained on: an oracle PRM, not in the paper); needs rows with ``values``."""

from stages.rl.registry import RewardSourceSpec

SOURCES = (
    RewardSourceSpec("process_rule", "exact step labels from the rows' running values (an oracle PRM)",
                     supervision="process", row_fields=("values",), build="stages.rl.rm.source:step_label_source"),
)

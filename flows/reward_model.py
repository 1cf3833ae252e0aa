"""Prefect flow of the ``reward_model`` stage (dvc.yaml: reward_model). Run: ``python -m flows.reward_model``."""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("reward_model")

from typing import Any

from prefect import flow

from flows._common import log_section, main, publish_metrics
from stages.schema.reward_model import RewardModelParams


@flow(name="reward_model")
def reward_model_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Sample the SFT policy, label the samples, train and evaluate the reward model."""
    from stages import reward_model

    p = RewardModelParams.from_file(params_path)
    log_section("reward_model", p)
    metrics = reward_model.run(p)
    publish_metrics("reward_model", metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(reward_model_flow, "reward_model"))

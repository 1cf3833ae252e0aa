"""The reward_model stage end to end on a tiny random model: outputs, metrics, both labelling methods."""

from __future__ import annotations

import json

import pytest
import torch

from stages import reward_model
from stages.core import paths
from stages.params import RewardModelParams
from stages.rl.reward_model import load_examples, load_reward_model

torch.set_num_threads(1)


def rm_params(**over) -> RewardModelParams:
    raw = dict(seed=0, init="sft", prompts_file=None, questions=6, samples_per_question=2, temperature=1.0,
               max_new_tokens=12, backend="hf", labels="values", rollouts_per_step=2, train_on="process",
               heldout_fraction=0.34, epochs=1, lr=1e-3, batch_size=4, best_of_n=2, num_threads=1, checkpoint_every=0)
    raw.update(over)
    return RewardModelParams.model_validate(raw)


@pytest.mark.parametrize("labels", ["values", "rollouts"])
def test_reward_model_stage_writes_model_examples_and_metrics(project, labels):
    m = reward_model.run(rm_params(labels=labels))
    saved = json.loads(paths.metrics_file("reward_model").read_text())
    assert saved == json.loads(json.dumps(m))
    assert saved["n_train_examples"] == 8 and saved["n_heldout_examples"] == 4  # 4 + 2 questions x 2 samples
    for key in ("outcome_auc", "step_auc", "wall_s", "loss_per_epoch", "heldout_before_training"):
        assert key in saved
    rm = load_reward_model(paths.REWARD_MODEL)
    assert rm.config.num_labels == 1
    ex = load_examples(paths.REWARD_MODEL)
    assert len(ex) == 8 and all(len(e["step_ends"]) == len(e["step_labels"]) >= 1 for e in ex)
    assert all(e["step_labels"][-1] == e["outcome"] for e in ex)
    held = [json.loads(x) for x in (paths.REWARD_MODEL / "heldout.jsonl").read_text().splitlines()]
    assert not {e["id"] for e in held} & {e["id"] for e in ex}  # split by question


def test_values_labels_need_values_field(project):
    rows = [json.loads(x) for x in paths.RL_PROMPTS.read_text().splitlines()]
    for r in rows:
        del r["values"]
    paths.RL_PROMPTS.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from stages.core.errors import PipelineError

    with pytest.raises(PipelineError, match="values"):
        reward_model.run(rm_params())

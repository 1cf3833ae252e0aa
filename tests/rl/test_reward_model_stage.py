"""The reward_model stage end to end on a tiny random model: outputs, metrics, both labelling methods."""

from __future__ import annotations

import json

import pytest
import torch

from stages import reward_model
from stages.core import paths
from stages.core.io import untimed
from stages.params import RewardModelParams
from stages.rl.rm.model import load_examples, load_reward_model

torch.set_num_threads(1)


def rm_params(**over) -> RewardModelParams:
    raw = dict(enabled=True, seed=0, init="sft", prompts_file="data/corpus/problems/rl.jsonl", questions=6,
               samples_per_question=2, temperature=1.0, max_new_tokens=12, backend="hf", labels="values",
               rollouts_per_step=2, train_on="process", heldout_fraction=0.34, epochs=1, lr=1e-3, batch_size=4,
               best_of_n=2, num_threads=1, attn_implementation="sdpa", gradient_checkpointing=False, precision="fp32",
               deepspeed=dict(enabled=False, zero_stage=2, offload_optimizer=False), checkpoint_every=0)
    raw.update(over)
    return RewardModelParams.model_validate(raw)


@pytest.mark.parametrize("labels", ["values", "rollouts"])
def test_reward_model_stage_writes_model_examples_and_metrics(project, labels):
    m = reward_model.run(rm_params(labels=labels))
    saved = json.loads(paths.details_file("reward_model").read_text())
    assert saved == untimed(json.loads(json.dumps(m)))  # the timings are in data/timings/reward_model.json
    assert saved["n_train_examples"] == 8 and saved["n_heldout_examples"] == 4  # 4 + 2 questions x 2 samples
    for key in ("outcome_auc", "step_auc", "loss_per_epoch", "heldout_before_training"):
        assert key in saved
    assert json.loads(paths.timings_file("reward_model").read_text())["wall_s"] == m["wall_s"] > 0
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


def test_metrics_hold_the_exact_label_auc_and_best_of_n(project):
    m = reward_model.run(rm_params(samples_per_question=3, best_of_n=3))
    assert set(m["heldout"]) >= {"outcome_auc", "step_auc", "step_auc_values", "best_of_n"}
    bon = m["best_of_n"]
    assert bon["n"] == 3 and bon["questions"] == 2  # 6 questions x 0.34 held out -> 2
    assert 0.0 <= bon["random"] <= bon["oracle"] <= 1.0 and bon["gain"] == pytest.approx(bon["rm_last"] - bon["random"],
                                                                                          abs=1e-4)
    assert m["labelling"]["sampled"] == 18 and m["labelling"]["resumed"] is False
    assert m["init"] == "sft" and m["resumed_from_step"] is None
    with pytest.raises(ValueError, match="best_of_n"):
        rm_params(samples_per_question=2, best_of_n=3)


def test_interrupted_stage_resumes_from_its_examples_and_training_checkpoint(project, monkeypatch):
    """Killed after 3 optimizer steps, the stage restarts from the checkpointed examples (no new sampling) and
    training state, and ends with the same RM and metrics as an uninterrupted run; then its checkpoints are gone."""
    from safetensors.torch import load_file

    p = rm_params(questions=8, samples_per_question=2, epochs=2, batch_size=2, checkpoint_every=1)
    want = reward_model.run(p)
    w_want = load_file(str(paths.REWARD_MODEL / "model.safetensors"))
    assert not any((paths.CHECKPOINTS / "reward_model").iterdir())

    real = reward_model.save_checkpoint

    def crash_after_3(*a, **kw):
        real(*a, **kw)
        if kw["step"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(reward_model, "save_checkpoint", crash_after_3)
    with pytest.raises(KeyboardInterrupt):
        reward_model.run(p)
    monkeypatch.setattr(reward_model, "save_checkpoint", real)
    monkeypatch.setattr(reward_model, "collect_examples", lambda *a, **k: pytest.fail("sampled again"))
    got = reward_model.run(p)
    assert got["resumed_from_step"] == 3 and got["labelling"]["resumed"] is True
    for key in ("outcome_auc", "step_auc", "step_auc_values", "loss_per_epoch", "heldout_before_training", "best_of_n"):
        assert got[key] == pytest.approx(want[key], rel=1e-5) if not isinstance(want[key], dict) else got[key] == want[key]
    w_got = load_file(str(paths.REWARD_MODEL / "model.safetensors"))
    for k, v in w_want.items():
        assert torch.allclose(v, w_got[k], atol=1e-6), k
    assert not any((paths.CHECKPOINTS / "reward_model").iterdir())


def test_init_from_the_pretrained_model(project, tiny_model_dir):
    """init: pretrain starts the RM's backbone from data/models/pretrain (the paper: DeepSeekMath-Base), while the
    samples still come from the SFT model; a missing init model is a one-line error naming it."""
    from stages.core.errors import PipelineError
    from stages.rl.rm.model import init_reward_model
    from tests.rl.conftest import make_tiny_model_dir

    with pytest.raises(PipelineError, match="reward_model.init: pretrain"):
        reward_model.run(rm_params(init="pretrain"))
    make_tiny_model_dir(paths.PRETRAIN_MODEL, seed=1)
    p = rm_params(init="pretrain", epochs=1, lr=1e-9)  # ~no training: the backbone stays the init's
    m = reward_model.run(p)
    assert m["init"] == "pretrain"
    assert json.loads((paths.REWARD_MODEL / "pipeline.json").read_text())["init"] == str(paths.PRETRAIN_MODEL)
    rm = load_reward_model(paths.REWARD_MODEL)
    ref_pre, ref_sft = init_reward_model(paths.PRETRAIN_MODEL), init_reward_model(paths.SFT_MODEL)
    k = "model.layers.0.mlp.up_proj.weight"
    assert torch.allclose(rm.state_dict()[k], ref_pre.state_dict()[k], atol=1e-6)
    assert not torch.allclose(rm.state_dict()[k], ref_sft.state_dict()[k], atol=1e-3)

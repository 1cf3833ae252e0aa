"""Iterative GRPO (paper Algorithm 1) on tiny models: I = 2 with a reward model and replay.

Checks: the reference model is reset to the policy at the start of every iteration (the k3 KL of the
first step of each iteration is exactly 0, while the policy had moved away from the previous reference),
the RM update replays the requested fraction of the historical examples, and both iterations' policy and
reward model are written and differ."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from stages import grpo
from stages.core import paths
from stages.core.modeling import load_tokenizer
from stages.rl.iterative import INDEX_FILE
from stages.rl.rm.model import init_reward_model, load_examples, save_reward_model

from .test_grpo_stage import tiny_params
from .test_reward_model import _examples

torch.set_num_threads(1)


@pytest.fixture
def rm_project(project):
    """``project`` plus an initial reward model (data/models/reward_model)."""
    tok = load_tokenizer(paths.SFT_MODEL)
    torch.manual_seed(0)
    save_reward_model(init_reward_model(paths.SFT_MODEL), tok, paths.REWARD_MODEL, _examples(tok, 20), None, {"stage": "test"})
    return project


def _iter_params(source: str, iterations: int = 2, replay: float = 0.5):
    return tiny_params(reward__source=source, steps=2, checkpoint_every=0, baseline=dict(enabled=False, lr=1e-3),
                       iterative__iterations=iterations, iterative__rm__replay_fraction=replay)


@pytest.mark.parametrize("source", ["process_rm", "outcome_rm"])
def test_two_iterations_reset_reference_replay_and_write_models(rm_project, source):
    m = grpo.run(_iter_params(source))
    its = m["iterations"]
    assert [i["iteration"] for i in its] == [1, 2] and m["grpo"]["steps"] == 4
    # reference reset: KL is exactly 0 at the first step of each iteration, not at the step before iteration 2
    kl = [float(x.split(",")[1]) for x in (paths.plots_dir("grpo") / "kl.csv").read_text().splitlines()[1:]]
    assert kl[0] == 0.0 and kl[2] == 0.0 and kl[1] > 0.0
    assert its[0]["kl_first_step"] == 0.0 and its[1]["kl_first_step"] == 0.0
    # replay: iteration 2 replays round(0.5 * history), history = initial examples + iteration 1's new ones
    n0 = len(load_examples(paths.REWARD_MODEL))
    r1, r2 = its[0]["rm"], its[1]["rm"]
    assert r1["n_history"] == n0 and r1["n_replayed"] == round(0.5 * n0)
    assert r2["n_history"] == n0 + r1["n_new_examples"] and r2["n_replayed"] == round(0.5 * r2["n_history"])
    assert r2["n_trained"] == r2["n_new_examples"] + r2["n_replayed"]
    # outputs: iteration 1's policy, both RMs, the final policy; all different
    index = json.loads((paths.GRPO_ITERS / INDEX_FILE).read_text())
    assert [e["policy"] for e in index["iterations"]] == [str(paths.GRPO_ITERS / "iter1"), None]
    assert [e["reward_model"] for e in index["iterations"]] == [str(paths.GRPO_ITERS / f"rm_iter{k}") for k in (1, 2)]
    w_sft, w1, w2 = (load_file(str(d / "model.safetensors")) for d in (paths.SFT_MODEL, paths.GRPO_ITERS / "iter1", paths.GRPO_MODEL))
    assert any(not torch.equal(w_sft[k], w1[k]) for k in w1) and any(not torch.equal(w1[k], w2[k]) for k in w1)
    rm0, rm1, rm2 = (load_file(str(d / "model.safetensors")) for d in
                     (paths.REWARD_MODEL, paths.GRPO_ITERS / "rm_iter1", paths.GRPO_ITERS / "rm_iter2"))
    assert any(not torch.equal(rm0[k], rm1[k]) for k in rm0) and any(not torch.equal(rm1[k], rm2[k]) for k in rm1)
    assert len(load_examples(paths.GRPO_ITERS / "rm_iter2")) == r2["n_history"] + r2["n_new_examples"]


def test_rule_reward_iterations_write_policies_only(rm_project):
    m = grpo.run(_iter_params("rule", iterations=2))
    assert len(m["iterations"]) == 2 and "rm" not in m["iterations"][0]
    assert (paths.GRPO_ITERS / "iter1" / "config.json").is_file()
    assert not (paths.GRPO_ITERS / "rm_iter1").exists()


def test_untimed_drops_timings_and_resume_markers_from_cached_outputs():
    """What goes into DVC-cached files (grpo's pipeline.json summary / iterations, iterations.json, an RM's
    pipeline.json) keeps the results and drops the seconds, time totals, rates and resume markers."""
    from stages.core.io import untimed

    summary = {"steps": 2, "reward_mean_first5": 0.25, "t_generation_total": 1.0, "cpu_update_total": 2.0,
               "step_s_total": 3.0, "step_s_mean": 1.5, "tool_wait_s_total": 1.0, "tool_programs_per_s": 2.0,
               "tool_wait_share_of_step": 0.1, "tool_programs_total": 3, "n_reward_failures": 0}
    assert untimed(summary) == {"steps": 2, "reward_mean_first5": 0.25, "tool_programs_total": 3,
                                "n_reward_failures": 0}
    its = [{"iteration": 1, "grpo_s": 3.0, "resumed_from_step": 4, "accuracy_mean": 0.5,
            "rm": {"rm_update_s": 2.0, "n_new_examples": 8, "heldout_after_update": {"outcome_auc": 0.75}}}]
    assert untimed(its) == [{"iteration": 1, "accuracy_mean": 0.5,
                             "rm": {"n_new_examples": 8, "heldout_after_update": {"outcome_auc": 0.75}}}]

"""The GRPO update under DeepSpeed (CPU accelerator, one process, gloo, fp32): ZeRO-0/1/2 give the plain update's
grad norms and weights after two steps (same rollouts: the hf backend samples deterministically; online RFT with
scripted outputs, 3 of 4 correct)."""

from __future__ import annotations

import importlib

import pytest
import torch

from stages.core import paths
from stages.core.modeling import load_model, load_tokenizer
from stages.rl import loop
from stages.rl.data import load_prompts

from ._launch import free_port, one_and_two_ranks
from .test_grpo_stage import rl_train, tiny_params
from .test_paradigm import ScriptedGenerator, _texts

torch.set_num_threads(1)


@pytest.fixture
def ds_env(monkeypatch: pytest.MonkeyPatch):
    """A world of one CPU process (as tests/train/test_deepspeed.py); the env vars vanish after the test."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    monkeypatch.setattr(ds_torch, "build_shm_op", lambda: None)  # multi-rank CPU speed-up only; skip its JIT build
    port = free_port()
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)


def _train(p) -> tuple[dict[str, torch.Tensor], list[dict]]:
    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    hist, _, info = rl_train(model, tok, rows, p, ckpt_dir=None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, hist + [info]


@pytest.mark.parametrize(("algorithm", "stage"), [("grpo", 2), ("online_rft", 2), ("grpo", 1), ("grpo", 0)])
def test_zero_update_matches_plain(ds_env, project, monkeypatch, algorithm, stage) -> None:
    kw = dict(algorithm=algorithm, steps=2, optim__micro_batch_size=4, checkpoint_every=0)
    if algorithm == "online_rft":  # a random model is never right: scripted outputs, 3 of 4 correct
        tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
        monkeypatch.setattr(loop, "rollout_generator", lambda *a, **k: ScriptedGenerator(tok, rows, _texts))
    plain, hp = _train(tiny_params(**kw))
    ds, hd = _train(tiny_params(**kw, deepspeed=dict(enabled=True, zero_stage=stage, offload_optimizer=False)))
    assert hd[-1]["deepspeed_zero_stage"] == stage and hp[-1]["deepspeed_zero_stage"] is None
    assert all(h["optimizer_steps"] == 1 for h in hp[:-1])  # every step updated
    for a, b in zip(hp[:-1], hd[:-1], strict=True):
        assert a["optimizer_steps"] == b["optimizer_steps"] and a["n_train_outputs"] == b["n_train_outputs"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert max(float((plain[k] - ds[k]).abs().max()) for k in plain) < 1e-6


def test_nonfinite_loss_under_deepspeed_is_skipped(ds_env, project, monkeypatch) -> None:
    """A NaN loss: the rest of the accumulation runs as zero-gradient dummies and the step at LR 0 (no update)."""
    import math

    from stages.rl.losses import POLICY_LOSSES

    real = POLICY_LOSSES.impls["clipped"]

    def nan_loss(*a, **k):
        loss, m = real(*a, **k)
        return loss * math.nan, m

    monkeypatch.setitem(POLICY_LOSSES.impls, "clipped", nan_loss)
    before = {k: v.clone() for k, v in load_model(paths.SFT_MODEL).state_dict().items()}
    after, h = _train(tiny_params(steps=1, optim__micro_batch_size=4, checkpoint_every=0,
                                  deepspeed=dict(enabled=True, zero_stage=2, offload_optimizer=False)))
    assert h[0]["skipped_nonfinite"] == 1 and h[0]["optimizer_steps"] == 0
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_two_ranks_give_the_one_process_update(project, tmp_path) -> None:
    """torchrun, 2 CPU ranks, ZeRO-2: 3 questions per step split 2 / 1 (uneven micro-batch counts, so rank 1 runs a
    dummy backward); with the same (scripted) rollouts the grad norms and weights equal one plain process's."""
    pytest.importorskip("deepspeed")
    one, two = one_and_two_ranks(project, "grpo")
    assert sorted(r["rank"] for r in two) == [0, 1] and all(r["world"] == 2 for r in two)
    for r in two:
        assert r["steps"] == one["steps"] == [1, 1]
        assert r["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
        assert r["checksum"] == pytest.approx(one["checksum"], abs=1e-4)


@pytest.mark.slow
def test_two_ranks_rm_retraining_and_baseline_equal_one_process(project) -> None:
    """torchrun, 2 CPU ranks, ZeRO-2: an RM update of iterative RL (the ranks sample a block of the problems each,
    gather the labelled examples, score a block of the held-out set each and train on half of every batch) and
    the continued-SFT baseline (3 questions per step at micro-batch 1: rank 1 pads with a zero-gradient pass) give
    one plain process's examples, losses, AUCs and weights."""
    pytest.importorskip("deepspeed")
    one, two = one_and_two_ranks(project, "rm_baseline")
    assert sorted(r["rank"] for r in two) == [0, 1] and one["n_new"] > 0
    for r in two:
        assert r["n_new"] == one["n_new"] and r["auc_after"] == one["auc_after"]
        assert r["rm_loss"] == pytest.approx(one["rm_loss"], rel=1e-5)
        assert r["rm_checksum"] == pytest.approx(one["rm_checksum"], abs=1e-4)
        assert r["baseline_loss"] == pytest.approx(one["baseline_loss"], rel=1e-5)
        assert r["baseline_checksum"] == pytest.approx(one["baseline_checksum"], abs=1e-4)

"""The pure RL functions of issues 31 / 32 agree with TRL's own code on the same tensors to 1e-6 (the harness of
benchmarks/rl_math_vs_trl.py: a real GRPOTrainer with injected log-probs and rollouts). Skipped when trl is not
installed (pyproject extra ``bench``; .ci/run installs it for this file)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from benchmarks.rl_math_vs_trl import (  # noqa: E402
    CORRECTION_CASES,
    LOSS_CASES,
    build_harness,
    case,
    compare_correction,
    compare_loss,
    compare_overlong,
    trl_loss,
)
from stages.rl.losses import grpo_loss  # noqa: E402
from tests.rl.conftest import make_tiny_model_dir  # noqa: E402

TOL = 1e-6


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    torch.set_num_threads(1)
    return build_harness(make_tiny_model_dir(tmp_path_factory.mktemp("trl") / "model"))


@pytest.mark.parametrize("method,low,high", CORRECTION_CASES)
def test_is_correction_matches_trl(harness, method, low, high):
    for seed in range(2):
        r = compare_correction(harness, case(seed), method, low, high)
        assert r["nonzero_weights"] > 0
        assert max(v for k, v in r.items() if k != "nonzero_weights") <= TOL, r


@pytest.mark.parametrize("kind,aggregation,is_method", LOSS_CASES)
def test_losses_match_trl(harness, kind, aggregation, is_method):
    for seed in range(2):
        r = compare_loss(harness, case(seed), kind, aggregation, is_method=is_method)
        assert r["loss"] <= TOL and r["grad_logp"] <= TOL and r["grad_entropy"] <= TOL, r
        assert r["grad_logp_norm"] > 1e-3  # a non-trivial gradient was compared
        if kind == "entropy":
            assert r["grad_entropy_norm"] > 1e-4


def test_overlong_penalty_matches_trl():
    assert compare_overlong()["penalty"] <= 1e-12


def test_the_harness_sees_a_real_difference(harness):
    """Negative control: TRL's "grpo" (seq-mean-token-mean) against our token-mean differs well beyond the tolerance,
    so the agreements above are not a comparison of a function with itself."""
    c = case(0)
    m = c["mask"] * c["tool"]
    lp = c["logp"].clone().requires_grad_(True)
    theirs = trl_loss(harness, logp=lp, old=c["old"], ref=None, adv=c["adv"], mask=c["mask"], tool_mask=c["tool"],
                      loss_type="grpo")  # fmt: skip
    ours, _ = grpo_loss(lp, c["old"], None, c["adv"], m, clip_eps=0.2, beta=0.0, aggregation="token-mean")
    assert abs(theirs.item() - ours.item()) > 1e-3

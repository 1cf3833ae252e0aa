"""The checked weight sync (issue 31 item 2; stages/rl/sync.py): after every sync the sampler and the trainer agree on
the probe (bit for bit with the hf sampler in float32), and a planted skip of the sync stops the run at the next step
with WeightSyncError and its numbers. The same on the vllm backend: tests/rl/test_sync_vllm.py (.venv-vllm)."""

from __future__ import annotations

import copy

import pytest

from stages.core.generation import HFGenerator
from stages.rl.sync import WeightSyncError, planted_skip

from .test_grpo_stage import _load, rl_train, tiny_params


def test_hf_fp32_agrees_bit_for_bit_after_every_sync(project):
    model, tok, rows = _load()
    # a sampler holding its own copy of the policy: the sync really copies weights
    hist, _, info = rl_train(
        model, tok, rows, tiny_params(steps=3), ckpt_dir=None, generator=HFGenerator(copy.deepcopy(model), tok)
    )
    assert info["sync_probe_max_abs"] == 0.0  # the sync before step 0
    assert [r["sync_probe_max_abs"] for r in hist] == [0.0, 0.0, 0.0]


def test_a_planted_skip_of_the_sync_fails_at_the_next_step_with_its_message(project):
    model, tok, rows = _load()
    done = []
    with planted_skip(before_step=2), pytest.raises(WeightSyncError) as err:
        rl_train(
            model,
            tok,
            rows,
            tiny_params(steps=4),
            ckpt_dir=None,
            generator=HFGenerator(copy.deepcopy(model), tok),
            on_step=done.append,
        )
    msg = str(err.value)
    assert [r["step"] for r in done] == [0]  # step 1's update ran, its sync was skipped: step 2 never samples
    assert msg.startswith(
        "weight sync before step 2: the sampler's (hf, fp32) log-probs on the probe differ from the "
        "trainer's by up to "
    )
    assert "> grpo.sync.tolerance.hf_fp32 = 0" in msg and "\n" not in msg
    print(msg)  # shown by pytest -s: the numbers a user sees


def test_a_skip_at_the_start_of_the_run_is_caught_too(project):
    model, tok, rows = _load()
    stale = copy.deepcopy(model)
    for t in stale.parameters():  # a sampler on other weights before the first step (the base weights reloaded)
        t.data.mul_(1.01)
    with planted_skip(before_step=0), pytest.raises(WeightSyncError, match="weight sync before step 0"):
        rl_train(model, tok, rows, tiny_params(steps=1), ckpt_dir=None, generator=HFGenerator(stale, tok))


def test_bf16_sampler_within_its_tolerance_and_refused_at_zero(project):
    model, tok, rows = _load()
    p = tiny_params(steps=2, compute__precision="bf16")  # bf16 autocast update, the hf sampler from a bf16 copy
    hist, _, info = rl_train(model, tok, rows, p, ckpt_dir=None)
    gaps = [info["sync_probe_max_abs"]] + [r["sync_probe_max_abs"] for r in hist]
    assert all(0.0 < g <= p.sync.tolerance.hf_bf16 for g in gaps)
    model, tok, rows = _load()
    strict = tiny_params(steps=1, compute__precision="bf16", sync__tolerance=dict(hf_bf16=0.0))
    with pytest.raises(WeightSyncError, match=r"before step 0: the sampler's \(hf, bf16\).*hf_bf16 = 0"):
        rl_train(model, tok, rows, strict, ckpt_dir=None)


def test_no_probe_when_off_or_the_generator_cannot_score(project):
    model, tok, rows = _load()
    hist, _, info = rl_train(model, tok, rows, tiny_params(steps=1, sync=dict(probe_tokens=0)), ckpt_dir=None)
    assert "sync_probe_max_abs" not in hist[0] and "sync_probe_max_abs" not in info

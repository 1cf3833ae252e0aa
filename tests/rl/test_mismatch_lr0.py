"""Sampling parameters the loss can trust (issue 31 item 3): at learning rate 0 for 20 steps the sampler-trainer
mismatch stays flat and below 1e-3 on CPU for every allowed sampling setting (top-k / top-p handled exactly: both
sides use the truncated, renormalised distribution the sampler drew from), while the untruncated trainer log-probs
the loss used before would be off by log p(kept set) per token (vLLM RFC #42259's log(S) bias). The vllm backend's
table: benchmarks/sampler_mismatch.py --lr0 (docs/results/rl.md)."""

from __future__ import annotations

import pytest
import torch

from stages.rl.rollout import token_logprobs

from .test_grpo_stage import _load, rl_train, tiny_params

torch.set_num_threads(1)

SETTINGS = [  # (temperature, top_p, top_k)
    (1.0, 1.0, 0),
    (1.0, 0.9, 0),
    (1.0, 1.0, 20),
    (0.7, 0.8, 10),
]


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_mismatch_stays_flat_at_lr_0(project, monkeypatch, temperature, top_p, top_k):
    import stages.rl.loop as step_mod

    bias = []  # the untruncated trainer's log-probs against the sampler's (what the loss used before)
    real = step_mod.update

    def measure(run, models, batch, tg, lp):
        ro = batch.rollout
        with torch.no_grad():
            full, _ = token_logprobs(models.policy, ro.input_ids, ro.attention_mask, ro.prompt_len, temperature)
        m = ro.completion_mask.bool()
        bias.append(float((ro.sampler_logprobs - full)[m].mean()))
        return real(run, models, batch, tg, lp)

    monkeypatch.setattr(step_mod, "update", measure)
    model, tok, rows = _load()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    p = tiny_params(
        steps=20,
        optim__lr=0.0,
        rollout__temperature=temperature,
        rollout__top_p=top_p,
        rollout__top_k=top_k,
        advantage__skip_zero_std_groups=False,
        checkpoint_every=0,
    )
    hist, _, _ = rl_train(model, tok, rows, p, ckpt_dir=None)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # lr 0: the policy never moves
    worst = [r["mismatch_abs_max"] for r in hist]
    assert len(worst) == 20 and max(worst) < 1e-3, worst
    assert all(r["sync_probe_max_abs"] == 0.0 for r in hist)
    truncating = top_p < 1.0 or top_k > 0
    if truncating:  # the renormalisation the exact handling accounts for: log(1 / p(kept)) > 0 per token
        assert min(bias) > 1e-3
    else:
        assert max(abs(b) for b in bias) < 1e-5
    print(
        f"T={temperature} top_p={top_p} top_k={top_k}: mismatch max {max(worst):.2e} (first 5 steps "
        f"{max(worst[:5]):.2e}, last 5 {max(worst[-5:]):.2e}); untruncated bias {sum(bias) / len(bias):.3f}"
    )

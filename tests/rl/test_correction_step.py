"""The rollout correction wired into the RL step (issue 31 item 1; ``grpo.correction``): registry and params checks,
the weights the loss gets, the step's metrics, and micro-batch independence. The pure functions against loop
references: tests/rl/test_corrections.py; against TRL on the same tensors: tests/benchmarks/test_rl_math_vs_trl.py.

The sampler here is the hf generator with its reported log-probs shifted by a deterministic per-token offset (a
mismatched sampler: what vLLM's kernels or precision give in real mode), so that the ratio pi_old / pi_sampler
spreads over [0.6, 1.6] and truncation / rejection act."""

from __future__ import annotations

import math

import pytest
import torch

from stages.core.generation import Completion, HFGenerator
from stages.rl.corrections import CORRECTIONS, IS_METHODS, correct, step_metrics
from stages.rl.losses import POLICY_LOSSES

from .test_grpo_stage import _load, rl_train, tiny_params


class ShiftedSampler(HFGenerator):
    """The hf sampler with log-probs reported ``shift(token position)`` off (tokens and text unchanged)."""

    def generate_ids(self, prompt_ids, sp):
        out = super().generate_ids(prompt_ids, sp)
        return [
            [
                Completion(
                    c.text,
                    c.token_ids,
                    [
                        lp + 0.5 * math.sin(3.0 * t + tok)
                        for t, (lp, tok) in enumerate(zip(c.logprobs, c.token_ids, strict=True))
                    ],
                    c.finish_reason,
                )
                for c in group
            ]
            for group in out
        ]


def test_every_correction_is_registered_with_its_spec():
    for name in CORRECTIONS.names():
        assert CORRECTIONS.get(name) is CORRECTIONS.spec(name)  # each preset is declared once, as its spec
    assert set(CORRECTIONS.impls) == set(CORRECTIONS.names()) == {"none", *IS_METHODS}


def test_params_refuse_bad_corrections_in_one_line():
    with pytest.raises(ValueError, match=r"unknown rollout correction 'vtrace'; registered: none, tis"):
        tiny_params(correction=dict(method="vtrace"))
    with pytest.raises(ValueError, match=r"method tis needs a threshold: set high"):
        tiny_params(correction=dict(method="tis", low=None, high=None))
    with pytest.raises(ValueError, match=r"low \(3.0\) exceeds high \(2.0\)"):
        tiny_params(correction=dict(method="mis", low=3.0, high=2.0))
    with pytest.raises(
        ValueError, match=r"correction.method tis: the nll policy loss of algorithm online_rft takes no"
    ):
        tiny_params(algorithm="online_rft", correction=dict(method="tis"))
    assert tiny_params(correction=dict(method="none", low=None, high=None)).correction.method == "none"


def _run(p, monkeypatch, record=None):
    model, tok, rows = _load()
    real = POLICY_LOSSES.impls["clipped"]

    def spy(lp, old, ref, w, mask, cfg, norm, settings, **kw):
        if record is not None:
            record.append({"old": old.detach().clone(), "mask": mask.clone(), "is_weights": kw.get("is_weights")})
        return real(lp, old, ref, w, mask, cfg, norm, settings, **kw)

    monkeypatch.setitem(POLICY_LOSSES.impls, "clipped", spy)
    hist, _, _ = rl_train(model, tok, rows, p, ckpt_dir=None, generator=ShiftedSampler(model, tok))
    return hist


@pytest.mark.parametrize("method", ["tis", "seq-mis", "mis"])
def test_the_loss_gets_the_corrections_weights_and_the_step_reports_them(project, monkeypatch, method):
    calls = []
    p = tiny_params(
        steps=1,
        sync=dict(probe_tokens=0),
        correction=dict(method=method, low=0.8, high=1.25),
        advantage__skip_zero_std_groups=False,
    )
    captured = {}
    import stages.rl.loop as step_mod

    real_update = step_mod.update

    def grab(run, models, batch, tg, lp):  # the step's rollout and loss mask, to recompute the weights independently
        captured.update(ro=batch.rollout, mask=tg.loss_mask, rows=tg.train_rows)
        return real_update(run, models, batch, tg, lp)

    monkeypatch.setattr(step_mod, "update", grab)
    (row,) = _run(p, monkeypatch, calls)
    ro, rows = captured["ro"], captured["rows"]
    # one micro-batch call per slice of micro_batch_size rows, in order: rebuild the (N, T) trainer log-probs
    old = torch.zeros_like(captured["mask"])
    starts = list(range(0, rows.numel(), p.optim.micro_batch_size))
    assert len(calls) == len(starts)
    for c, s in zip(calls, starts, strict=True):
        sl = rows[s : s + p.optim.micro_batch_size]
        t = c["old"].shape[1]
        old[sl, :t] = c["old"]
        want = correct(method, c["old"], ro.sampler_logprobs[sl, :t], c["mask"], low=0.8, high=1.25).weights
        assert c["is_weights"] is not None and torch.equal(c["is_weights"], want)
    trained = torch.zeros_like(captured["mask"])
    trained[rows] = (captured["mask"][rows] > 0).float()
    whole = correct(method, old, ro.sampler_logprobs, trained, low=0.8, high=1.25).metrics
    for k in (
        "is_ratio_mean",
        "is_ratio_max",
        "is_weight_mean",
        "is_ess",
        "is_truncated_high_frac",
        "is_rejected_token_frac",
        "is_rejected_seq_frac",
    ):
        assert row[k] == pytest.approx(whole[k], rel=1e-9, abs=1e-12), k
    assert row["is_ratio_max"] > 1.25 or row["is_ratio_min"] < 0.8  # the shifted sampler spreads the ratio
    acted = (
        row["is_truncated_high_frac"] + row["is_truncated_low_frac"]
        if method == "tis"
        else row["is_rejected_token_frac"]
    )
    assert acted > 0


def test_none_passes_no_weights_and_reports_the_raw_ratio(project, monkeypatch):
    calls = []
    (row,) = _run(tiny_params(steps=1, sync=dict(probe_tokens=0)), monkeypatch, calls)
    assert calls and all(c["is_weights"] is None for c in calls)
    assert row["is_ratio_max"] > 1.25 and "is_weight_mean" not in row and row["mismatch_nan_tokens"] == 0


def test_the_corrected_update_does_not_depend_on_the_micro_batch_split(project, monkeypatch):
    norms = []
    for mbs in (2, 5, 12):
        p = tiny_params(
            steps=1,
            sync=dict(probe_tokens=0),
            correction=dict(method="seq-tis", low=0.5, high=1.5),
            optim__micro_batch_size=mbs,
            advantage__skip_zero_std_groups=False,
        )
        (row,) = _run(p, monkeypatch)
        norms.append((row["grad_norm"], row["loss"], row["is_weight_mean"]))
    for n in norms[1:]:
        assert n == pytest.approx(norms[0], rel=1e-5)


def test_correction_changes_the_update_only_through_the_weights(project, monkeypatch):
    """A correction whose thresholds never bite (a ratio band wider than any ratio, tis with [0, 1e9]) gives the raw
    ratio as the weight; its gradient differs from none's; a correction on an exact sampler gives none's update."""
    p_none = tiny_params(steps=1, sync=dict(probe_tokens=0), advantage__skip_zero_std_groups=False)
    p_tis = tiny_params(
        steps=1,
        sync=dict(probe_tokens=0),
        correction=dict(method="tis", low=0.0, high=1e9),
        advantage__skip_zero_std_groups=False,
    )
    (a,) = _run(p_none, monkeypatch)
    (b,) = _run(p_tis, monkeypatch)
    assert b["is_truncated_high_frac"] == 0 and b["is_truncated_low_frac"] == 0
    assert a["grad_norm"] != pytest.approx(b["grad_norm"], rel=1e-4)
    model, tok, rows = _load()  # the exact sampler: the ratio is 1 up to rounding, and so are the weights
    (c,) = rl_train(model, tok, rows, p_tis, ckpt_dir=None)[0]
    model, tok, rows = _load()
    (d,) = rl_train(model, tok, rows, p_none, ckpt_dir=None)[0]
    assert c["is_weight_max"] == pytest.approx(1.0, abs=1e-5) and c["grad_norm"] == pytest.approx(
        d["grad_norm"], rel=1e-5
    )


def test_step_metrics_with_none_are_the_raw_token_ratio():
    g = torch.Generator().manual_seed(0)
    t = -torch.rand(3, 5, generator=g)
    s = t + 0.1 * torch.randn(3, 5, generator=g)
    m = torch.ones(3, 5)
    m[2, 3:] = 0

    class C:
        method, low, high = "none", None, 2.0

    got = step_metrics(C, t, s, m)
    r = torch.exp(t - s)[m.bool()].double()
    assert got["is_ratio_max"] == pytest.approx(float(r.max())) and got["is_ratio_mean"] == pytest.approx(
        float(r.mean())
    )

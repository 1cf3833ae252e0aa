"""Guards against reward hacking (stages/rl/guards.py): the running statistics, normalisation, the length term and
the last-step bump against loop references; the guarded source on outcome and process rewards against hand
computations; state round trip; the params' rules; and a tiny GRPO run with every guard on that resumes."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from stages.rl import guards as Gd
from stages.rl.rewards import Rewards
from tests.rl.test_grpo_stage import tiny_params
from tests.rl.test_iterative import rm_project  # noqa: F401 (the fixture)

torch.set_num_threads(1)


def _cfg(**over):
    raw = dict(normalize=False, clip=None, rule_weight=0.0, length_penalty=0.0, length_target=None)
    raw.update(over)
    return SimpleNamespace(**raw)


def test_running_stats_match_the_batch_formula_over_many_updates():
    rng = random.Random(0)
    st, seen = Gd.RunningStats(), []
    for _ in range(7):
        k = rng.randint(1, 9)
        x = torch.tensor([rng.gauss(2.0, 3.0) for _ in range(k)] + [math.nan], dtype=torch.float64)
        st.update(x)
        seen.extend(v for v in x.tolist() if math.isfinite(v))
        m = sum(seen) / len(seen)
        assert st.n == len(seen) and st.mean == pytest.approx(m, rel=1e-12)
        assert st.std == pytest.approx(math.sqrt(sum((v - m) ** 2 for v in seen) / len(seen)), rel=1e-10)
    st.update(torch.tensor([math.nan]))  # nothing finite: no change
    assert st.n == len(seen)


def test_normalize_clip_and_length_term_elementwise():
    st = Gd.RunningStats()
    st.update(torch.tensor([1.0, 2.0, 3.0, 10.0], dtype=torch.float64))
    x = torch.tensor([[0.0, 4.0, math.nan], [10.0, 2.0, -5.0]], dtype=torch.float64)
    got = Gd.normalize(x, st, clip=1.5)
    for i in range(2):
        for j in range(3):
            v = x[i, j].item()
            if math.isnan(v):
                assert math.isnan(got[i, j].item())
                continue
            want = max(-1.5, min(1.5, (v - st.mean) / (st.std + Gd.NORM_EPS)))
            assert got[i, j].item() == pytest.approx(want, rel=1e-12)
    lens = torch.tensor([[10, 45, 60]])
    assert Gd.length_term(lens, 40.0, 0.5)[0].tolist() == pytest.approx([0.5 * 30 / 40, 0.5 * 5 / 40, 0.5 * 20 / 40])


def test_add_to_last_step_bumps_the_last_finite_step_only():
    nan = math.nan
    steps = torch.tensor([[[0.1, 0.2, nan], [0.5, nan, nan], [nan, nan, nan]]], dtype=torch.float64)
    delta = torch.tensor([[1.0, -2.0, 3.0]], dtype=torch.float64)
    got = Gd.add_to_last_step(steps, delta)
    want = [[[0.1, 1.2, nan], [-1.5, nan, nan], [nan, nan, nan]]]
    for g, w in zip(got.flatten().tolist(), torch.tensor(want).flatten().tolist(), strict=True):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w)


class _Inner:
    """A stub RM source with fixed rewards (per output, or per step when ``steps`` is given)."""

    def __init__(self, output, steps=None):
        self.output, self.steps = output, steps
        self.rm = None

    def rewards(self, ro):
        if self.steps is None:
            return Rewards(self.output.clone())
        ends = torch.zeros(self.steps.shape, dtype=torch.long)
        return Rewards(torch.nanmean(self.steps, -1), self.steps.clone(), ends)


def _rollout(texts, answers, lengths, G):
    mask = torch.zeros(len(texts), max(lengths))
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return SimpleNamespace(texts=texts, rows=[{"answer": a} for a in answers], group_size=G, completion_mask=mask,
                           completion_lengths=mask.sum(-1))


def test_guarded_outcome_reward_is_normalised_mixed_and_length_penalised():
    out = torch.tensor([[0.9, 0.2], [0.6, 0.4]], dtype=torch.float64)
    ro = _rollout(["\\boxed{5}", "\\boxed{4}", "\\boxed{7}", "\\boxed{7}"], ["5", "5", "7", "8"], [40, 20, 50, 40], 2)
    src = Gd.GuardedSource(_Inner(out), _cfg(normalize=True, clip=None, rule_weight=0.5, length_penalty=0.2), 40.0)
    r = src.rewards(ro)
    m, s = out.mean().item(), out.std(unbiased=False).item()
    rule = [[1, 0], [1, 0]]
    lens = [[40, 20], [50, 40]]
    for q in range(2):
        for g in range(2):
            want = (out[q, g].item() - m) / (s + Gd.NORM_EPS) + 0.5 * rule[q][g] - 0.2 * abs(lens[q][g] - 40) / 40
            assert r.output[q, g].item() == pytest.approx(want, rel=1e-9)
    assert r.metrics["rm_raw_mean"] == pytest.approx(m)
    state = src.state_dict()
    again = Gd.GuardedSource(_Inner(out), src.cfg, 40.0)
    again.load_state_dict(state)
    assert again.stats == src.stats


def test_guarded_process_reward_adds_rule_and_length_at_the_last_step():
    nan = math.nan
    steps = torch.tensor([[[0.8, 0.6], [0.3, nan]]], dtype=torch.float64)
    ro = _rollout(["\\boxed{5}", "\\boxed{6}"], ["5", "5"], [30, 10], 2)
    src = Gd.GuardedSource(_Inner(None, steps), _cfg(rule_weight=1.0, length_penalty=0.1), 20.0)
    r = src.rewards(ro)
    assert r.per_step
    assert r.steps[0, 0].tolist() == pytest.approx([0.8, 0.6 + 1.0 - 0.1 * 10 / 20])
    assert r.steps[0, 1, 0].item() == pytest.approx(0.3 + 0.0 - 0.1 * 10 / 20) and math.isnan(r.steps[0, 1, 1].item())
    assert r.output[0].tolist() == pytest.approx([(0.8 + 0.6 + 1.0 - 0.05) / 2, 0.3 - 0.05])


def test_guarded_is_a_no_op_when_every_guard_is_off_and_needs_a_length_target():
    inner = _Inner(torch.zeros(1, 2))
    assert Gd.guarded(inner, _cfg(), []) is inner
    from stages.core.errors import PipelineError

    with pytest.raises(PipelineError, match="length_target"):
        Gd.guarded(inner, _cfg(length_penalty=0.1), [])
    ex = [{"completion_ids": [1] * 30, "origin": "sft"}, {"completion_ids": [1] * 50, "origin": "sft"},
          {"completion_ids": [1] * 90, "origin": "iter1"}]
    assert Gd.guarded(inner, _cfg(length_penalty=0.1), ex).length_target == 40.0
    assert Gd.guarded(inner, _cfg(length_penalty=0.1, length_target=12), ex).length_target == 12


def test_params_refuse_guards_without_a_reward_model():
    with pytest.raises(ValueError, match="rm_guards apply"):
        tiny_params(reward__rm_guards=dict(normalize=True, clip=None, rule_weight=0.0, length_penalty=0.0, length_target=None))
    with pytest.raises(ValueError, match="clip"):
        tiny_params(reward__source="outcome_rm",
                    reward__rm_guards=dict(normalize=False, clip=2.0, rule_weight=0.0, length_penalty=0.0, length_target=None))
    p = tiny_params(reward__source="process_rm",
                    reward__rm_guards=dict(normalize=True, clip=3.0, rule_weight=0.5, length_penalty=0.1, length_target=None))
    assert p.reward.rm_guards.rule_weight == 0.5


def test_grpo_with_every_guard_resumes_with_its_running_statistics(rm_project):  # noqa: F811
    """A guarded process-RM run interrupted after step 1 resumes with the checkpointed running statistics: the same
    rewards and weights as an uninterrupted run."""
    from stages.core import paths
    from stages.rl.iterative import run_iterations
    from stages.rl.loop import close, setup
    from tests.rl.test_grpo_stage import _load

    p = tiny_params(steps=3, checkpoint_every=1, reward__source="process_rm", baseline=dict(enabled=False, lr=1e-3),
                    reward__rm_guards=dict(normalize=True, clip=2.0, rule_weight=0.5, length_penalty=0.2, length_target=8))

    def go(ckpt: Path, crash: bool):
        model, tok, rows = _load()

        def on_step(row):
            if crash and row["step"] == 1:
                raise KeyboardInterrupt

        run, models, state = setup(p, model, tok, rows=rows, rm_dir=paths.REWARD_MODEL, on_step=on_step)
        try:
            hist = run_iterations(run, models, state, ckpt_dir=ckpt, out_dir=Path("iters"))
        finally:
            close(run, models, state)
        return hist, model

    full, m_full = go(Path("ck_full"), crash=False)
    with pytest.raises(KeyboardInterrupt):
        go(Path("ck"), crash=True)
    resumed, m_res = go(Path("ck"), crash=False)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert "rm_norm_mean" in full[0] and "length_penalty_mean" in full[0]
    for a, b in zip(full, resumed, strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], rel=1e-6)
        assert a["rm_norm_mean"] == pytest.approx(b["rm_norm_mean"], rel=1e-9)
    for k, v in m_full.state_dict().items():
        assert torch.allclose(v, m_res.state_dict()[k], atol=1e-6)

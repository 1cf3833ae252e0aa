"""Outcome and process-supervision advantages against loop-based references and hand-computed cases."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from stages.rl.advantages import outcome_advantages, process_advantages
from stages.rl.rm.labels import step_end_indices

torch.set_num_threads(1)


def loop_outcome(rewards, scale, eps):
    out = []
    all_valid = [x for row in rewards for x in row if not math.isnan(x)]
    bstd = statistics.stdev(all_valid) if len(all_valid) >= 2 else 0.0
    for row in rewards:
        v = [x for x in row if not math.isnan(x)]
        if len(v) < 2 or statistics.stdev(v) == 0:
            out.append([0.0] * len(row))
            continue
        mu, sd = statistics.mean(v), statistics.stdev(v)
        den = {"group": sd + eps, "batch": bstd + eps, "none": 1.0}[scale]
        out.append([0.0 if math.isnan(x) else (x - mu) / den for x in row])
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_outcome_matches_loop_reference(scale):
    g = torch.Generator().manual_seed(0)
    r = torch.rand(5, 8, generator=g, dtype=torch.float64)
    r[0] = 1.0  # zero-std group
    r[1, 3] = float("nan")  # failed reward
    r[2, :7] = float("nan")  # only one valid reward: no signal
    r[3] = (r[3] > 0.5).double()  # binary rewards, as the rule reward
    res = outcome_advantages(r, scale_rewards=scale, eps=1e-4)
    ref = torch.tensor(loop_outcome(r.tolist(), scale, 1e-4), dtype=torch.float64)
    assert torch.allclose(res.advantages, ref, atol=1e-9)
    assert res.n_zero_std_groups == 2
    assert res.valid.sum() == 40 - 1 - 7
    assert torch.all(res.advantages[~res.valid] == 0)


def test_outcome_hand_computed():
    # rewards 1,0,0,0: mean 0.25, unbiased std sqrt(0.25) = 0.5 -> A = 0.75/0.5001, -0.25/0.5001
    res = outcome_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert res.advantages[0, 0].item() == pytest.approx(0.75 / 0.5001, rel=1e-6)
    assert res.advantages[0, 1].item() == pytest.approx(-0.25 / 0.5001, rel=1e-6)
    assert res.advantages.sum().item() == pytest.approx(0.0, abs=1e-6)
    eq = outcome_advantages(torch.tensor([[1.0, 1.0, 1.0]]))
    assert torch.all(eq.advantages == 0) and eq.n_zero_std_groups == 1


def loop_process(step_rewards, step_ends, T, eps):
    """Paper 4.1.3 literally: normalise all step rewards of the group, then A_t = sum over steps ending >= t."""
    out = []
    for grp_r, grp_e in zip(step_rewards, step_ends, strict=True):
        flat = [x for row in grp_r for x in row if not math.isnan(x)]
        deg = len(flat) < 2 or statistics.stdev(flat) == 0
        mu = statistics.mean(flat) if flat else 0.0
        sd = statistics.stdev(flat) if len(flat) >= 2 else 0.0
        rows = []
        for rr, ee in zip(grp_r, grp_e, strict=True):
            adv = []
            for t in range(T):
                s = 0.0
                for x, e in zip(rr, ee, strict=True):
                    if not math.isnan(x) and e >= t and not deg:
                        s += (x - mu) / (sd + eps)
                adv.append(s)
            rows.append(adv)
        out.append(rows)
    return out


def test_process_matches_loop_reference():
    g = torch.Generator().manual_seed(3)
    Q, G, S, T = 3, 4, 5, 12
    r = torch.rand(Q, G, S, generator=g, dtype=torch.float64)
    ends = torch.sort(torch.randint(0, T, (Q, G, S), generator=g), dim=-1).values
    r[0, 1, 3:] = float("nan")  # an output with fewer steps
    r[1] = 0.5  # every step reward equal -> zero advantages
    adv = process_advantages(r, ends, T, eps=1e-4)
    ref = torch.tensor(loop_process(r.tolist(), ends.tolist(), T, 1e-4))
    assert adv.shape == (Q, G, T)
    assert torch.allclose(adv.double(), ref.double(), atol=1e-5)
    assert torch.all(adv[1] == 0)


def test_process_hand_computed():
    # one group, two outputs, step rewards [1, 0] ending at 1, 3 and [0] ending at 2; T = 5
    r = torch.tensor([[[1.0, 0.0], [0.0, float("nan")]]])
    e = torch.tensor([[[1, 3], [2, 0]]])
    adv = process_advantages(r, e, 5, eps=0.0)
    # R = {1, 0, 0}: mean 1/3, std sqrt(1/3); r~ = 2/sqrt(3)=1.1547, -1/sqrt(3)=-0.5774
    a, b = 2 / math.sqrt(3), -1 / math.sqrt(3)
    assert adv[0, 0].tolist() == pytest.approx([a + b, a + b, b, b, 0.0], abs=1e-6)
    assert adv[0, 1].tolist() == pytest.approx([b, b, b, 0.0, 0.0], abs=1e-6)


def test_step_end_indices():
    assert step_end_indices(["a", " b\n", "c", ".\n", "d", "e"]) == [1, 3, 5]
    assert step_end_indices(["a", "\n"]) == [1]
    assert step_end_indices([]) == []


def test_rloo_is_the_leave_one_out_baseline():
    """The registered 'rloo' estimator against a loop: r_i minus the mean of the group's other valid rewards."""
    from stages.rl.advantages import AdvantageConfig, AdvantageInput, estimate_advantages
    from stages.rl.rewards import Rewards

    g = torch.Generator().manual_seed(5)
    r = torch.rand(4, 6, generator=g, dtype=torch.float64)
    r[0], r[1, 2], r[2, 1:] = 1.0, float("nan"), float("nan")  # all equal; one failed; one valid only
    got = estimate_advantages("rloo", AdvantageInput(Rewards(r), torch.ones(24, 3)), AdvantageConfig())
    for q, row in enumerate(r.tolist()):
        v = [x for x in row if not math.isnan(x)]
        for i, x in enumerate(row):
            want = 0.0 if math.isnan(x) or len(set(v)) < 2 else x - (sum(v) - x) / (len(v) - 1)
            assert float(got.advantages[q, i]) == pytest.approx(want, abs=1e-12)
    assert got.n_zero_std_groups == 2 and got.valid.tolist() == torch.isfinite(r).tolist()

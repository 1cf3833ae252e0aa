"""stages.rl.dynamic_sampling (DAPO's group filter and batch refill) against a loop reference of the bookkeeping, the
degenerate-group rule of outcome_advantages, and a simulated step loop."""

from __future__ import annotations

import math

import pytest
import torch

from stages.rl.advantages import outcome_advantages
from stages.rl.dynamic_sampling import RefillState, informative_groups, refill_round

NAN = math.nan


def test_informative_is_the_complement_of_outcome_advantages_degenerate_groups():
    r = torch.tensor(
        [[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [NAN, 1.0, NAN], [NAN, 0.0, 1.0], [0.7, 0.7, 0.7], [NAN, NAN, NAN]],
        dtype=torch.float64,
    )
    info = informative_groups(r)
    assert info.tolist() == [False, True, False, True, False, False]
    adv = outcome_advantages(r).advantages
    assert info.tolist() == (adv != 0).any(-1).tolist()


def loop_reference(state, rewards, max_rounds, max_per_round, oversample):
    keep, kept, informative = [], state.kept, state.informative
    for row in rewards.tolist():
        vals = [x for x in row if not math.isnan(x)]
        info = len(vals) >= 2 and max(vals) != min(vals)
        informative += info
        k = info and kept < state.target
        kept += k
        keep.append(k)
    generated, rounds = state.generated + len(keep), state.rounds + 1
    if kept == state.target:
        return keep, kept, True, 0, "full"
    if rounds >= max_rounds:
        return keep, kept, True, 0, "max_rounds"
    p = informative / generated
    n = (
        max_per_round
        if p == 0 or math.isinf(oversample)
        else min(max_per_round, math.ceil(oversample * (state.target - kept) / p))
    )
    return keep, kept, False, n, "more"


@pytest.mark.parametrize("oversample", [1.0, 1.5, math.inf])
def test_rounds_match_loop_reference(oversample):
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        target = int(torch.randint(1, 9, (1,), generator=g))
        state = RefillState(target)
        done = False
        while not done:
            q = int(torch.randint(1, 10, (1,), generator=g))
            rewards = torch.randint(0, 2, (q, 4), generator=g).double()
            rewards[torch.rand(q, 4, generator=g) < 0.1] = NAN
            if trial % 3 == 0:  # mostly all-equal groups: rounds run out
                rewards[: q - 1] = 1.0
            expect = loop_reference(state, rewards, 4, 16, oversample)
            state, d = refill_round(state, rewards, max_rounds=4, max_per_round=16, oversample=oversample)
            assert (d.keep.tolist(), state.kept, d.done, d.n_more, d.reason) == expect
            assert d.shortfall == (state.target - state.kept if d.done else 0)
            done = d.done
        assert state.rounds <= 4 and state.kept <= target


def test_a_full_round_truncates_to_the_room_left():
    state = RefillState(target=2, kept=1, informative=1, generated=4, rounds=1)
    r = torch.tensor([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    state, d = refill_round(state, r, max_rounds=3, max_per_round=8)
    assert d.keep.tolist() == [True, False, False, False] and d.done and d.reason == "full" and state.kept == 2
    assert d.metrics(state) == {
        "ds_rounds": 2.0,
        "ds_generated_groups": 8.0,
        "ds_kept_groups": 2.0,
        "ds_informative_frac": 4 / 8,
        "ds_shortfall": 0.0,
    }


def test_next_round_size_from_the_informative_rate():
    """8 wanted, 2 of 8 informative (p = 1/4): 6 missing need 24 prompts, x1.5 = 36, capped at max_per_round."""
    r = torch.ones(8, 4)
    r[:2, 0] = 0.0
    _, d = refill_round(RefillState(8), r, max_rounds=5, max_per_round=100, oversample=1.5)
    assert (d.done, d.n_more) == (False, 36)
    _, d = refill_round(RefillState(8), r, max_rounds=5, max_per_round=20, oversample=1.5)
    assert d.n_more == 20
    _, d = refill_round(RefillState(8), torch.ones(8, 4), max_rounds=5, max_per_round=20)  # p = 0
    assert d.n_more == 20


def test_rounds_are_bounded_and_the_short_batch_is_reported():
    state = RefillState(4)
    for k in range(3):
        state, d = refill_round(state, torch.ones(4, 2), max_rounds=3, max_per_round=4)
        assert d.done == (k == 2)
    assert d.reason == "max_rounds" and d.shortfall == 4 and state.rounds == 3
    with pytest.raises(ValueError, match="already done"):
        refill_round(state, torch.ones(4, 2), max_rounds=3, max_per_round=4)


def test_simulated_step_fills_the_batch():
    """A policy whose groups are informative with probability 0.3: the loop stops full within the bound."""
    g = torch.Generator().manual_seed(1)
    state, d = RefillState(16), None
    n = 16
    while d is None or not d.done:
        acc = (torch.rand(n, 1, generator=g) < 0.3).double()
        rewards = torch.where(torch.rand(n, 8, generator=g) < 0.5, acc, 1 - acc)
        rewards[torch.rand(n, generator=g) > 0.3] = 1.0  # 70% of the groups all-equal
        state, d = refill_round(state, rewards, max_rounds=6, max_per_round=64, oversample=1.2)
        n = d.n_more
    assert d.reason == "full" and state.kept == 16 and state.rounds <= 6


def test_bad_arguments():
    with pytest.raises(ValueError, match="target"):
        refill_round(RefillState(0), torch.ones(1, 2), max_rounds=1, max_per_round=1)
    with pytest.raises(ValueError, match="oversample"):
        refill_round(RefillState(2), torch.ones(1, 2), max_rounds=1, max_per_round=1, oversample=0.5)

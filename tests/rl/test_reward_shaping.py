"""stages.rl.reward_shaping.overlong_penalty (DAPO eq. 13) against a loop over the paper's three cases, the
hand-computed example of TRL's docstring, and bad input. TRL's own function on the same lengths:
tests/benchmarks/test_rl_math_vs_trl.py."""

from __future__ import annotations

import pytest
import torch

from stages.rl.reward_shaping import overlong_penalty


def paper_eq13(length: int, max_len: int, cache: int) -> float:
    """DAPO eq. 13, case by case."""
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return ((max_len - cache) - length) / cache
    return -1.0


@pytest.mark.parametrize("max_len,cache", [(20, 5), (64, 16), (10, 10), (7, 1)])
@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_matches_the_papers_cases(max_len, cache, factor):
    lengths = torch.arange(0, max_len + 4)
    out = overlong_penalty(lengths, max_len=max_len, buffer_len=cache, factor=factor)
    expect = torch.tensor([factor * paper_eq13(int(n), max_len, cache) for n in lengths], dtype=torch.float64)
    assert out.dtype == torch.float64 and torch.allclose(out, expect, atol=1e-15, rtol=0)
    assert out.max() == 0.0 and out.min() == -factor


def test_trl_docstring_example():
    """TRL's get_soft_overlong_punishment docstring: 90 tokens with L_max 100, L_cache 20 -> -0.5."""
    assert overlong_penalty(torch.tensor([90]), max_len=100, buffer_len=20).tolist() == [-0.5]


def test_zero_buffer_is_the_hard_limit():
    out = overlong_penalty(torch.tensor([0, 5, 10, 11]), max_len=10, buffer_len=0, factor=2.0)
    assert out.tolist() == [0.0, 0.0, 0.0, -2.0]


@pytest.mark.parametrize(
    "kw,lengths",
    [
        ({"max_len": 10, "buffer_len": 11}, torch.tensor([1])),
        ({"max_len": 0, "buffer_len": 0}, torch.tensor([1])),
        ({"max_len": 10, "buffer_len": 2, "factor": -1.0}, torch.tensor([1])),
        ({"max_len": 10, "buffer_len": 2}, torch.tensor([1.5])),
        ({"max_len": 10, "buffer_len": 2}, torch.tensor([-1])),
    ],
)
def test_bad_input(kw, lengths):
    with pytest.raises(ValueError):
        overlong_penalty(lengths, **kw)

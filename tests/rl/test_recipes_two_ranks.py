"""Dynamic sampling and the curriculum on two ranks (torchrun, gloo, DeepSpeed ZeRO-2 on the CPU accelerator) equal
one process: the ranks gather each round's per-group figures, so they keep the same groups, draw the same extra and
curriculum questions and apply the same update (tests/rl/_ds_two_ranks.py ``recipes``). Slow: two torchrun ranks
and one process (7 min at load 7 on the shared 2-core machine); .ci/slow two-ranks runs it."""

from __future__ import annotations

import pytest

from ._launch import one_and_two_ranks


@pytest.mark.slow
def test_dynamic_sampling_and_curriculum_two_ranks_equal_one_process(project):
    pytest.importorskip("deepspeed")
    one, two = one_and_two_ranks(project, "recipes")
    assert any(r["ds_rounds"] > 1 for r in one["rows"])  # a planted all-equal group was refilled
    assert sorted(r["rank"] for r in two) == [0, 1] and all(r["world"] == 2 for r in two)
    assert sorted(two[0]["questions"] + two[1]["questions"]) == one["questions"]  # the ranks split one sampling
    for r in two:
        assert r["rows"] == one["rows"]  # same rounds, kept groups, shortfall, curriculum draws
        assert r["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
        assert r["checksum"] == pytest.approx(one["checksum"], abs=1e-4)

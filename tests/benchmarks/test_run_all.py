"""The benchmark suite's pure helpers: script discovery, --quick flag filtering, fits, ratio extraction."""

from __future__ import annotations

import math

import pytest

from benchmarks import run_all
from benchmarks._tiny import digit_share, linear_fit, loglog_slope


def test_discover_lists_scripts_in_order_without_helpers() -> None:
    names = run_all.discover()
    assert "run_all" not in names and not any(n.startswith("_") for n in names)
    assert {"grpo_vs_trl", "orchestration", "scaling"} <= set(names)
    known = [n for n in run_all.ORDER if n in names]
    assert names[: len(known)] == known  # listed scripts first, in ORDER


def test_quick_args_keep_only_flags_the_script_defines() -> None:
    assert run_all.quick_args("scaling") == ["--quick"]
    assert run_all.quick_args("grpo_vs_trl") == ["--quick"]
    assert run_all.quick_args("orchestration") == []
    saved = dict(run_all.QUICK_ARGS)
    try:
        run_all.QUICK_ARGS["scaling"] = ["--quick", "--no-such-flag", "3", "--repeats", "1"]
        assert run_all.quick_args("scaling") == ["--quick", "--repeats", "1"]
    finally:
        run_all.QUICK_ARGS.clear()
        run_all.QUICK_ARGS.update(saved)


def test_fits() -> None:
    xs = [1.0, 2.0, 4.0, 8.0]
    assert loglog_slope(xs, [3 * x for x in xs]) == pytest.approx(1.0)
    assert loglog_slope(xs, [x * x for x in xs]) == pytest.approx(2.0)
    assert loglog_slope([1.0], [1.0]) is None
    fit = linear_fit(xs, [0.5 + 2 * x for x in xs])
    assert fit is not None
    assert fit["intercept"] == pytest.approx(0.5) and fit["slope"] == pytest.approx(2.0) and fit["r2"] == pytest.approx(1.0)


def test_flat_ratios_picks_ratio_like_leaves_only() -> None:
    d = {"score_over_bare_ratio": {"raw": 2.0}, "pages": 10, "rows": [{"engine": "hf", "speedup": 1.5}], "ok": True}
    assert dict(run_all._flat_ratios(d)) == {"score_over_bare_ratio.raw": 2.0, "rows.hf.speedup": 1.5}


def test_fmt_and_digit_share() -> None:
    assert run_all._fmt(None) == "not measured"
    assert run_all._fmt(math.nan) == "nan"
    assert run_all._fmt(0.12345) == "0.123"
    assert digit_share(completion="ab12") == 0.5 and digit_share(completion="") == 0.0

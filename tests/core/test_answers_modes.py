"""Both checker modes on the cases issue 27 lists and on the hardest cases of public suites' tests
(tests/core/checker_cases.py, shown in docs/evaluation.md), the RL reward under each mode, and bounded checking:
deadlines, refusals, cached timeouts, a thread that never stalls, maj@k without pairwise checks."""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks.checker_oracle import gold_answer
from stages.core import answers
from stages.core.answers import answer_key, check, check_many, extract_answer, final_answers
from stages.evaluate.metrics import sample_metrics
from stages.rl.rewards import RewardSet, accuracy_reward
from tests.core.checker_cases import ADVERSARIAL, HARD_CASES, ISSUE_CASES, Case

MODES = ("deepseekmath", "strict")


def verdict(c: Case, mode: str, timeout_s: float = 10.0) -> str:
    pred = final_answers(c.pred, mode=mode) if c.kind == "output" else c.pred
    gold = gold_answer(c.gold) if c in HARD_CASES else c.gold
    return check(pred, gold, mode=mode, percent_variants=c.pv, timeout_s=timeout_s)


@pytest.mark.parametrize("case", [c for c in ISSUE_CASES if not c.id.startswith("D")], ids=lambda c: c.id)
def test_issue_cases_in_both_modes(case: Case) -> None:
    assert (verdict(case, "deepseekmath"), verdict(case, "strict")) == (case.deepseekmath, case.strict)


@pytest.mark.parametrize("case", HARD_CASES, ids=lambda c: c.id)
def test_hard_public_cases_in_both_modes(case: Case) -> None:
    assert (verdict(case, "deepseekmath"), verdict(case, "strict")) == (case.deepseekmath, case.strict)


def test_hard_cases_cite_their_source_and_strict_agrees_with_most() -> None:
    assert len(HARD_CASES) >= 20 and all(c.source and c.source_verdict for c in HARD_CASES)
    agree = {m: sum(getattr(c, m) == c.source_verdict for c in HARD_CASES) for m in MODES}
    assert agree["strict"] >= 16 and agree["strict"] > agree["deepseekmath"], agree


def test_the_rl_reward_follows_the_checker_mode() -> None:
    """\\boxed{0} for a gold below 1e-3: reward 1.0 under the reference's absolute tolerance, 0.0 under strict (the
    default); two different boxed answers: the last one counts for deepseekmath, neither for strict."""
    small = dict(completion="so the answer is \\boxed{0}", answer="\\frac{1}{5120}")
    assert accuracy_reward(**small, checker="deepseekmath") == 1.0
    assert accuracy_reward(**small) == 0.0
    hedge = dict(completion="It is \\boxed{3}. No wait, \\boxed{5}.", answer="5")
    assert accuracy_reward(**hedge, checker="deepseekmath") == 1.0 and accuracy_reward(**hedge) == 0.0
    rs = RewardSet.from_params(1.0, 0.0, [], [], checker="deepseekmath")
    assert rs.score(**small, finish_reason="stop", question="q", row={})[0] == 1.0


# ------------------------------------------------------------------------------------------------
# Bounded checking
# ------------------------------------------------------------------------------------------------


class Ticker:
    """A thread that wakes every millisecond and records the longest gap between two wake-ups (a stall of every
    other thread, as when a C call holds the GIL)."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._th.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()


@pytest.mark.parametrize("mode", MODES)
def test_a_tower_times_out_within_its_deadline_and_the_timeout_is_cached(mode: str) -> None:
    answers.warm_up(2)
    tower = f"9^{{9^{{9^{{{7 if mode == 'strict' else 8}}}}}}}"  # a different pair per mode: nothing cached yet
    t0 = time.monotonic()
    assert check(tower, "1", mode=mode, timeout_s=1.0) == "timeout"
    # the deadline is the worker's CPU time (a verdict must not depend on the load): on a busy machine 1 s of CPU
    # takes longer than 1 s of wall time (1.5 s failed once at load 2.7 on 2 cores); unbounded, this check never ends
    assert time.monotonic() - t0 < 3 * 1.0 + 0.5
    t0 = time.monotonic()
    assert check(tower, "1", mode=mode, timeout_s=1.0) == "timeout"  # cached: no second deadline
    assert time.monotonic() - t0 < 0.05
    assert check("2\\sqrt{2}", "\\sqrt{8}", mode=mode, timeout_s=30.0) == "right"  # the worker was replaced


def test_a_huge_prediction_is_refused_at_once_without_stalling_other_threads() -> None:
    """A PoT program's 20,000-digit answer (and a 1 MiB one) is refused before normalisation; extraction from a 1 MiB
    output is linear; a ticker thread never waits more than 50 ms meanwhile."""
    digits = ADVERSARIAL["20,000 digits (PoT answer)"][0]
    mib = ADVERSARIAL["1 MiB of digits"][0]
    with Ticker() as tick:
        t0 = time.perf_counter()
        assert check(digits, "5") == "refused" and check(mib, "5", mode="strict") == "refused"
        assert accuracy_reward(completion="", answer="5", mode="pot", program_answer=mib) == 0.0
        for text in (f"so \\boxed{{{mib}}}", "x " * (1 << 19) + "7", "\\boxed{" * 100_000 + "1", mib):
            got = extract_answer(text)
            assert got is None or len(got) <= answers.MAX_ANSWER_CHARS or check(got, "7") == "refused"
            final_answers(text, mode="strict")
        elapsed = time.perf_counter() - t0
    assert tick.max_gap < 0.05, tick.max_gap
    assert elapsed < 10.0, elapsed


def test_maj_at_k_over_many_distinct_answers_makes_no_pairwise_checks() -> None:
    """64 samples, 60 distinct wrong numbers and 4 towers: grouping them costs nothing beyond the 64 gold checks
    (4 deadlines); the old pairwise clustering would compare the towers with one another."""
    answers.warm_up(2)
    preds = [str(1000 + i) for i in range(60)] + [f"9^{{9^{{9^{{{k}}}}}}}" for k in (3, 4, 5, 6)]
    t0 = time.monotonic()
    outcomes = check_many(preds, ["7"] * 64, mode="strict", timeout_s=0.5)
    keys = [answer_key(p, "strict") for p in preds]
    m = sample_metrics(keys, [o == "right" for o in outcomes], [1, 8, 64])
    assert time.monotonic() - t0 < 4 * 0.5 + 8.0
    assert len(set(keys)) == 64 and m["maj@64"] == 0.0 and m["pass@64"] == 0.0

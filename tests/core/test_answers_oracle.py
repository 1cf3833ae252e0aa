"""Math-Verify's own test cases (huggingface/Math-Verify tests/*.py, extracted to tests/core/data/math_verify_cases.json
by benchmarks/checker_oracle.py --extract) as an oracle: our verdict in each mode against the verdict each case
expects. The floors are the measured agreement (docs/evaluation.md): strict 211/268, deepseekmath 158/268. Most
disagreements are by design: strict reads no answer out of free prose (math-verify takes the last expression),
decimal commas (``1,22``), and the reference's conventions in deepseekmath (the last number when nothing is boxed)."""

from __future__ import annotations

import json

from benchmarks.checker_oracle import CASES_FILE, agreement


def test_agreement_with_math_verify_test_cases() -> None:
    data = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    assert data["source"].endswith("huggingface/Math-Verify") and len(data["commit"]) == 40
    cases = data["cases"]
    assert len(cases) >= 250
    res = agreement(cases)
    rates = {m: v["rate"] for m, v in res["modes"].items()}
    print("agreement with Math-Verify's test cases:", rates)
    assert rates["math_verify_installed"] >= 0.99  # the harness reads the cases as math-verify's tests do
    assert res["modes"]["strict"]["agree"] >= 211, res["disagreements"]["strict"]
    assert res["modes"]["deepseekmath"]["agree"] >= 158, res["disagreements"]["deepseekmath"]
    assert rates["strict"] > rates["deepseekmath"]

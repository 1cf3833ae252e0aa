"""``math_verify``: the reward of an output is 1 when Math-Verify (huggingface/Math-Verify, the grader of the Open R1
and lighteval math evaluations) judges the answer it extracts from the output equal to the gold answer, else 0:
math-verify alone, none of the DeepSeekMath rules of stages/core/answers.py. Outcome supervision of CoT outputs.

The gold is parsed as LaTeX (wrapped in ``$...$`` unless it carries its own delimiters or a ``\\boxed{}``), the
output with math-verify's default extraction (the last ``\\boxed{}``, else the last expression); a gold it cannot
parse makes the output's reward NaN (excluded from its group and counted, as a failing rule reward). Its timeouts
(5 s to parse, 5 s to compare) use ``signal.alarm``, so they apply on the main thread only; elsewhere it runs
without them.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from stages.rl.registry import RewardSourceSpec


def score(*, completion: str, answer: str, **_: Any) -> float:
    """1.0 when math-verify's ``verify(parse(gold), parse(completion))`` holds, 0.0 when not, NaN without a gold."""
    from math_verify import parse, verify  # imported when scoring: the params check discovers this module

    limit = 5 if threading.current_thread() is threading.main_thread() else None
    text = str(answer)
    gold = parse(text if "$" in text or "\\boxed" in text else f"${text}$", parsing_timeout=limit)
    if not gold:
        return math.nan
    pred = parse(completion, parsing_timeout=limit)
    return 1.0 if pred and verify(gold, pred, timeout_seconds=limit) else 0.0


SOURCES = (
    RewardSourceSpec("math_verify", "answer correctness judged by Math-Verify alone (outcome supervision)",
                     score=score),
)

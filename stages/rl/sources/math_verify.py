"""``math_verify``: the reward of an output is 1 when Math-Verify (huggingface/Math-Verify, the grader of the Open R1
and lighteval math evaluations) judges the answer it extracts from the output equal to the gold answer, else 0:
math-verify alone, none of the DeepSeekMath rules of stages/core/answers.py. Outcome supervision of CoT outputs.

The gold is parsed as LaTeX (wrapped in ``$...$`` unless it carries its own delimiters or a ``\\boxed{}``), the
output with math-verify's default extraction (the last ``\\boxed{}``, else the last expression); a gold it cannot
parse makes the output's reward NaN (excluded from its group and counted, as a failing rule reward). It runs in the
answer checker's worker processes under their deadline (stages.core.answers.math_verify_many: 5 s of CPU time; a
check past it is a NaN reward too), from any thread, never in the calling process.
"""

from __future__ import annotations

import math
from typing import Any

from stages.rl.registry import RewardSourceSpec


def score(*, completion: str, answer: str, **_: Any) -> float:
    """1.0 when math-verify's ``verify(parse(gold), parse(completion))`` holds, 0.0 when not, NaN without a gold or
    past the deadline."""
    from stages.core.answers import math_verify_many  # imported when scoring: the params check discovers this module

    out = math_verify_many([completion], [str(answer)])[0]
    return 1.0 if out == "right" else math.nan if out in ("no_gold", "timeout") else 0.0


SOURCES = (
    RewardSourceSpec("math_verify", "answer correctness judged by Math-Verify alone (outcome supervision)",
                     score=score),
)

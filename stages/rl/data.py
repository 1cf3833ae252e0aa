"""RL prompt datasets and the question order of the GRPO steps.

Prompt JSONL schema (``grpo.prompts_file``; the default is the corpus stage's
data/corpus/problems/rl.jsonl, whose rows are the data stage's problem rows)::

    question  str   required, the problem text (goes into the chat prompt, CoT instruction)
    answer    str   required, the gold final answer (compared by stages.core.answers.is_equivalent)
    id        str   optional, defaults to "prompt-<line number>"
    cot       str   optional, a reference solution; needed only by the continued-SFT baseline
    ...             any other keys are kept and passed to custom reward functions as ``row``

GSM8K rows (``{"question", "answer": "... #### N"}``) and MATH rows (``{"problem", "answer", "solution"?, ...}``)
are read too (stages.core.problems.benchmark_row): ``question`` / ``answer`` become the problem text and the gold
final answer, the original ``answer`` / ``solution`` text is kept as ``solution``, and ``id`` is ``gsm8k-<row>`` /
the MATH ``unique_id``; MATH rows without an answer are skipped. A row without ``question`` or ``answer`` (or with non-string values) is a one-line PipelineError
naming the file and line.
"""

from __future__ import annotations

import os
import random
from typing import Any

from stages.core.errors import PipelineError
from stages.core.io import iter_jsonl
from stages.core.problems import benchmark_row


def load_prompts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read and validate a prompt JSONL file (schema in the module docstring)."""
    rows: list[dict[str, Any]] = []
    for n, row in enumerate(iter_jsonl(path), 1):
        bench = benchmark_row(path, n - 1, row)
        if bench is not None and bench.gold is None:
            continue  # a MATH row without a gold answer (MATH's train split has two)
        if bench is not None:
            row = {**row, "id": row.get("id", bench.id), "question": bench.question, "answer": bench.gold,
                   "solution": bench.solution}
        for key in ("question", "answer"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise PipelineError(f"{path}: row {n} has no string {key!r}; each row needs \"question\" and \"answer\" strings")
        row.setdefault("id", f"prompt-{n}")
        rows.append(row)
    if not rows:
        raise PipelineError(f"{path}: no prompts; the RL prompt file must hold at least one row")
    return rows


def step_questions(n_rows: int, step: int, per_step: int, seed: int) -> list[int]:
    """Row indices of the questions of GRPO step ``step`` (0-based).

    Epoch-wise shuffling without replacement: epoch e is a permutation of all rows seeded by
    (seed, e); steps take consecutive slices. A pure function of its arguments, so a resumed run
    and the continued-SFT baseline see exactly the same questions at every step.
    """
    out: list[int] = []
    start = step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(start + len(out), n_rows)
        perm = list(range(n_rows))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        take = min(per_step - len(out), n_rows - offset)
        out.extend(perm[offset:offset + take])
    return out

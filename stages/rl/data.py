"""RL prompt datasets and the question order of the GRPO steps.

Prompt JSONL schema (``grpo.prompts_file``: a file, or a directory of them such as the ingest stage's
data/ingest/rl; the tiny default is the corpus stage's data/corpus/problems/rl.jsonl, whose rows are the data
stage's problem rows); read by :func:`stages.core.problems.load_rows`::

    question  str   required, the problem text (goes into the model's prompt, CoT instruction)
    answer    str   required (or an integer), the gold final answer (compared by stages.core.answers.is_equivalent);
                    a raw GSM8K answer ("... #### 72") counts as its gold, 72
    id        str   optional, defaults to "prompt-<row number>"
    cot       str   optional, a reference solution; needed only by the continued-SFT baseline
    ...             any other keys are kept and passed to custom reward functions as ``row``

GSM8K rows (``{"question", "answer": "... #### N"}``) and MATH rows (``{"problem", "answer", "solution"?, ...}``)
are read too (stages.core.problems.benchmark_row): ``question`` / ``answer`` become the problem text and the gold
final answer, the original ``answer`` / ``solution`` text is kept as ``solution``, and ``id`` is ``gsm8k-<row>`` /
the MATH ``unique_id``; MATH rows without an answer are skipped. A row without ``question`` or ``answer`` (or with
values of the wrong type) is a one-line PipelineError naming the file and row.
"""

from __future__ import annotations

import os
import random
from typing import Any

from stages.core.problems import load_rows


def load_prompts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read and validate a prompt file or directory (schema in the module docstring)."""
    return load_rows(path, "RL prompt", default_id="prompt-{number}")


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

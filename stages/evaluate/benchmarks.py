"""The prompts of the benchmarks: the held-out generated problems, GSM8K and MATH test files.

The files are read by :mod:`stages.core.problems` into :class:`~stages.core.problems.Problem` lists (id,
question, gold answer, difficulty: ``n_steps`` for the generated problems, the number of solution lines before
``####`` for GSM8K, ``level`` for MATH).

Prompts (:func:`build_prompt`):
- zero-shot (SFT / RL models): the model's prompt format with DeepSeekMath's instruction
  (:class:`stages.core.prompts.PromptFormat`: the DeepSeekMath chat prompt, or the tokenizer's chat template),
  generation ends at EOS;
- few-shot (base / pretrained models): GSM8K 8-shot ``Q:/A:`` (stop ``\\nQ:``), MATH 4-shot Minerva
  (stop ``\\nProblem:``), and for the generated problems ``n_shots`` exemplars drawn from the SFT split in
  the same ``Q:/A:`` format, whose answer is the exemplar's CoT, PoT program or TIR solution by mode.
  DeepSeekMath's few-shot PAL / tool prompts for GSM8K and MATH are not included: few-shot PoT / TIR
  works on the generated problems only (a one-line error otherwise).
- tir mode also stops at ```` ```output ```` so that the loop can run the code and inject its output.
"""

from __future__ import annotations

import random
from pathlib import Path

from stages.core.errors import PipelineError
from stages.core.io import iter_jsonl
from stages.core.problems import Problem
from stages.core.prompts import (
    MINERVA_STOP,
    PARAGRAPH_STOP,
    QA_STOP,
    PromptFormat,
    chat_prompt,
    gsm8k_fewshot_prompt,
    minerva_math_prompt,
    qa_fewshot_prompt,
)
from stages.core.tool_loop import TIR_STOP, strip_stops  # noqa: F401 - strip_stops: read from here too


def fewshot_exemplars(sft_path: str | Path, n_shots: int, mode: str, seed: int) -> list[tuple[str, str]]:
    """``n_shots`` (question, solution) pairs drawn at random (``seed``) from the SFT split, solution by mode.

    One exemplar per difficulty first (round-robin over n_steps) so the prompt shows every problem length.
    """
    if n_shots == 0:
        return []
    rows = list(iter_jsonl(sft_path))
    if len(rows) < n_shots:
        raise PipelineError(f"{sft_path}: {len(rows)} SFT problems, fewer than evaluate.common.n_shots={n_shots}")
    rng = random.Random(seed)
    rng.shuffle(rows)
    by_steps: dict[int, list[dict]] = {}
    for r in rows:
        by_steps.setdefault(int(r.get("n_steps", 0)), []).append(r)
    picked: list[dict] = []
    levels = sorted(by_steps)
    while len(picked) < n_shots:
        for lv in levels:
            if by_steps[lv] and len(picked) < n_shots:
                picked.append(by_steps[lv].pop())
    rng.shuffle(picked)
    return [(r["question"], r[mode]) for r in picked]


def stop_strings(benchmark: str, mode: str, prompting: str) -> tuple[str, ...]:
    """Stop strings of a (benchmark, mode, prompting) combination (EOS always ends generation too)."""
    stops: list[str] = []
    if prompting == "few_shot":
        stops.append(MINERVA_STOP if benchmark == "math" else QA_STOP)
        if benchmark == "generated":
            stops.append(PARAGRAPH_STOP)
    if mode == "tir":
        stops.append(TIR_STOP)
    return tuple(stops)


def check_supported(benchmark: str, mode: str, prompting: str) -> None:
    """Raise a one-line error for combinations without a prompt format."""
    if prompting == "few_shot" and mode != "cot" and benchmark != "generated":
        raise PipelineError(
            f"evaluate: few-shot {mode} on {benchmark} has no prompt here (DeepSeekMath's PAL / tool few-shot "
            "prompts are not included); use greedy_modes/sample_modes [cot] for few-shot models on GSM8K/MATH"
        )


def build_prompt(problem: Problem, mode: str, prompting: str, exemplars: list[tuple[str, str]] | None = None,
                 fmt: PromptFormat | None = None) -> str:
    """The prompt of one problem (see the module docstring); ``fmt``: the model's zero-shot format (None: the
    DeepSeekMath chat prompt)."""
    check_supported(problem.benchmark, mode, prompting)
    if prompting == "zero_shot":
        return fmt.prompt(problem.question, mode) if fmt is not None else chat_prompt(problem.question, mode)  # type: ignore[arg-type]
    if problem.benchmark == "gsm8k":
        return gsm8k_fewshot_prompt(problem.question)
    if problem.benchmark == "math":
        return minerva_math_prompt(problem.question)
    return qa_fewshot_prompt(problem.question, exemplars or [])

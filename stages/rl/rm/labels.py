"""Training data of the reward model, labelled automatically from samples of a policy on RL problems.

Outcome label: the extracted final answer equals the gold answer. Step labels (steps end at newline tokens and at the
last token, :func:`completion_steps`; the last step's label is the outcome label), two methods:

- ``values``: the generated problems know the running value after every step (``values`` field); step k (k-th
  equation line "... a op b = c.") is right iff every earlier step was right and its result c equals ``values[k]``;
  a line without an equation keeps the state of the steps before it. Cheap and exact for the generated problems.
- ``rollouts`` (Math-Shepherd, Wang et al. 2023, the paper's RM data): from the prefix ending at step j the policy
  samples ``rollouts_per_step`` completions; the step is right iff at least one reaches the gold answer ("hard
  estimation"). Works for any problem with a gold answer, costs one generation per step.

Example rows (JSON, also the replay history written next to an RM, stages/rl/rm/model.py)::

    {"id", "question", "answer", "completion_ids": [int], "step_ends": [int], "step_labels": [0|1],
     "outcome": 0|1, "origin": "sft" | "iter1" | ...}
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stages.core.answers import extract_answer
from stages.core.dist import all_gather_list, block, rank
from stages.core.errors import PipelineError
from stages.core.generation import SamplingParams, make_generator, resolve_backend
from stages.core.prompts import prompt_format
from stages.rl.rewards import accuracy_reward

LabelMethod = Literal["values", "rollouts"]

_RESULT = re.compile(r"=\s*(-?\d+(?:\.\d+)?)\s*\.?\s*$")


def step_end_indices(token_texts: list[str], *, step_sep: str = "\n") -> list[int]:
    """Completion-token indices where a reasoning step ends (paper 4.1.3: ``index(j)``).

    A step ends at the token whose decoded text contains ``step_sep`` (a newline, as the generated CoT
    writes one step per line) and at the last token of the completion (the final step, which usually
    ends with EOS instead of a newline). ``token_texts`` is the decoded text of each completion token.
    """
    ends = [t for t, s in enumerate(token_texts) if step_sep in s]
    if token_texts and (not ends or ends[-1] != len(token_texts) - 1):
        ends.append(len(token_texts) - 1)
    return ends


def completion_steps(token_ids: Sequence[int], tokenizer: Any) -> tuple[list[int], list[str]]:
    """(step-end token indices, step texts) of a completion: steps end at newline tokens and at the last token."""
    ids = list(token_ids)
    ends = step_end_indices([tokenizer.decode([t], skip_special_tokens=True) for t in ids])
    texts, start = [], 0
    for e in ends:
        texts.append(tokenizer.decode(ids[start:e + 1], skip_special_tokens=True))
        start = e + 1
    return ends, texts


def value_step_labels(step_texts: Sequence[str], values: Sequence[Any], outcome: int) -> list[int]:
    """Step labels from the problem's known running values (method ``values``; module docstring)."""
    labels: list[int] = []
    ok, k = True, 0
    for j, text in enumerate(step_texts):
        if j == len(step_texts) - 1:
            labels.append(int(outcome))
            break
        m = _RESULT.search(text.strip())
        if m is not None:
            right = k < len(values) and _num_eq(m.group(1), values[k])
            ok = ok and right
            k += 1
        labels.append(int(ok))
    return labels


def _num_eq(a: str, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class SampleConfig:
    """How to sample and label RM training data from a policy."""

    samples_per_question: int
    temperature: float
    max_new_tokens: int
    labels: LabelMethod
    rollouts_per_step: int
    seed: int
    backend: str = "hf"
    generator_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of the generator built for the sampling (vllm: gpu_memory_utilization, tensor_parallel_size, ...)."""


def collect_examples(policy: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], cfg: SampleConfig, *,
                     origin: str, generator: Any = None, stats: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Sample ``cfg.samples_per_question`` outputs per problem from ``policy`` and label them (module docstring).

    Every example also keeps ``pred`` (its extracted final answer, for majority voting) and, when the row has
    ``values``, ``value_labels`` (the exact labels of :func:`value_step_labels`, the reference the step AUC is also
    measured against whatever ``cfg.labels`` is). Sampling is one batched call of the generator; with ``rollouts``
    the completions of all step prefixes are one more batched call, over the distinct prefixes only (the G samples
    of a question often share their first steps), and a correct output's own continuation counts as one completion
    of each of its prefixes, so its steps are right without rollouts (:func:`shepherd_labels`). ``stats``, when
    given, receives the counts: outputs sampled, examples kept and (rollouts) the prefixes and completions.

    Several ranks: each samples and labels its contiguous block of ``rows`` (seeded by the rows' positions in the
    whole list, ``SamplingParams.index_offset``) and every rank returns all the examples, in row order, and the
    counts summed over the ranks: the same examples as one process (but for Math-Shepherd prefixes shared by rows
    of different ranks, which each rank completes on its own)."""
    if cfg.labels == "values" and any("values" not in r for r in rows):
        raise PipelineError("reward labels 'values' need problem rows with a 'values' field; use 'rollouts'")
    start, end = block(len(rows))
    rows = list(rows)[start:end]
    own = generator is None
    if own:
        kw = {"batch_size": min(256, max(1, len(rows) * cfg.samples_per_question))} if resolve_backend(cfg.backend) == "hf" \
            else dict(cfg.generator_kwargs)
        generator = make_generator(cfg.backend, policy, tokenizer, **kw)
    fmt = prompt_format(tokenizer)
    prompts = [fmt.prompt(r["question"], "cot") for r in rows]
    sp = SamplingParams(temperature=cfg.temperature, n=cfg.samples_per_question, max_new_tokens=cfg.max_new_tokens,
                        seed=cfg.seed, index_offset=start)
    outs = generator.generate(prompts, sp)
    examples: list[dict[str, Any]] = []
    for r, group in zip(rows, outs, strict=True):
        for c in group:
            ids = list(c.token_ids)
            if not ids:
                continue
            ends, texts = completion_steps(ids, tokenizer)
            outcome = int(accuracy_reward(completion=c.text, answer=r["answer"]))
            ex = {"id": r.get("id"), "question": r["question"], "answer": r["answer"], "completion_ids": ids,
                  "step_ends": ends, "step_labels": [outcome] * len(ends), "outcome": outcome,
                  "pred": extract_answer(c.text, "math"), "origin": origin}
            if "values" in r:
                ex["value_labels"] = value_step_labels(texts, r["values"], outcome)
            if cfg.labels == "values":
                ex["step_labels"] = list(ex["value_labels"])
            examples.append(ex)
    counts: dict[str, Any] = {"sampled": sum(len(g) for g in outs), "examples": len(examples)}
    if cfg.labels == "rollouts":  # every rank (a collective inside)
        counts.update(shepherd_labels(generator, tokenizer, examples, cfg))
    if own and resolve_backend(cfg.backend) == "vllm":
        generator.close()  # its memory goes back before the RM trains
    if stats is not None:
        parts = all_gather_list([counts])
        stats.update({k: sum(c[k] for c in parts) for k in counts})
    return all_gather_list(examples)


def shepherd_labels(generator: Any, tokenizer: Any, examples: list[dict[str, Any]], cfg: SampleConfig
                    ) -> dict[str, int]:
    """Math-Shepherd step labels (hard estimation) in place: step j of an output is right iff one completion from
    the prefix ending at step j reaches the gold answer; the last step keeps the outcome label.

    Completions come from one batched ``generator.generate`` over the distinct prefix prompts (chat prompt +
    steps 1..j), ``cfg.rollouts_per_step`` each; a correct output is itself a completion of each of its prefixes,
    so its steps are right without rollouts. Returns counts: prefixes needed, distinct ones sampled, completions.

    Several ranks (each with its own ``examples``): every rank calls it; the completions are seeded by the prefixes'
    positions in the ranks' concatenated list (``SamplingParams.index_offset``)."""

    fmt = prompt_format(tokenizer)

    need: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (question, prefix text) -> (example, step) using it
    for ei, ex in enumerate(examples):
        ex["step_labels"] = [int(ex["outcome"])] * len(ex["step_ends"])
        if ex["outcome"]:
            continue
        ids = ex["completion_ids"]
        for j, e in enumerate(ex["step_ends"][:-1]):
            need.setdefault((ex["question"], tokenizer.decode(ids[:e + 1], skip_special_tokens=True)), []).append((ei, j))
    keys = list(need)
    offsets = all_gather_list([len(keys)])  # the completions are seeded by their position in the whole list
    if keys:
        sp = SamplingParams(temperature=cfg.temperature, n=cfg.rollouts_per_step, max_new_tokens=cfg.max_new_tokens,
                            seed=cfg.seed + 1, index_offset=sum(offsets[:rank()]))
        outs = generator.generate([fmt.prompt(q, "cot") + prefix for q, prefix in keys], sp)
        for key, group in zip(keys, outs, strict=True):
            prefix = key[1]
            for ei, j in need[key]:
                ex = examples[ei]
                ex["step_labels"][j] = int(any(
                    accuracy_reward(completion=prefix + c.text, answer=ex["answer"]) == 1.0 for c in group))
    n_prefixes = sum(len(v) for v in need.values())
    return {"prefixes": n_prefixes, "distinct_prefixes": len(keys), "completions": len(keys) * cfg.rollouts_per_step}

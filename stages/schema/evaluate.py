"""Schema of params.yaml's ``evaluate`` section: which models are evaluated how."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from stages.schema.base import RUNTIME, DataPath, NonNegInt, PosFloat, PosInt, Section, TimeoutS, Workers

EvalMode = Literal["cot", "pot", "tir"]
"""cot: chain of thought; pot: program of thought (``solution()`` run in the sandbox); tir: tool-integrated."""

_MODEL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class EvalModelParams(Section):
    """One model to evaluate: one dvc stage ``evaluate@<name>`` (dvc.yaml ``foreach`` over ``evaluate.models``)."""

    path: str
    """The model's HF directory (a pipeline output such as data/models/sft; checked when its stage runs)."""
    prompting: Literal["few_shot", "zero_shot"] = "zero_shot"
    """few_shot: DeepSeekMath few-shot prompts (base / pretrained models); zero_shot: the chat prompt with the DeepSeekMath instruction (SFT / RL models)."""
    greedy_modes: list[EvalMode] = ["cot"]
    """Modes scored with greedy decoding (top-1 accuracy), e.g. [cot, pot, tir]."""
    sample_modes: list[EvalMode] = []
    """Modes scored from n_samples samples at common.temperature (pass@k, maj@k); [] for none."""
    n_samples: PosInt = 64
    """Samples per problem in sample_modes; k runs over 1, 2, 4, ... up to it (paper Figure 7: up to 64)."""
    limit: PosInt | None = None
    """At most this many problems of each benchmark for this model (the first ones; never above common.limit); null: common.limit."""


CheckerMode = Literal["strict", "deepseekmath"]
"""Answer checker modes (stages/core/answers.py; docs/evaluation.md has their rules and a table of cases)."""


class EvalCheckerParams(Section):
    """How answers are judged: which checker mode each use reads. Every completion is judged in both modes and by
    math-verify alone (the verifier-sensitivity table of the evaluation's details and the report)."""

    headline: CheckerMode = "strict"
    """Mode of the headline metrics (acc, avg@n, pass@k, maj@k in data/metrics): strict (percent forms only where
    written, relative tolerance, lists / intervals / units as such, several different final answers wrong, no
    last-number fallback) or deepseekmath (the reference evaluator's rules)."""
    report: CheckerMode = "deepseekmath"
    """Mode of the accuracies the report sets beside the paper's (deepseekmath: the rules the paper's numbers were
    measured with)."""
    timeout_s: TimeoutS = 5.0
    """Deadline of one check in the checking worker (a check past it is a timeout: never right, counted)."""
    math_verify: bool = True
    """Also record math-verify's own verdict on every completion (its extraction and verify; a worker call each)."""


class EvalCommonParams(Section):
    """Settings every evaluated model shares."""

    backend: Literal["auto", "hf", "vllm"] = "auto"
    """Generation backend (stages/core/generation.py): auto picks vllm on a GPU, hf otherwise."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype for generation; auto: bfloat16 where it is fast (CUDA, CPUs with AMX), else float32."""
    num_threads: NonNegInt = 0
    """Most torch CPU threads (0 = every core); fewer while other work competes (stages/core/threads.py), and the
    results are the same bytes at any count."""
    batch_size: PosInt = 256
    """Prompts per generate call and per resumable checkpoint write; the hf backend decodes all their samples together."""
    max_new_tokens: PosInt = 1024
    """Most new tokens per generation (per round in tir mode; the reference evaluation, deepseek-ai/DeepSeek-Math: 1024)."""
    temperature: PosFloat = 0.7
    """Sampling temperature of sample_modes (paper 5.2.2 / Figure 7's pass@k / maj@k: 0.7)."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """Nucleus sampling threshold of sample_modes (reference: 1.0)."""
    seed: NonNegInt = 0
    """Sampling seed (each batch uses seed + its index, so a resumed run draws the same samples)."""
    tir_max_rounds: PosInt = 2
    """Most generate/execute rounds in tir mode (reference: 2)."""
    exec_timeout_s: TimeoutS = 10.0
    """CPU-time limit of one program run in the sandbox: the same outcome at any load (a wall-clock cap of 3x it:
    stages.core.sandbox.cpu_limit; reference: 10)."""
    exec_workers: Annotated[Workers, RUNTIME] = 2
    """Sandbox worker processes for pot / tir programs."""
    maj_subsets: PosInt = 256
    """maj@k averages over every k-subset of the samples when there are at most this many, else over this many random ones."""
    checker: EvalCheckerParams = EvalCheckerParams()
    """Answer checking: the mode of the headline and of the report's paper comparison, the deadline of one check."""
    n_shots: NonNegInt = 8
    """Few-shot exemplars (from the SFT split, Q:/A: format) in few_shot prompts for the generated problems (the
    reference evaluation's 8-shot)."""
    limit: PosInt | None = None
    """Evaluate at most this many problems of each benchmark (the first ones); null: all."""
    sample_limit: PosInt | None = None
    """At most this many problems of each benchmark in sample_modes (a subset of limit); null: all."""
    testsets: DataPath
    """Where the benchmarks are: the testsets stage's directory (data/testsets), one file per test set."""
    benchmarks: list[str] = ["gsm8k", "math"]
    """The test sets to evaluate, by name (files <testsets>/<name>.jsonl; names of testsets.datasets), e.g.
    [gsm8k, math] (the paper's English benchmarks, the default); each is scored with its rows' family (gsm8k / math /
    generated: prompts and answer extraction)."""

    @field_validator("benchmarks")
    @classmethod
    def _check_benchmarks(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("name at least one test set to evaluate")
        if len(set(v)) != len(v):
            raise ValueError(f"a test set is named twice: {v}")
        return v


class EvaluateParams(Section):
    """Section ``evaluate``: which models are evaluated how (one dvc stage per model)."""

    SECTION = "evaluate"

    common: EvalCommonParams
    """Settings shared by every model (dvc tracks them for every evaluate@ stage)."""
    models: dict[str, EvalModelParams]
    """Models by name (lowercase, digits, underscores); adding one adds a dvc stage and re-runs no other."""

    @field_validator("models")
    @classmethod
    def _check_names(cls, v: dict[str, EvalModelParams]) -> dict[str, EvalModelParams]:
        bad = [k for k in v if not _MODEL_NAME.match(k)]
        if bad:
            raise ValueError(f"model names must match [a-z][a-z0-9_]* (used in file and stage names): {bad}")
        idle = [k for k, m in v.items() if not m.greedy_modes and not m.sample_modes]
        if idle:
            raise ValueError(f"model(s) {idle} have no greedy_modes and no sample_modes (they would evaluate nothing)")
        return v

"""The evaluation loop: generate, run programs (PoT / TIR), extract answers, judge them, checkpoint; the summary
of a greedy run (:func:`greedy_summary`, which GRPO's held-out curve reports too).

One *run* is a (benchmark, mode, decoding) triple, e.g. ``generated_cot_greedy`` or ``gsm8k_cot_sample``.
Its problems are processed in fixed batches of ``batch_size``; each finished batch is appended to the
run's checkpoint JSONL with one ``write`` + ``fsync``, so an interrupted run resumes after its last
finished batch. Batch ``b`` always holds the same problems and samples with seed ``seed + b``, so a
resumed run draws the same samples as an uninterrupted one (given a deterministic backend).

Generation and execution go through the loop shared with RL rollouts, stages/core/tool_loop.py (``run_loop``,
text carry as the reference evaluator, one chunk per batch). Modes:
- ``cot``: the completion is the answer text (what each checker mode reads in it: stages.core.answers.final_answers).
- ``pot``: the completion is a ``def solution()`` program (or holds one in a ```python block); it runs in
  the sandbox and ``str(solution())`` is the answer.
- ``tir``: DeepSeekMath's tool-integrated loop: generate until ```` ```output ````, run the code written so far
  (earlier blocks without their prints, then the last block; output cut to 50 + 50 characters), append the
  ```output block and continue; at most ``tir_max_rounds`` generations (reference 2). After the last round the
  output is still injected, so the answer can come from the last ```output block, as in the reference.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core import threads
from stages.core.answers import MODES, RIGHT, check_many, final_answers, math_verify_many
from stages.core.generation import SamplingParams
from stages.core.io import iter_jsonl
from stages.core.problems import Problem
from stages.core.prompts import PromptFormat, prompt_format
from stages.core.stats import mean_se
from stages.core.tool_loop import Stream, pot_program, run_loop  # noqa: F401 - pot_program: read from here too
from stages.evaluate.benchmarks import build_prompt, stop_strings


def generator_format(generator: Any) -> PromptFormat | None:
    """The zero-shot prompt format of the model a generator decodes with (None when it exposes no tokenizer)."""
    tok = getattr(generator, "tokenizer", None)
    return None if tok is None else prompt_format(tok)


@dataclass(frozen=True)
class RunSpec:
    """What one run evaluates."""

    benchmark: str  # the test set's name (metrics key)
    mode: str  # cot | pot | tir
    decoding: str  # greedy | sample
    n: int  # completions per problem (1 for greedy)
    family_: str | None = None  # generated | gsm8k | math: prompts and answer extraction; None: the name's

    @property
    def family(self) -> str:
        """The benchmark family (stages.core.problems.FAMILIES): few-shot prompt, stops, answer extraction."""
        return self.family_ or self.benchmark

    @property
    def name(self) -> str:
        return f"{self.benchmark}_{self.mode}_{self.decoding}"


@dataclass(frozen=True)
class LoopSettings:
    """Run-independent settings of the loop (from evaluate.common)."""

    batch_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    tir_max_rounds: int
    exec_timeout_s: float
    exec_workers: int
    checker: str = "strict"  # the headline mode: "correct" is its verdict
    check_timeout_s: float = 5.0  # deadline of one answer check
    math_verify: bool = True  # also math-verify's own verdict on each completion


def sampling_params(spec: RunSpec, s: LoopSettings, stops: tuple[str, ...], batch_index: int, n: int | None = None,
                    round_: int = 0) -> SamplingParams:
    """Greedy (temperature 0, n 1) or sampling at ``s.temperature`` with seed ``seed + batch + round``."""
    if spec.decoding == "greedy":
        return SamplingParams(temperature=0.0, n=1, max_new_tokens=s.max_new_tokens, stop=stops, seed=s.seed)
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, n=spec.n if n is None else n,
                          max_new_tokens=s.max_new_tokens, stop=stops,
                          seed=s.seed + batch_index + 1_000_003 * round_)


def completion_record(st: Stream, mode: str) -> dict[str, Any]:
    """The checkpoint record of one output: text, finish reason, generated tokens; tir: rounds and program runs;
    pot: the program's status and answer."""
    rec: dict[str, Any] = {"text": st.text, "finish_reason": st.finish_reason, "n_tokens": st.n_tokens}
    if mode == "tir":
        rec.update(rounds=st.rounds, executions=st.executions)
    elif mode == "pot":
        rec.update(exec_status=st.exec_status, answer=st.program_answer)
    return rec


def evaluate_batch(generator: Any, problems: Sequence[Problem], spec: RunSpec, s: LoopSettings, prompting: str,
                   exemplars: list[tuple[str, str]] | None, batch_index: int,
                   pool: ThreadPoolExecutor, fmt: PromptFormat | None = None) -> list[dict[str, Any]]:
    """Generate, execute, extract and judge one batch; returns one record per problem. ``fmt``: the zero-shot prompt
    format (default: the generator's model's; GRPO's held-out curve passes its RL template's)."""
    stops = stop_strings(spec.family, spec.mode, prompting)
    fmt = fmt or generator_format(generator)
    prompts = [build_prompt(p, spec.mode, prompting, exemplars, fmt) for p in problems]
    streams = run_loop(generator, prompts, spec.mode,
                       lambda r, _c: sampling_params(spec, s, stops, batch_index, n=None if r == 0 else 1, round_=r),
                       pool, max_rounds=s.tir_max_rounds, exec_timeout_s=s.exec_timeout_s)
    comps = [[completion_record(st, spec.mode) for st in group] for group in streams]
    judge([c for cs in comps for c in cs], [p.gold for p, cs in zip(problems, comps, strict=True) for _ in cs],
          spec.family, spec.mode, s)
    records = []
    for p, cs in zip(problems, comps, strict=True):
        records.append({
            "id": p.id, "benchmark": p.benchmark, "mode": spec.mode, "decoding": spec.decoding,
            "difficulty": p.difficulty, "question": p.question, "gold": p.gold,
            "n_correct": sum(c["correct"] for c in cs), "completions": cs,
        })
    return records


def judge(flat: list[dict[str, Any]], golds: list[str], family: str, mode: str, s: LoopSettings) -> None:
    """Judge every completion record in place, in each checker mode and by math-verify alone.

    Each record gets ``verdicts`` (``strict`` / ``deepseekmath`` / ``math_verify``: right, wrong, timeout or
    refused), ``answer`` (what the headline mode read: its one answer, or the last of several; a PoT program's
    answer as it returned it), ``answers`` (strict: every distinct final answer when there are several) and
    ``correct`` (the headline verdict is right). The percent rule of the deepseekmath mode (gold x 100 or / 100) is
    on for the real benchmarks it was made for; on the generated integer problems it would count 200 as right for a
    gold of 2."""
    bench = "math" if family == "math" else "gsm8k"
    preds: dict[str, list[list[str]]] = {}
    for m in MODES:
        if mode == "pot":
            preds[m] = [[] if c.get("answer") is None else [str(c["answer"])] for c in flat]
        else:
            preds[m] = [final_answers(c["text"], bench, mode=m) for c in flat]
    verdicts = {m: check_many(preds[m], golds, mode=m, timeout_s=s.check_timeout_s, workers=s.exec_workers,
                              percent_variants=family != "generated") for m in MODES}
    if s.math_verify:
        texts = [c.get("answer") if mode == "pot" else c["text"] for c in flat]
        verdicts["math_verify"] = math_verify_many(texts, golds, timeout_s=s.check_timeout_s, workers=s.exec_workers)
    for i, c in enumerate(flat):
        head = preds[s.checker][i]
        c["answer"] = head[-1] if head else None
        if len(preds["strict"][i]) > 1:
            c["answers"] = preds["strict"][i]
        c["verdicts"] = {k: v[i] for k, v in verdicts.items()}
        c["correct"] = verdicts[s.checker][i] == RIGHT


def frac(xs: Any) -> float:
    """The share of true values among ``xs``, to 4 digits (0 for none)."""
    xs = list(xs)
    return round(sum(bool(x) for x in xs) / len(xs), 4) if xs else 0.0


def greedy_summary(records: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The metrics of a greedy run (one completion per problem, in ``mode``): accuracy with its standard error,
    no-answer and truncated shares, mean tokens, per difficulty and per problem."""
    comps = [r["completions"][0] for r in records]
    acc, se = mean_se([float(x["correct"]) for x in comps])
    out: dict[str, Any] = {
        "acc": round(acc, 4),
        "acc_se": round(se, 4),
        "n": len(records),
        "no_answer": frac(x["answer"] is None for x in comps),
        "truncated": frac(x["finish_reason"] == "length" for x in comps),
        "mean_tokens": round(sum(x["n_tokens"] for x in comps) / max(1, len(comps)), 2),
    }
    if mode == "pot":
        out["exec_ok"] = frac(x.get("exec_status") == "ok" for x in comps)
    if mode == "tir":
        out["mean_executions"] = round(sum(x.get("executions", 0) for x in comps) / max(1, len(comps)), 3)
    by: dict[str, list[bool]] = {}
    for r, x in zip(records, comps, strict=True):
        by.setdefault(str(r["difficulty"]), []).append(x["correct"])
    out["by_difficulty"] = {d: {"acc": frac(v), "n": len(v)} for d, v in sorted(by.items())}
    out["per_problem"] = {"ids": [r["id"] for r in records], "acc": [int(x["correct"]) for x in comps]}
    return out


def read_checkpoint(path: Path) -> dict[str, dict[str, Any]]:
    """Finished records of a run's checkpoint by problem id (a torn last line is ignored)."""
    if not path.is_file():
        return {}
    return {r["id"]: r for r in iter_jsonl(path, skip_bad=True) if "id" in r}


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line (a kill in the middle of a write) so that appends start on a fresh line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def run_one(generator: Any, problems: Sequence[Problem], spec: RunSpec, s: LoopSettings, prompting: str,
            exemplars: list[tuple[str, str]] | None, checkpoint: Path,
            progress: Callable[[int, int], None] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Evaluate ``problems`` for one run, resuming from ``checkpoint``; returns (records in problem order,
    number of problems resumed from the checkpoint)."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(checkpoint)
    done = read_checkpoint(checkpoint)
    resumed = sum(1 for p in problems if p.id in done)
    with ThreadPoolExecutor(max_workers=max(1, s.exec_workers)) as pool:
        for b, batch in _batches(problems, s.batch_size):
            todo = [p for p in batch if p.id not in done]
            if todo:
                threads.step()  # forward-only: the thread count follows the load (stages/core/threads.py)
                recs = evaluate_batch(generator, todo, spec, s, prompting, exemplars, b, pool)
                _append(checkpoint, recs)
                done.update({r["id"]: r for r in recs})
            if progress is not None:
                progress(min((b + 1) * s.batch_size, len(problems)), len(problems))
    return [done[p.id] for p in problems], resumed


def _batches(items: Sequence[Problem], size: int) -> Iterator[tuple[int, Sequence[Problem]]]:
    for b, start in enumerate(range(0, len(items), size)):
        yield b, items[start:start + size]

"""Generate -> execute -> inject: the one loop behind CoT, PoT and TIR generation, shared by the evaluation stage
(stages/evaluate/loop.py) and RL rollouts (stages/rl/rollout.py).

Modes (:func:`run_loop`, one mode per call):

- ``cot``: one generation; the completion is the answer text.
- ``pot``: one generation, then the program (:func:`pot_program`: the last ```python block, else the text before
  any ```` ``` ````) runs in the sandbox (``stages.core.sandbox.run_pot``); ``str(solution())`` is the program's
  answer (``Stream.program_answer``; None unless the program ran to completion).
- ``tir``: DeepSeekMath's tool-integrated loop: generate until ```` ```output ```` (:data:`TIR_STOP`), run the code
  written so far (``extract_tir_code``: earlier blocks without their prints, then the last block; the output cut to
  50 + 50 characters, ``tir_output``), append the output block and continue; at most ``max_rounds`` generations
  (reference: 2). After the last round the output is still injected, so the answer can come from the last
  ```output block, as in the reference. A stop at ```` ```output ```` with no closed code block before it injects
  nothing (the next round continues the response).

What the next TIR round continues from (``carry``):

- ``"text"`` (the evaluation stage; the reference evaluator's way): the prompt + the response text so far,
  re-tokenised by the generator; the text before the stop word loses the stop word and its trailing whitespace,
  then ``tir_output_block`` (``\\n```output\\n{out}\\n```\\n``) is appended.
- ``"tokens"`` (RL rollouts): the exact ids: the prompt is tokenised once (``Stream.prompt_ids``) and every round,
  the first included, goes to the generator as ids (``generate_ids``, both backends have it; a generator without it
  gets the text in round 1); then the prompt's ids + every token generated so far (the ```` ```output ````
  the policy wrote included) + the tokenised rest of the output block (``\\n{out}\\n```\\n``, less any characters
  that the token completing the stop word already carried). The sequence the update trains on is then, token for
  token, the one the sampler saw: every policy token keeps the log-prob it was sampled with, and
  ``Stream.policy_mask`` is 0 on the injected tokens, which the loss and the KL leave out. Re-tokenising the text
  (the reference's way) would put the policy's tokens in a context other than the one they were sampled in.

Tool output is text, never control tokens: a program that prints its tokenizer's EOS (``</s>``, ``<|im_end|>``,
...) or any other special token's text must not end the response or open a chat turn. With ``"tokens"`` the output
block is tokenised with special-token strings split into ordinary tokens (:func:`tool_output_ids`, the text kept as
printed); with ``"text"``, where the generator re-tokenises the whole context, a zero-width space is put after the
first character of each special-token string in the output (:func:`plain_text`). SFT targets are tokenised the same
way (``stages.train.data.make_example``: the response with split special tokens, EOS appended by id).

Concurrency: programs run on ``pool`` (threads, each driving one sandbox process) while the generator works. The
prompts are split into ``chunks`` fixed, contiguous groups, processed in a fixed order (round 1 of chunk 1, round 1
of chunk 2, ..., round 2 of chunk 1, ...): a chunk's programs run while the next chunk generates, and a chunk waits
for its programs only when its next round starts (PoT: at the end). The generator calls, their order and their
seeds (``sampling(round, chunk)``) never depend on timing, so the results are deterministic for a given ``chunks``;
with ``chunks=1`` generation and execution alternate (the evaluation stage, one batch at a time).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from stages.core.generation import Completion, SamplingParams, tokenize_prompts
from stages.core.sandbox import (
    ExecResult,
    cpu_limit,
    extract_tir_code,
    run_pot,
    run_python,
    tir_output,
    tir_output_block,
)

TIR_STOP = "```output"
"""Where tool-integrated generation pauses for the code to run (DeepSeekMath's stop word)."""
MODES = ("cot", "pot", "tir")
Carry = Literal["text", "tokens"]

_OUTPUT_HEAD = "\n" + TIR_STOP  # tir_output_block(out) == _OUTPUT_HEAD + "\n" + out + "\n```\n"
_PY_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


ZERO_WIDTH_SPACE = "\u200b"


def special_strings(tokenizer: Any) -> list[str]:
    """The text of every special token of ``tokenizer`` (BOS, EOS, PAD, UNK, chat markers and other added special
    tokens), longest first; [] without a tokenizer."""
    if tokenizer is None:
        return []
    out = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or []}
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            out.add(str(added))
    return sorted((t for t in out if len(t) > 1), key=lambda t: (-len(t), t))


def plain_text(text: str, tokenizer: Any) -> str:
    """``text`` with a zero-width space after the first character of every special-token string of ``tokenizer``
    in it, so that tokenising the result never yields a special token (for contexts that are re-tokenised as a
    whole: ``carry="text"``). Text without such strings is returned unchanged."""
    specials = special_strings(tokenizer)
    while any(sp in text for sp in specials):
        for sp in specials:
            text = text.replace(sp, sp[0] + ZERO_WIDTH_SPACE + sp[1:])
    return text


def tool_output_ids(tokenizer: Any, text: str) -> tuple[str, list[int]]:
    """(text, ids) of tool output injected into a token context: ``text`` tokenised as text, its special-token
    strings split into ordinary tokens (``split_special_tokens``), so no id is a special token's; a tokenizer that
    cannot split gets :func:`plain_text` instead (and that text is returned)."""
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    special = set(getattr(tokenizer, "all_special_ids", None) or []) - {getattr(tokenizer, "unk_token_id", None)}
    special |= {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
                if getattr(t, "special", False)}
    if special.intersection(ids):
        text = plain_text(text, tokenizer)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return text, ids


def pot_program(text: str) -> str:
    """The program of a PoT completion: its last ```python block, else the text before any ```` ``` ````;
    leading whitespace of the first line removed (responses start with a space)."""
    blocks = _PY_BLOCK.findall(text)
    code = blocks[-1] if blocks else text.split("```")[0]
    return code.lstrip().rstrip()


def strip_stops(text: str, stops: Sequence[str]) -> str:
    """``text`` without a trailing few-shot stop string (the generator keeps the stop string it hit; the TIR stop
    word is not removed here)."""
    for s in stops:
        if s != TIR_STOP and text.endswith(s):
            return text[: -len(s)]
    return text


@dataclass
class Stream:
    """One output: sample ``sample`` of prompt ``prompt``, over all its rounds.

    ``prompt_ids`` / ``token_ids`` / ``logprobs`` / ``policy_mask`` (``carry="tokens"`` only; empty with ``"text"``):
    the prompt's ids as the generator got them; every completion token in order, generated and injected; the
    sampler's log-prob of each generated token (0.0 on injected ones); 1 on generated tokens, 0 on injected ones. ``n_tokens``: generated tokens over all rounds. ``finish_reason``:
    the last generation's ("stop" / "length"), or "tool" when the last round stopped for a program.
    ``exec_status`` / ``program_answer``: PoT's program run (its status; ``str(solution())`` or None)."""

    prompt: int
    sample: int
    text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    n_tokens: int = 0
    rounds: int = 0
    executions: int = 0
    exec_status: str | None = None
    program_answer: str | None = None

    def add(self, c: Completion, tokens: bool) -> None:
        """Append one generation."""
        self.text += c.text
        if tokens:
            ids = list(c.token_ids)
            lps = [float(x) for x in c.logprobs][: len(ids)]
            self.token_ids += ids
            self.logprobs += lps + [float("nan")] * (len(ids) - len(lps))
            self.policy_mask += [1] * len(ids)
        self.n_tokens += len(c.token_ids)
        self.finish_reason = c.finish_reason
        self.rounds += 1

    def inject(self, text: str, ids: Sequence[int]) -> None:
        """Append tool output the policy did not write (``ids`` empty with ``carry="text"``)."""
        self.text += text
        self.token_ids += list(ids)
        self.logprobs += [0.0] * len(ids)
        self.policy_mask += [0] * len(ids)


@dataclass
class LoopStats:
    """Where a loop's time went, summed over its calls: ``generate_s`` in generator calls, ``wait_s`` blocked on
    programs (the generator idle), ``exec_s`` the programs' own wall time (the sandbox's ``ExecResult.wall_s``),
    ``wall_s`` the loops' total; ``programs`` run, ``failed`` of them not exiting 0 (error, timeout, killed)."""

    generate_s: float = 0.0
    wait_s: float = 0.0
    exec_s: float = 0.0
    wall_s: float = 0.0
    programs: int = 0
    failed: int = 0

    def metrics(self, prefix: str = "tool_") -> dict[str, float]:
        """The figures as step metrics, plus ``programs_per_s`` (programs / wall) and ``wait_frac`` (wait / wall)."""
        w = self.wall_s
        return {f"{prefix}programs": float(self.programs), f"{prefix}failed": float(self.failed),
                f"{prefix}generate_s": self.generate_s, f"{prefix}wait_s": self.wait_s, f"{prefix}exec_s": self.exec_s,
                f"{prefix}wall_s": w, f"{prefix}programs_per_s": self.programs / w if w > 0 else 0.0,
                f"{prefix}wait_frac": self.wait_s / w if w > 0 else 0.0}


@dataclass
class _Job:
    """A program submitted for a stream; ``extra``: what the stop-completing token carried past the stop word."""

    stream: Stream
    future: Future[Any] | None
    extra: str = ""


def _chunks(n: int, k: int) -> list[tuple[int, int]]:
    """``k`` contiguous (start, end) ranges covering 0..n, sizes differing by at most one."""
    k = max(1, min(k, n))
    q, r = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        end = start + q + (1 if i < r else 0)
        out.append((start, end))
        start = end
    return out


class _Loop:
    """One :func:`run_loop` call's state."""

    def __init__(self, generator: Any, prompts: Sequence[str], mode: str, pool: Executor, max_rounds: int,
                 exec_timeout_s: float, carry: Carry, tokenizer: Any, stats: LoopStats) -> None:
        self.generator, self.prompts, self.mode, self.pool = generator, list(prompts), mode, pool
        self.max_rounds, self.timeout, self.carry, self.tok, self.stats = max_rounds, exec_timeout_s, carry, tokenizer, stats
        self.tokens = carry == "tokens"
        if self.tok is None:  # text carry: the generator's tokenizer tells which strings are special
            self.tok = getattr(generator, "tokenizer", None)
        ids_ok = callable(getattr(generator, "generate_ids", None)) and tokenizer is not None
        self.prompt_ids = tokenize_prompts(tokenizer, self.prompts) if self.tokens and (ids_ok or mode == "tir") \
            else None
        self.streams: list[list[Stream]] = [[] for _ in self.prompts]
        self.stops: tuple[str, ...] = ()
        self._extras: dict[int, str] = {}

    def generate(self, sp: SamplingParams, lo: int, hi: int, todo: list[Stream] | None) -> list[Stream]:
        """Round 1 of prompts lo..hi (``todo`` None), or the next round of the streams ``todo``; returns the streams
        that were generated for."""
        t0 = time.perf_counter()
        if todo is None:
            if self.prompt_ids is not None:  # token in: the ids the rollout will lay out, tokenised once
                outs = self.generator.generate_ids(self.prompt_ids[lo:hi], sp)
            else:
                outs = self.generator.generate(self.prompts[lo:hi], sp)
            for i, group in zip(range(lo, hi), outs, strict=True):
                pids = list(self.prompt_ids[i]) if self.prompt_ids is not None else []
                self.streams[i] = [Stream(i, j, prompt_ids=list(pids)) for j in range(len(group))]
                for st, c in zip(self.streams[i], group, strict=True):
                    st.add(c, self.tokens)
            todo = [st for i in range(lo, hi) for st in self.streams[i]]
            comps = [c for group in outs for c in group]
        else:
            sp = replace(sp, n=1)
            if self.tokens:
                assert self.prompt_ids is not None
                outs = self.generator.generate_ids([self.prompt_ids[st.prompt] + st.token_ids for st in todo], sp)
            else:
                outs = self.generator.generate([self.prompts[st.prompt] + st.text for st in todo], sp)
            comps = [group[0] for group in outs]
            for st, c in zip(todo, comps, strict=True):
                st.add(c, self.tokens)
        self.stats.generate_s += time.perf_counter() - t0
        self._extras = {id(st): self._extra(c) for st, c in zip(todo, comps, strict=True)} if self.tokens else {}
        return todo

    def _extra(self, c: Completion) -> str:
        """Characters past the stop word in the token that completed it (decoded ids minus the cut text)."""
        if c.finish_reason != "stop" or not c.text.endswith(TIR_STOP):
            return ""
        full = self.tok.decode(list(c.token_ids), skip_special_tokens=True)
        return full[len(c.text):] if full.startswith(c.text) else ""

    def submit(self, done: list[Stream]) -> list[_Job]:
        """The programs of the streams just generated: tir: those that stopped at the stop word (each then waits
        for its tool, ``finish_reason`` "tool"); pot: every stream."""
        jobs = []
        for st in done:
            if self.mode == "pot":
                code = pot_program(strip_stops(st.text, self.stops))
                jobs.append(_Job(st, self.pool.submit(run_pot, code, **cpu_limit(self.timeout))))
                continue
            if not (st.finish_reason == "stop" and st.text.endswith(TIR_STOP)):
                continue
            stripped = st.text[: -len(TIR_STOP)].rstrip()  # the reference keeps the text without its stop word
            code = extract_tir_code(stripped)
            extra = self._extras.get(id(st), "")
            if self.tokens:
                st.text += extra  # the text follows the tokens: the policy's stop word stays
            else:
                st.text = stripped
            st.finish_reason = "tool"  # paused for the tool; set again by the next generation
            job = self.pool.submit(run_python, code, **cpu_limit(self.timeout)) if code else None
            jobs.append(_Job(st, job, extra))
        return jobs

    def collect(self, jobs: list[_Job]) -> None:
        """Wait for ``jobs`` and apply their results (inject TIR outputs, record PoT answers)."""
        for job in jobs:
            if job.future is None:
                continue  # no code to run: nothing to inject
            t0 = time.perf_counter()
            result = job.future.result()
            self.stats.wait_s += time.perf_counter() - t0
            res: ExecResult = result[0] if self.mode == "pot" else result
            self.stats.programs += 1
            self.stats.exec_s += res.wall_s
            self.stats.failed += int(res.status != "ok")
            st = job.stream
            if self.mode == "pot":
                value = result[1]
                st.exec_status = res.status
                st.program_answer = None if value is None else str(value).strip()
                continue
            block = tir_output_block(tir_output(res))
            st.executions += 1
            if not self.tokens:
                st.inject(plain_text(block, self.tok), [])  # re-tokenised with the context: no special string
                continue
            rest = block[len(_OUTPUT_HEAD):]  # the policy wrote the stop word itself: "\n{out}\n```\n" follows
            add = rest[len(job.extra):] if rest.startswith(job.extra) else rest
            st.inject(*tool_output_ids(self.tok, add))  # as text: special-token strings split, never special ids


def run_loop(generator: Any, prompts: Sequence[str], mode: str, sampling: Callable[[int, int], SamplingParams],
             pool: Executor | None = None, *, max_rounds: int = 2, exec_timeout_s: float = 10.0, carry: Carry = "text",
             tokenizer: Any = None, chunks: int = 1, stats: LoopStats | None = None) -> list[list[Stream]]:
    """Generate (and for pot / tir execute and inject) for ``prompts`` in ``mode``; returns ``streams[prompt][k]``,
    the prompt's ``n`` outputs (``n`` of round 1's sampling params).

    ``sampling(round, chunk)``: the sampling params of a generation (round 0: ``n`` outputs per prompt; later rounds
    generate one continuation per output, ``n`` is set to 1); tir adds :data:`TIR_STOP` to its stops. ``pool``:
    where programs run (None: a pool of one thread for this call). ``carry``, ``chunks``: see the module docstring
    (tir with ``"tokens"`` needs ``tokenizer`` and a generator with ``generate_ids``, as both backends have). ``stats``:
    accumulates the time split. The few-shot stop strings are stripped from the final texts (:func:`strip_stops`)."""
    if mode not in MODES:
        raise ValueError(f"run_loop: mode must be one of {', '.join(MODES)}, not {mode!r}")
    if carry not in ("text", "tokens"):
        raise ValueError(f"run_loop: carry must be 'text' or 'tokens', not {carry!r}")
    if carry == "tokens" and mode == "tir" and tokenizer is None:
        raise ValueError("run_loop: tir with carry='tokens' needs the tokenizer")
    stats = LoopStats() if stats is None else stats
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if pool is None and mode != "cot":
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox"))
        loop = _Loop(generator, prompts, mode, pool, max_rounds, exec_timeout_s, carry, tokenizer, stats)  # type: ignore[arg-type]
        parts = _chunks(len(prompts), chunks if mode != "cot" else 1)
        jobs: list[list[_Job]] = [[] for _ in parts]
        rounds = max_rounds if mode == "tir" else 1
        for round_ in range(rounds):
            for c, (lo, hi) in enumerate(parts):
                sp = sampling(round_, c)
                if mode == "tir" and TIR_STOP not in sp.stop:
                    sp = replace(sp, stop=(*sp.stop, TIR_STOP))
                if round_ == 0:
                    loop.stops = sp.stop
                    done = loop.generate(sp, lo, hi, None)
                else:
                    loop.collect(jobs[c])
                    todo = [st for i in range(lo, hi) for st in loop.streams[i] if st.finish_reason == "tool"]
                    if not todo:
                        jobs[c] = []
                        continue
                    done = loop.generate(sp, lo, hi, todo)
                jobs[c] = loop.submit(done) if mode != "cot" else []
        for js in jobs:  # the last round's programs (tir: their output is injected too, as in the reference)
            loop.collect(js)
    for group in loop.streams:
        for st in group:
            st.text = strip_stops(st.text, loop.stops)
    stats.wall_s += time.perf_counter() - t_start
    return loop.streams

"""The generate -> execute -> inject loop shared by evaluation and RL (stages/core/tool_loop.py): token carry (the
exact ids, injected tokens marked), the stop token's extra characters, chunked overlap of programs with generation
(deterministic order and seeds), PoT execution, and a memorising tiny model end to end on the hf backend."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import torch

from stages.core.generation import Completion, SamplingParams, make_generator
from stages.core.modeling import load_model, load_tokenizer
from stages.core.prompts import chat_prompt
from stages.core.tool_loop import TIR_STOP, LoopStats, run_loop
from stages.rl.rollout import token_logprobs
from tests.tool_model import QUESTIONS

torch.set_num_threads(1)

CODE = " Let me compute.\n```python\nx = {a} + {b}\nprint(x)\n```\n```output"


@dataclass
class Scripted:
    """A generator with real token ids: ``reply(context_text, round) -> text`` (EOS appended unless the text ends at
    the TIR stop word). ``extra``: characters the stop-completing token carries past the stop word (its ids decode
    to text + extra while ``text`` is cut at the stop word, as the real backends do). Records every call."""

    tok: object
    reply: object
    extra: str = ""
    calls: list[tuple[str, object, SamplingParams]] = field(default_factory=list)

    def _comp(self, context: str) -> Completion:
        text = self.reply(context)
        stopped = text.endswith(TIR_STOP)
        ids = self.tok(text + (self.extra if stopped else ""), add_special_tokens=False)["input_ids"]
        if not stopped:
            ids = ids + [self.tok.eos_token_id]
        return Completion(text, ids, [-0.25] * len(ids), "stop")

    def generate(self, prompts, sp):
        self.calls.append(("text", list(prompts), sp))
        return [[self._comp(p) for _ in range(sp.n)] for p in prompts]

    def generate_ids(self, prompt_ids, sp):
        self.calls.append(("ids", [list(x) for x in prompt_ids], sp))
        return [[self._comp(self.tok.decode(x, skip_special_tokens=True)) for _ in range(sp.n)] for x in prompt_ids]


def _reply(context: str) -> str:
    a, b = (3, 2) if "Tom" in context else (7, 4)
    if "```output" not in context.split("Assistant:")[-1]:
        return CODE.format(a=a, b=b)
    return f"So the answer is \\boxed{{{a + b}}}."


def _greedy(round_: int, chunk: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=64)


@pytest.fixture(scope="module")
def tok(tool_model_dir):
    return load_tokenizer(tool_model_dir)


@pytest.mark.parametrize("extra", ["", "\n"])
def test_token_carry_continues_from_the_exact_ids(tok, extra: str) -> None:
    """Round 2 continues from prompt ids + the policy's ids (stop word included) + the tokenised rest of the output
    block; the injected ids are masked and have log-prob 0; a stop token that carried "\\n" past the stop word is
    not followed by a second one."""
    gen = Scripted(tok, _reply, extra=extra)
    prompts = [chat_prompt(q, "tir") for q, _, _ in QUESTIONS]
    streams = run_loop(gen, prompts, "tir", _greedy, carry="tokens", tokenizer=tok)
    assert [c[0] for c in gen.calls] == ["ids", "ids"]  # token in: round 1 gets the prompts' ids too
    assert gen.calls[0][1] == [tok(p)["input_ids"] for p in prompts]
    st = streams[1][0]
    assert st.prompt_ids == tok(prompts[1])["input_ids"]
    r1 = tok(CODE.format(a=7, b=4) + extra, add_special_tokens=False)["input_ids"]
    injected = tok("\n11\n```\n"[len(extra):], add_special_tokens=False)["input_ids"]
    assert gen.calls[1][1][1] == tok(prompts[1])["input_ids"] + r1 + injected
    r2 = tok("So the answer is \\boxed{11}.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert st.token_ids == r1 + injected + r2
    assert st.policy_mask == [1] * len(r1) + [0] * len(injected) + [1] * len(r2)
    assert st.logprobs == [-0.25] * len(r1) + [0.0] * len(injected) + [-0.25] * len(r2)
    assert st.text == CODE.format(a=7, b=4) + "\n11\n```\nSo the answer is \\boxed{11}."
    assert tok.decode(st.token_ids, skip_special_tokens=True) == st.text
    assert (st.rounds, st.executions, st.n_tokens, st.finish_reason) == (2, 1, len(r1) + len(r2), "stop")


def test_text_carry_is_the_reference_format(tok) -> None:
    """carry="text": the next prompt is prompt + text, the stop word replaced by the reference's output block."""
    gen = Scripted(tok, _reply, extra="\n")
    prompts = [chat_prompt(q, "tir") for q, _, _ in QUESTIONS]
    streams = run_loop(gen, prompts, "tir", _greedy)
    assert gen.calls[1][0] == "text" and gen.calls[1][1][0] == prompts[0] + CODE.format(a=3, b=2) + "\n5\n```\n"
    assert streams[0][0].text.endswith("```output\n5\n```\nSo the answer is \\boxed{5}.")
    assert streams[0][0].token_ids == []  # no ids kept with text carry


class LoggedPool(ThreadPoolExecutor):
    """Logs when a program is submitted and when the loop waits for its result."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(max_workers=2)
        self.log = log

    def submit(self, fn, /, *args, **kwargs):
        inner = super().submit(fn, *args, **kwargs)
        log, name = self.log, args[0].splitlines()[0]
        log.append(f"submit {name}")
        outer: Future = Future()

        def result(timeout=None):
            log.append(f"wait {name}")
            return inner.result(timeout)

        outer.result = result  # type: ignore[method-assign]
        return outer


def test_chunks_overlap_programs_with_generation(tok) -> None:
    """chunks=2: chunk 1 generates while chunk 0's programs run, and chunk 0 waits for them only when its next
    round starts; the generator calls, their order and their seeds are fixed."""
    log: list[str] = []
    seeds: list[tuple[int, int]] = []

    def reply(context: str) -> str:
        i = int(context.split("number ")[1].split(".")[0])
        return f"```python\n# q{i}\nprint({i})\n```\n```output" if "```output" not in context else f"Done {i}."

    class Logged(Scripted):
        def generate(self, prompts, sp):
            log.append(f"generate {len(prompts)}")
            return super().generate(prompts, sp)

        def generate_ids(self, ids, sp):
            log.append(f"generate {len(ids)}")
            return super().generate_ids(ids, sp)

    def sampling(round_: int, chunk: int) -> SamplingParams:
        seeds.append((round_, chunk))
        return SamplingParams(temperature=1.0, n=1, max_new_tokens=32, seed=round_ * 10 + chunk)

    prompts = [f"User: number {i}.\n\nAssistant:" for i in range(4)]
    with LoggedPool(log) as pool:
        stats = LoopStats()
        streams = run_loop(Logged(tok, reply), prompts, "tir", sampling, pool, carry="tokens", tokenizer=tok,
                           chunks=2, stats=stats)
    assert seeds == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert log == ["generate 2", "submit # q0", "submit # q1",       # chunk 0, round 1
                   "generate 2", "submit # q2", "submit # q3",       # chunk 1 generates while q0, q1 run
                   "wait # q0", "wait # q1", "generate 2",           # chunk 0, round 2
                   "wait # q2", "wait # q3", "generate 2"]           # chunk 1, round 2
    assert [s[0].text.endswith(f"```output\n{i}\n```\nDone {i}.") for i, s in enumerate(streams)] == [True] * 4
    assert stats.programs == 4 and stats.failed == 0 and stats.exec_s > 0 and stats.wall_s >= stats.generate_s


def test_pot_runs_the_program(tok) -> None:
    def reply(context: str) -> str:
        return " def solution():\n    return 6 * 7" if "Tom" in context else " def solution():\n    return 1 / 0"

    streams = run_loop(Scripted(tok, reply), [chat_prompt(q, "pot") for q, _, _ in QUESTIONS], "pot", _greedy,
                       carry="tokens", tokenizer=tok)
    (ok,), (bad,) = streams
    assert (ok.program_answer, ok.exec_status) == ("42", "ok")
    assert (bad.program_answer, bad.exec_status) == (None, "error")
    assert ok.policy_mask == [1] * len(ok.token_ids)  # nothing injected


def test_memorised_model_on_hf(tool_model_dir) -> None:
    """The real hf backend: greedy TIR writes code, stops, gets the sandbox's output, answers; with token carry the
    sampler's log-probs of every policy token equal a teacher-forced pass over prompt + all ids (round 2 was sampled
    in exactly the context the update trains on), and sampled outputs do not depend on the pool size."""
    tok, model = load_tokenizer(tool_model_dir), load_model(tool_model_dir)
    gen = make_generator("hf", model, tok)
    prompts = [chat_prompt(q, "tir") for q, _, _ in QUESTIONS]
    for carry in ("text", "tokens"):
        streams = run_loop(gen, prompts, "tir", _greedy, carry=carry, tokenizer=tok)
        for (_q, a, b), (st,) in zip(QUESTIONS, streams, strict=True):
            assert st.text.endswith(f"print(x)\n```\n```output\n{a + b}\n```\nThe answer is \\boxed{{{a + b}}}."), st.text
            assert (st.rounds, st.executions, st.finish_reason) == (2, 1, "stop")
    temp = 0.7

    def sampling(round_: int, chunk: int) -> SamplingParams:
        return SamplingParams(temperature=temp, n=3, max_new_tokens=64, seed=17 + round_ + 100 * chunk)

    runs = []
    for workers in (1, 3):
        with ThreadPoolExecutor(max_workers=workers) as pool:
            runs.append(run_loop(gen, prompts, "tir", sampling, pool, carry="tokens", tokenizer=tok, chunks=2))
    assert [[s.token_ids for s in g] for g in runs[0]] == [[s.token_ids for s in g] for g in runs[1]]
    with torch.no_grad():
        for p, group in zip(prompts, runs[0], strict=True):
            pi = tok(p)["input_ids"]
            for st in group:
                ids = torch.tensor([pi + st.token_ids])
                lp, _ = token_logprobs(model, ids, torch.ones_like(ids), len(pi), temp)
                mask = torch.tensor(st.policy_mask, dtype=torch.bool)
                assert torch.allclose(lp[0][mask], torch.tensor(st.logprobs)[mask], atol=1e-4)
                assert st.executions == 0 or not mask.all()  # an injected output is masked


def test_threads_are_not_left_behind(tok) -> None:
    before = threading.active_count()
    run_loop(Scripted(tok, _reply), [chat_prompt(QUESTIONS[0][0], "tir")], "tir", _greedy)  # its own pool
    assert threading.active_count() <= before

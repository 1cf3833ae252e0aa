"""The evaluation loop: CoT / PoT / TIR on scripted generators (exact control of the text) and on a tiny
random model, and resuming an interrupted run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stages.core.generation import Completion
from stages.core.problems import Problem
from stages.evaluate.loop import LoopSettings, RunSpec, pot_program, run_one

SETTINGS = LoopSettings(batch_size=2, max_new_tokens=32, temperature=0.7, top_p=1.0, seed=0, tir_max_rounds=2,
                        exec_timeout_s=10.0, exec_workers=2)


def _comp(text: str, finish: str = "stop") -> Completion:
    return Completion(text=text, token_ids=list(range(len(text.split()))), logprobs=[0.0] * len(text.split()),
                      finish_reason=finish)


@dataclass
class Scripted:
    """A Generator that answers by looking at the prompt: ``reply(prompt) -> text`` (finish 'stop')."""

    reply: object
    calls: list[list[str]] = field(default_factory=list)

    def generate(self, prompts, sp):
        self.calls.append(list(prompts))
        return [[_comp(self.reply(p)) for _ in range(sp.n)] for p in prompts]

    def sync_weights(self, model) -> None:  # pragma: no cover - protocol only
        pass


PROBLEMS = [Problem(f"t-{i}", "generated", f"Question {i}: what is {i} + 3?", str(i + 3), 1 + i % 2) for i in range(5)]


def test_code_helpers() -> None:
    assert pot_program("def solution():\n    return 2\n") == "def solution():\n    return 2"
    assert pot_program("Here:\n```python\ndef solution():\n    return 3\n```\nDone") == "def solution():\n    return 3"


def test_cot_greedy_scoring(tmp_path: Path) -> None:
    # right answer for even i, wrong for odd i, nothing extractable for i == 3
    def reply(prompt: str) -> str:
        i = int(prompt.split("Question ")[1].split(":")[0])
        if i == 3:
            return " I do not know."
        return f" {i} + 3 = {i + 3}. The answer is \\boxed{{{i + 3 if i % 2 == 0 else 0}}}."

    gen = Scripted(reply)
    recs, resumed = run_one(gen, PROBLEMS, RunSpec("generated", "cot", "greedy", 1), SETTINGS, "zero_shot", None,
                            tmp_path / "ck.jsonl")
    assert resumed == 0 and [r["id"] for r in recs] == [p.id for p in PROBLEMS]
    assert [r["completions"][0]["correct"] for r in recs] == [True, False, True, False, True]
    assert recs[3]["completions"][0]["answer"] is None
    assert recs[1]["completions"][0]["answer"] == "0"
    assert [len(c) for c in gen.calls] == [2, 2, 1]  # batches of 2


def test_pot_runs_solution_in_the_sandbox(tmp_path: Path) -> None:
    def reply(prompt: str) -> str:
        i = int(prompt.split("Question ")[1].split(":")[0])
        return f" def solution():\n    a = {i}\n    return a + 3" if i != 2 else " def solution():\n    return 1/0"

    recs, _ = run_one(Scripted(reply), PROBLEMS, RunSpec("generated", "pot", "greedy", 1), SETTINGS, "zero_shot",
                      None, tmp_path / "ck.jsonl")
    comps = [r["completions"][0] for r in recs]
    assert [c["correct"] for c in comps] == [True, True, False, True, True]
    assert comps[0]["answer"] == "3" and comps[0]["exec_status"] == "ok"
    assert comps[2]["answer"] is None and comps[2]["exec_status"] == "error"


def test_tir_executes_injects_and_continues(tmp_path: Path) -> None:
    def reply(prompt: str) -> str:
        i = int(prompt.split("Question ")[1].split(":")[0])
        if "```output" not in prompt:  # round 1: write code, stop at the output marker
            return f" Let me compute.\n```python\nx = {i} + 3\nprint(x)\n```\n```output"
        return f"So the answer is \\boxed{{{i + 3}}}."  # round 2 sees the injected output

    gen = Scripted(reply)
    recs, _ = run_one(gen, PROBLEMS[:2], RunSpec("generated", "tir", "greedy", 1), SETTINGS, "zero_shot", None,
                      tmp_path / "ck.jsonl")
    c = recs[1]["completions"][0]
    assert c["text"].endswith("```python\nx = 1 + 3\nprint(x)\n```\n```output\n4\n```\nSo the answer is \\boxed{4}.")
    assert c["correct"] and c["rounds"] == 2 and c["executions"] == 1 and c["finish_reason"] == "stop"
    assert len(gen.calls) == 2 and gen.calls[1][1].endswith("```output\n4\n```\n")  # prompt + response so far


def test_tir_stops_after_max_rounds(tmp_path: Path) -> None:
    gen = Scripted(lambda p: "\n```python\nprint(6 + 1)\n```\n```output")  # never answers in text
    recs, _ = run_one(gen, PROBLEMS[4:5], RunSpec("generated", "tir", "greedy", 1), SETTINGS, "zero_shot", None,
                      tmp_path / "ck.jsonl")
    c = recs[0]["completions"][0]
    assert c["rounds"] == 2 and c["executions"] == 2 and len(gen.calls) == 2
    assert c["text"].count("```output\n7\n```") == 2
    # the answer comes from the last output block (reference rule 4), 7 == 4 + 3
    assert c["answer"] == "7" and c["correct"]


def test_sampling_returns_n_completions_per_problem(tmp_path: Path) -> None:
    gen = Scripted(lambda p: " The answer is \\boxed{3}.")
    recs, _ = run_one(gen, PROBLEMS[:3], RunSpec("generated", "cot", "sample", 4), SETTINGS, "zero_shot", None,
                      tmp_path / "ck.jsonl")
    assert [len(r["completions"]) for r in recs] == [4, 4, 4]
    assert [r["n_correct"] for r in recs] == [4, 0, 0]


class Interrupt(Exception):
    pass


def test_resume_continues_where_it_stopped(tmp_path: Path) -> None:
    def reply(prompt: str) -> str:
        i = int(prompt.split("Question ")[1].split(":")[0])
        return f" The answer is \\boxed{{{i + 3}}}."

    spec = RunSpec("generated", "cot", "sample", 3)
    ck = tmp_path / "ck.jsonl"
    full, _ = run_one(Scripted(reply), PROBLEMS, spec, SETTINGS, "zero_shot", None, tmp_path / "full.jsonl")

    class Dies(Scripted):
        def generate(self, prompts, sp):
            if len(self.calls) == 2:
                raise Interrupt
            return super().generate(prompts, sp)

    with pytest.raises(Interrupt):
        run_one(Dies(reply), PROBLEMS, spec, SETTINGS, "zero_shot", None, ck)
    assert len(ck.read_text().splitlines()) == 4  # two finished batches of two
    with open(ck, "a") as f:
        f.write('{"id": "t-4", "comp')  # a torn line from a kill mid-write is ignored
    again = Scripted(reply)
    recs, resumed = run_one(again, PROBLEMS, spec, SETTINGS, "zero_shot", None, ck)
    assert resumed == 4
    assert again.calls == [[again.calls[0][0]]] and "Question 4" in again.calls[0][0]  # only the last problem
    assert recs == full

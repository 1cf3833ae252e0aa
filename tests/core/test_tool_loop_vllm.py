"""The tool loop (stages/core/tool_loop.py) on the vllm backend against the hf backend, on the memorising tiny model
(tests/tool_model.py). Skipped where vllm is not installed; .ci/slow vllm runs it in .venv-vllm::

    .venv-vllm/bin/python -m pytest tests/core/test_tool_loop_vllm.py -q
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm not installed in this environment (see docs/generation.md)")

from stages.core.generation import SamplingParams, make_generator  # noqa: E402
from stages.core.modeling import load_model, load_tokenizer  # noqa: E402
from stages.core.prompts import chat_prompt  # noqa: E402
from stages.core.tool_loop import run_loop  # noqa: E402
from stages.rl.rollout import token_logprobs  # noqa: E402
from tests.tool_model import QUESTIONS  # noqa: E402


@pytest.fixture(scope="module")
def setup(tool_model_dir):
    tok, model = load_tokenizer(tool_model_dir), load_model(tool_model_dir)
    engine = make_generator("vllm", model, tok, max_model_len=256)
    yield model, tok, engine
    engine.close()


@pytest.mark.parametrize("mode", ["tir", "pot", "cot"])
def test_greedy_tool_loop_same_as_hf(setup, mode: str) -> None:
    model, tok, engine = setup
    prompts = [chat_prompt(q, mode) for q, _, _ in QUESTIONS]

    def greedy(round_: int, chunk: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_new_tokens=64)

    runs = {name: run_loop(gen, prompts, mode, greedy, carry="tokens", tokenizer=tok, chunks=2)
            for name, gen in (("hf", make_generator("hf", model, tok)), ("vllm", engine))}
    for (_q, a, b), (h,), (v,) in zip(QUESTIONS, runs["hf"], runs["vllm"], strict=True):
        assert v.token_ids == h.token_ids and v.text == h.text and v.policy_mask == h.policy_mask
        assert torch.allclose(torch.tensor(v.logprobs), torch.tensor(h.logprobs), atol=1e-4)
        if mode == "tir":
            assert v.executions == 1 and v.text.endswith(f"```output\n{a + b}\n```\nThe answer is \\boxed{{{a + b}}}.")
        if mode == "pot":
            assert v.program_answer == str(a + b)


def test_sampled_tir_logprobs_match_teacher_forcing(setup) -> None:
    """Sampled on vLLM with token carry: every policy token's sampler log-prob equals the teacher-forced one over
    prompt + all ids, injected tokens included in the context (the RL update's pass)."""
    model, tok, engine = setup
    prompts = [chat_prompt(q, "tir") for q, _, _ in QUESTIONS]

    def sampling(round_: int, chunk: int) -> SamplingParams:
        return SamplingParams(temperature=0.7, n=3, max_new_tokens=64, seed=3 + round_ + 10 * chunk)

    streams = run_loop(engine, prompts, "tir", sampling, carry="tokens", tokenizer=tok, chunks=2)
    with torch.no_grad():
        for p, group in zip(prompts, streams, strict=True):
            pi = tok(p)["input_ids"]
            for st in group:
                ids = torch.tensor([pi + st.token_ids])
                lp, _ = token_logprobs(model, ids, torch.ones_like(ids), len(pi), 0.7)
                mask = torch.tensor(st.policy_mask, dtype=torch.bool)
                assert torch.allclose(lp[0][mask], torch.tensor(st.logprobs)[mask], atol=1e-3)

"""Token in, token out (issue 31 item 4): the ids the trainer scores are the ids the sampler got and produced, in every
rollout mode (CoT, PoT, TIR with injected tool output), never a re-tokenisation of their text.

- a property test (hypothesis): completions made of token sequences whose decoded text re-encodes to other ids (BPE
  merges across token boundaries, split multi-byte characters): the rollout's tensors hold exactly the sampler's ids,
  with TIR's injected output between two rounds (as text, special-token strings split: the sandbox branch's rule);
- end to end through the RL step on the memorising tool model: every row the update's log-prob pass scores is the
  prompt ids the generator got + its generated ids (+ for TIR the injected output ids, loss-masked)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stages.core import paths
from stages.core.generation import Completion, make_generator
from stages.core.modeling import load_model, load_tokenizer
from stages.core.tool_loop import TIR_STOP, tool_output_ids
from stages.rl.data import load_prompts
from stages.rl.loop import begin_iteration, close, run_step, setup
from stages.rl.rollout import build_rollout, rollout_prompt, sample_outputs

from .test_grpo_stage import tiny_params
from .test_tool_rollout import params, tool_project  # noqa: F401 (fixture)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok(tool_model_dir):
    return load_tokenizer(tool_model_dir)


def reencodes_differently(tok, ids: list[int]) -> bool:
    return tok(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)["input_ids"] != ids


@dataclass
class IdsGenerator:
    """Replies with given id sequences: round 1 ``first[k]`` (for TIR: plus the ids of a code block ending at the stop
    word), later rounds ``second[k]`` + EOS; records what it got and gave."""

    tok: object
    first: list[list[int]]
    second: list[list[int]]
    tir: bool = False
    calls: list[tuple[list[list[int]], list[list[int]]]] = field(default_factory=list)

    def _comp(self, ids: list[int], k: int) -> Completion:
        text = self.tok.decode(ids, skip_special_tokens=True)
        return Completion(text, ids, [-0.5 - 0.01 * t for t in range(len(ids))], "stop")

    def generate_ids(self, prompt_ids, sp):
        out, given_ = [], []
        for i, p in enumerate(prompt_ids):
            if not self.calls:  # round 1: one prompt per question
                k = i
                ids = list(self.first[k])
                if self.tir:
                    ids += self.tok("\n```python\nprint(7)\n```\n" + TIR_STOP, add_special_tokens=False)["input_ids"]
            else:  # a later round: one continuation per output, of the question whose prompt it extends
                k = next(j for j, p0 in enumerate(self.calls[0][0]) if list(p[: len(p0)]) == p0)
                ids = list(self.second[k]) + [self.tok.eos_token_id]
            out.append([self._comp(ids, k) for _ in range(sp.n)])
            given_.append(ids)
        self.calls.append(([list(p) for p in prompt_ids], given_))
        return out

    def generate(self, prompts, sp):  # never used: the rollout hands the sampler ids
        raise AssertionError("the rollout must give the sampler token ids, not text")


def _ids(tok):
    vocab = len(tok)
    special = set(tok.all_special_ids)
    return st.lists(st.integers(0, vocab - 1).filter(lambda i: i not in special), min_size=1, max_size=10)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(data=st.data())
@pytest.mark.parametrize("mode", ["cot", "pot", "tir"])
def test_rollout_holds_the_samplers_ids_exactly(tok, mode, data):
    first = [data.draw(_ids(tok)) for _ in range(2)]
    second = [data.draw(_ids(tok)) for _ in range(2)]
    if not any(reencodes_differently(tok, x) for x in first + second):
        first[0] = first[0] + tok("é", add_special_tokens=False)["input_ids"][:1]  # a lone UTF-8 byte piece
    # no backtick in the drawn text: TIR's program is then exactly the code block that follows (its output: 7)
    assume(all("`" not in tok.decode(x, skip_special_tokens=True) for x in first + second))
    p = tiny_params(rollout__group_size=2, rollout__mode=mode, rollout__chunks=1, rollout__tir_max_rounds=2)
    gen = IdsGenerator(tok, first, second, tir=mode == "tir")
    questions = [
        "Tom has 3 apples. He buys 2 more. How many apples does Tom have now?",
        "Anna has 7 coins. She finds 4 more. How many coins does Anna have now?",
    ]
    samples, _ = sample_outputs(gen, tok, questions, [mode] * 2, p, seed=0)
    prompts = [rollout_prompt(q, mode, p.template, tok) for q in questions]
    ro = build_rollout(
        [{"question": q, "answer": "5"} for q in questions],
        prompts,
        samples,
        tok,
        mask_truncated=False,
        mask_written=False,
    )
    sent = gen.calls[0][0]
    assert sent == [tok(x)["input_ids"] for x in prompts]  # token in: the prompt ids, tokenised once
    for n in range(len(ro.texts)):
        q = n // 2
        row = ro.input_ids[n][ro.attention_mask[n].bool()].tolist()
        want = sent[q] + gen.calls[0][1][q]
        lmask = [1.0] * len(gen.calls[0][1][q])
        if mode == "tir":
            _, inj = tool_output_ids(tok, "\n7\n```\n")
            want += inj + gen.calls[1][1][n]
            lmask += [0.0] * len(inj) + [1.0] * len(gen.calls[1][1][n])
            assert gen.calls[1][0][n] == sent[q] + gen.calls[0][1][q] + inj  # round 2 continued from the exact ids
        assert row == want  # token out: no re-tokenisation anywhere
        T = len(want) - len(sent[q])
        assert ro.loss_mask[n, :T].tolist() == lmask
        gave = [gen.calls[0][1][q]] + ([gen.calls[1][1][n]] if mode == "tir" else [])
        assert ro.sampler_logprobs[n, :T][torch.tensor(lmask).bool()].tolist() == pytest.approx(
            [x for ids in gave for x in gen._comp(ids, q).logprobs]
        )


@pytest.mark.parametrize("mode", ["cot", "pot", "tir"])
def test_the_trainer_scores_the_ids_the_sampler_got_and_gave(tool_project, monkeypatch, mode):  # noqa: F811
    import stages.rl.update as step_mod

    model, tok = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL)
    rows = load_prompts(paths.RL_PROMPTS)
    inner = make_generator("hf", model, tok)
    seen: list[tuple[list[int], list[int]]] = []

    class Recording:
        """The hf generator, recording every (prompt ids, generated ids) it handled."""

        tokenizer = tok

        def generate_ids(self, prompt_ids, sp):
            out = inner.generate_ids(prompt_ids, sp)
            seen.extend((list(p), list(c.token_ids)) for p, group in zip(prompt_ids, out, strict=True) for c in group)
            return out

        def generate(self, prompts, sp):
            raise AssertionError("text reached the sampler")

        def sync_weights(self, m):
            inner.sync_weights(m)

    scored: list[list[int]] = []
    real = step_mod.token_logprobs

    def spy(m, ids, att, P, *a, **kw):
        if torch.is_grad_enabled():  # the update's pass: the rows the loss scores
            scored.extend(ids[r][att[r].bool()].tolist() for r in range(ids.shape[0]))
        return real(m, ids, att, P, *a, **kw)

    monkeypatch.setattr(step_mod, "token_logprobs", spy)
    p = params(mode, kl=dict(beta=0.0))
    run, models, state = setup(p, model, tok, rows=rows, generator=Recording())
    try:
        begin_iteration(run, models, state, 1, None)
        _, ro, _ = run_step(run, models, state, 0)
    finally:
        close(run, models, state)
    assert len(scored) == len(ro.texts) == 2 * 3
    injected_total = 0
    for row, n in zip(scored, range(len(ro.texts)), strict=True):
        # the longest (prompt ids, generated ids) the sampler handled that starts this row: its last round
        cands = [(pr, c) for pr, c in seen if row[: len(pr) + len(c)] == pr + c]
        assert cands, "a scored row that no sampler call produced"
        pr, c = max(cands, key=lambda x: len(x[0]) + len(x[1]))
        tail = row[len(pr) + len(c) :]  # after the last round: only injected tool output, out of the loss
        T = int(ro.completion_mask[n].sum())
        assert ro.loss_mask[n, T - len(tail) : T].tolist() == [0.0] * len(tail)
        first = tok(rollout_prompt(ro.rows[n]["question"], mode, p.template, tok))["input_ids"]
        assert row[: len(first)] == first and any(pr0 == first for pr0, _ in seen)  # round 1 got these prompt ids
        injected_total += int((ro.loss_mask[n, :T] == 0).sum())
    if mode == "tir":
        assert injected_total > 0 and math.isfinite(ro.sampler_logprobs.sum().item())

"""Tests of the generation interface and its hf backend (stages/core/generation.py).

A tiny random Llama and a tokenizer trained here on synthetic problems: no downloads. References are
transformers itself: ``model.generate`` for greedy tokens and a teacher-forced forward pass for log-probs.
"""

from __future__ import annotations

import random
from functools import lru_cache

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from stages.base_model import train_tokenizer
from stages.core.errors import PipelineError
from stages.core.generation import (
    Completion,
    Generator,
    HFGenerator,
    SamplingParams,
    _Row,
    make_generator,
    resolve_backend,
    vllm_importable,
)
from stages.core.prompts import chat_prompt
from stages.data.problems import sample_problem

torch.set_num_threads(1)


@lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on 200 synthetic problems (BOS added, EOS '</s>')."""
    rng = random.Random(0)
    rows = [sample_problem(rng, n_steps=1 + i % 3, max_value=20) for i in range(200)]
    return train_tokenizer(("\n".join([r["question"], r["cot"], r["pot"], r["tir"]]) for r in rows), 512)


def tiny_model(tok: PreTrainedTokenizerFast, seed: int = 0, max_len: int = 256) -> LlamaForCausalLM:
    """A random 2-layer Llama (hidden 64, 2 heads of 32) for ``tok``; head size fits vLLM's CPU kernels.

    Untied embeddings and a wide initialisation: a tied, 0.02-initialised random model only repeats the
    last prompt token, which would make every greedy comparison trivially pass."""
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=max_len,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False, initializer_range=0.2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def tiny_prompts(k: int = 6) -> list[str]:
    """Chat prompts of different lengths (so that a batch of them is padded)."""
    rng = random.Random(1)
    return [chat_prompt(sample_problem(rng, n_steps=1 + i % 3, max_value=20)["question"]) for i in range(k)]


@pytest.fixture(scope="module")
def lm() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tiny_tokenizer()
    return tiny_model(tok), tok


def teacher_forced_logprobs(model, tok, prompt: str, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) of ``ids`` after ``prompt``, from one full forward pass."""
    p = tok(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p + ids])).logits[0, len(p) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def test_greedy_matches_transformers_generate_and_teacher_forcing(lm):
    model, tok = lm
    prompts = tiny_prompts(4)
    outs = HFGenerator(model, tok).generate(prompts, SamplingParams(max_new_tokens=24))
    for prompt, (c,) in zip(prompts, outs, strict=True):
        enc = tok(prompt, return_tensors="pt")
        ref = model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
        assert c.token_ids == ref[0, enc["input_ids"].shape[1]:].tolist()
        assert c.finish_reason == ("stop" if c.token_ids[-1] == tok.eos_token_id else "length")
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        tf = teacher_forced_logprobs(model, tok, prompt, c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), tf, atol=1e-5, rtol=0)


def test_logprobs_same_alone_and_in_padded_batch(lm):
    model, tok = lm
    prompts = tiny_prompts(6)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    assert len(set(lengths)) > 1, "the batch must need padding"
    batched, alone = HFGenerator(model, tok, batch_size=8), HFGenerator(model, tok, batch_size=1)
    for sp in (SamplingParams(max_new_tokens=16), SamplingParams(temperature=0.8, max_new_tokens=16, seed=3)):
        for k, (a, b) in enumerate(zip(alone.generate(prompts, sp), batched.generate(prompts, sp), strict=True)):
            assert a[0].token_ids == b[0].token_ids
            diff = (torch.tensor(a[0].logprobs) - torch.tensor(b[0].logprobs)).abs().max().item()
            assert diff <= 1e-5, f"prompt {k}: alone vs padded batch log-probs differ by {diff}"


def test_sampled_logprobs_are_untruncated_temperature_softmax(lm):
    model, tok = lm
    prompt = tiny_prompts(1)[0]
    for sp in (SamplingParams(temperature=0.7, max_new_tokens=12, seed=1),
               SamplingParams(temperature=0.7, top_k=1, max_new_tokens=12),
               SamplingParams(temperature=1.3, top_p=1e-6, max_new_tokens=12)):
        (c,) = HFGenerator(model, tok).generate([prompt], sp)[0]
        tf = teacher_forced_logprobs(model, tok, prompt, c.token_ids, sp.temperature)
        assert torch.allclose(torch.tensor(c.logprobs), tf, atol=1e-5, rtol=0)
        if sp.top_k == 1 or sp.top_p < 1:  # only the top token can be drawn, yet its log-prob is not 0
            greedy = HFGenerator(model, tok).generate([prompt], SamplingParams(max_new_tokens=12))[0][0]
            assert c.token_ids == greedy.token_ids
            assert max(c.logprobs) < -1e-3


def test_sampling_is_seeded_and_independent_of_batching(lm):
    model, tok = lm
    prompts = tiny_prompts(5)
    sp = SamplingParams(temperature=1.0, n=3, max_new_tokens=10, seed=7)
    a = HFGenerator(model, tok, batch_size=16).generate(prompts, sp)
    b = HFGenerator(model, tok, batch_size=2).generate(prompts, sp)
    assert [[c.token_ids for c in r] for r in a] == [[c.token_ids for c in r] for r in b]
    assert all(len(r) == 3 for r in a)
    assert len({tuple(c.token_ids) for c in a[0]}) > 1, "n samples of a prompt should differ"
    other = HFGenerator(model, tok).generate(prompts, SamplingParams(temperature=1.0, n=3, max_new_tokens=10, seed=8))
    assert [[c.token_ids for c in r] for r in other] != [[c.token_ids for c in r] for r in a]


def test_samples_of_a_prompt_share_its_prefill_exactly(lm):
    """n samples per prompt prefill each prompt once and copy its KV rows: every sample's log-probs still equal a
    teacher-forced pass of its own, in a left-padded batch of prompts of different lengths."""
    model, tok = lm
    prompts = tiny_prompts(4)
    outs = HFGenerator(model, tok).generate(prompts, SamplingParams(temperature=1.0, n=3, max_new_tokens=10, seed=3))
    for prompt, group in zip(prompts, outs, strict=True):
        assert len({tuple(c.token_ids) for c in group}) > 1
        for c in group:
            tf = teacher_forced_logprobs(model, tok, prompt, c.token_ids)
            assert torch.allclose(torch.tensor(c.logprobs), tf, atol=1e-5, rtol=0)


def test_sampling_frequencies_follow_the_distribution(lm):
    model, tok = lm
    prompt = tiny_prompts(1)[0]
    with torch.no_grad():
        logits = model(torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1].float()
    gen = HFGenerator(model, tok, batch_size=1000)
    n = 2000
    for sp, probs in ((SamplingParams(temperature=0.5, n=n, max_new_tokens=1, seed=2), (logits / 0.5).softmax(-1)),
                      (SamplingParams(temperature=1.0, top_k=3, n=n, max_new_tokens=1, seed=2), None)):
        if probs is None:  # top-k: renormalised over the 3 most likely tokens
            top = logits.topk(3).indices
            probs = torch.zeros_like(logits)
            probs[top] = logits[top].softmax(-1)
        firsts = torch.tensor([c.token_ids[0] for c in gen.generate([prompt], sp)[0]])
        freq = torch.bincount(firsts, minlength=len(probs)).float() / n
        top = probs.topk(10).indices  # the 10 likeliest tokens, each within 4.5 standard errors
        err = (freq[top] - probs[top]).abs()
        bound = 4.5 * (probs[top] * (1 - probs[top]) / n).sqrt() + 1e-3
        assert bool((err <= bound).all()), f"sampled {freq[top].tolist()} vs true {probs[top].tolist()}"
        assert freq[probs == 0].sum() == 0


def test_greedy_n_copies(lm):
    model, tok = lm
    outs = HFGenerator(model, tok).generate(tiny_prompts(2), SamplingParams(n=3, max_new_tokens=5))
    assert all(len(r) == 3 and r[0] == r[1] == r[2] and r[0] is not r[1] for r in outs)


def test_stop_string_included_and_generation_stops_at_completing_token(lm):
    model, tok = lm
    prompts = tiny_prompts(6)
    gen = HFGenerator(model, tok, batch_size=8)
    free = gen.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=40, seed=0))
    # a stop string taken from the middle of prompt 0's free-running text, spanning at least 2 characters
    text0 = free[0][0].text
    assert len(text0) >= 12
    stop = text0[5:8]
    sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=0, stop=(stop, "\u00a7never\u00a7"))
    stopped = gen.generate(prompts, sp)
    hits = 0
    for (f,), (s,) in zip(free, stopped, strict=True):
        assert s.token_ids == f.token_ids[: len(s.token_ids)], "a stop only cuts the same sampled sequence"
        full = tok.decode(s.token_ids, skip_special_tokens=True)
        before = tok.decode(s.token_ids[:-1], skip_special_tokens=True)
        if stop in f.text:
            hits += 1
            assert s.finish_reason == "stop" and s.text.endswith(stop) and stop in full and stop not in before
            assert s.text == full[: full.index(stop) + len(stop)]
        else:
            assert s.token_ids == f.token_ids and s.text == f.text
    assert hits >= 1
    # rows of a batch that stop at different steps (finished rows dropped): same as one at a time
    for k in range(len(prompts)):
        alone = gen.generate(prompts[: k + 1], sp)[k][0]
        assert alone.token_ids == stopped[k][0].token_ids


def test_eos_ends_a_sequence_and_is_kept_in_token_ids(lm):
    _, tok = lm
    model = tiny_model(tok)
    prompt = tiny_prompts(1)[0]
    first = HFGenerator(model, tok).generate([prompt], SamplingParams(max_new_tokens=3))[0][0].token_ids[0]
    emb = model.get_output_embeddings().weight
    with torch.no_grad():  # make EOS score twice the first token's logit: EOS becomes the greedy choice
        hidden = model.model(torch.tensor([tok(prompt)["input_ids"]])).last_hidden_state[0, -1]
        assert float(hidden @ emb[first]) > 0
        emb[tok.eos_token_id] = 2 * emb[first]
    (c,) = HFGenerator(model, tok).generate([prompt], SamplingParams(max_new_tokens=10))[0]
    assert c.token_ids == [tok.eos_token_id] and c.text == "" and c.finish_reason == "stop"


def test_length_limits(lm):
    _, tok = lm
    model = tiny_model(tok, max_len=48)
    short, long_ = "User: hi\n\nAssistant:", " ".join(["apples"] * 80)
    n_short = len(tok(short)["input_ids"])
    outs = HFGenerator(model, tok).generate([short, long_], SamplingParams(max_new_tokens=100, n=2))
    assert outs[1] == [Completion("", [], [], "length")] * 2
    c = outs[0][0]
    assert c.finish_reason == "length" or c.token_ids[-1] == tok.eos_token_id
    assert len(c.token_ids) <= 48 - n_short


def test_sync_weights_and_dtype_copy(lm):
    _, tok = lm
    policy, other = tiny_model(tok, seed=0), tiny_model(tok, seed=1)
    prompts = tiny_prompts(3)
    sp = SamplingParams(max_new_tokens=12)
    same = HFGenerator(policy, tok)
    copy_bf16 = HFGenerator(policy, tok, dtype="bfloat16")
    assert copy_bf16.model is not policy and copy_bf16.model.dtype == torch.bfloat16
    before = [r[0].token_ids for r in same.generate(prompts, sp)]
    policy.train()
    with torch.no_grad():
        policy.load_state_dict(other.state_dict())
    expected = [r[0].token_ids for r in HFGenerator(other, tok).generate(prompts, sp)]
    assert expected != before
    assert [r[0].token_ids for r in same.generate(prompts, sp)] == expected  # same object: already current
    assert policy.training, "generation restores the training flag"
    copy_bf16.sync_weights(policy)
    for name, p in copy_bf16.model.state_dict().items():
        assert torch.equal(p, policy.state_dict()[name].to(torch.bfloat16))
    bf = copy_bf16.generate(prompts, sp)
    assert all(len(r[0].token_ids) > 0 for r in bf)


def test_make_generator_from_path_and_auto(lm, tmp_path, monkeypatch):
    model, tok = lm
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gen = make_generator("auto", tmp_path, None, batch_size=4)
    assert isinstance(gen, HFGenerator) and isinstance(gen, Generator)
    ref = HFGenerator(model, tok).generate(tiny_prompts(2), SamplingParams(max_new_tokens=8))
    assert gen.generate(tiny_prompts(2), SamplingParams(max_new_tokens=8)) == ref
    if not torch.cuda.is_available():
        assert resolve_backend("auto") == "hf"
    monkeypatch.setenv("GENERATION_BACKEND", "vllm")  # once an override of auto (issue 30): no longer read
    assert resolve_backend("auto") == ("vllm" if torch.cuda.is_available() and vllm_importable() else "hf")
    assert resolve_backend("hf") == "hf" and resolve_backend("vllm") == "vllm"
    with pytest.raises(PipelineError):
        make_generator("tpu", tmp_path, None)  # type: ignore[arg-type]
    with pytest.raises(PipelineError):
        make_generator("hf", model, None)


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"n": 0},
                                {"max_new_tokens": 0}, {"stop": ("",)}])
def test_sampling_params_validation(kw):
    with pytest.raises(PipelineError):
        SamplingParams(**kw)


def test_sampling_params_stop_normalised():
    assert SamplingParams(stop="```output").stop == ("```output",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


def test_auto_batch_size_follows_kv_budget(lm):
    model, tok = lm
    prompts = tiny_prompts(3)
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, seed=4)
    small = HFGenerator(model, tok, kv_cache_gib=1e-6)  # smaller than one row's cache: one row at a time
    rows = [_Row(0, 0, [1] * 10, 6)]
    assert small._rows_per_batch(rows) == 1 and HFGenerator(model, tok)._rows_per_batch(rows) == 128
    a, b = small.generate(prompts, sp), HFGenerator(model, tok).generate(prompts, sp)
    assert [r[0].token_ids for r in a] == [r[0].token_ids for r in b]
    assert all(torch.allclose(torch.tensor(x[0].logprobs), torch.tensor(y[0].logprobs), atol=1e-5)
               for x, y in zip(a, b, strict=True))

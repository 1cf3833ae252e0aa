"""Training data: the mixture stream (ratios, resumption, bad sources) and SFT examples (response-only
loss, EOS, the eval prompt as a prefix, packing without attention across examples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stages.core.errors import PipelineError
from stages.core.modeling import load_model, load_tokenizer
from stages.core.prompts import chat_prompt, response_text
from stages.data.problems import generate_splits
from stages.train.data import PackedExamples, PackedMixture, collate_rows, make_example, pack_examples
from stages.train.losses import IGNORE


def _mixture(world: dict[str, Path], tok, seed: int = 0, ratios=(0.75, 0.25)) -> PackedMixture:
    return PackedMixture([(world["math"], ratios[0]), (world["general"], ratios[1])], tok, 32, seed, skip_first_rows=10)


def test_mixture_follows_ratios_and_resumes(tiny_world) -> None:
    tok = load_tokenizer(tiny_world["model"])
    m = _mixture(tiny_world, tok)
    m.next_batch(50)
    state = m.state_dict()
    after = m.next_batch(8)["input_ids"]
    share = m.tokens_by_source[0] / sum(m.tokens_by_source)
    assert 0.6 < share < 0.9  # 58 draws at 0.75
    m2 = _mixture(tiny_world, tok)
    m2.load_state_dict(state)
    assert torch.equal(m2.next_batch(8)["input_ids"], after)


def test_mixture_skips_heldout_rows_and_wraps(tiny_world) -> None:
    tok = load_tokenizer(tiny_world["model"])
    m = _mixture(tiny_world, tok, ratios=(1.0, 0.0))
    heldout = json.loads(tiny_world["math"].read_text().splitlines()[0])["text"]
    first = tok.decode(m.next_sequence(), skip_special_tokens=True)
    assert not heldout.startswith(first[:40])
    m.next_batch(400)  # more tokens than the source holds: next epoch
    assert m.readers[0].epoch >= 1


def test_empty_source_is_a_one_line_error(tiny_world, tmp_path) -> None:
    tok = load_tokenizer(tiny_world["model"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(PipelineError, match="no rows with text") as e:
        PackedMixture([(tiny_world["math"], 0.5), (empty, 0.5)], tok, 32, 0)
    assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match="not found"):
        PackedMixture([(tmp_path / "missing.jsonl", 1.0)], tok, 32, 0)


def test_sft_example_loss_on_response_only_and_eos(tiny_world) -> None:
    tok = load_tokenizer(tiny_world["model"])
    q, sol = "Tom has 3 apples. He buys 4 more. How many apples does Tom have now?", "3 + 4 = 7.\nThe answer is \\boxed{7}."
    ex = make_example(tok, chat_prompt(q, "cot"), response_text(sol))
    n_prompt = len(tok(chat_prompt(q, "cot"))["input_ids"])
    assert all(x == IGNORE for x in ex.labels[:n_prompt])
    assert list(ex.labels[n_prompt:]) == list(ex.input_ids[n_prompt:])
    assert ex.input_ids[-1] == tok.eos_token_id and ex.labels[-1] == tok.eos_token_id
    assert tok.decode(ex.input_ids[n_prompt:], skip_special_tokens=True) == response_text(sol)


@pytest.mark.parametrize("mode", ["cot", "pot", "tir"])
def test_eval_prompt_tokens_are_a_prefix_of_training_tokens(tiny_world, mode) -> None:
    """What evaluation feeds the model (the chat prompt, tokenised alone, as a left-padded batch by the
    generation backend) is exactly the start of what SFT trained on."""
    tok = load_tokenizer(tiny_world["model"])
    rows = [json.loads(x) for x in tiny_world["problems"].read_text().splitlines()[:5]]
    prompts = [chat_prompt(r["question"], mode) for r in rows]
    enc = tok(prompts, padding=True)
    for r, prompt, ids, mask in zip(rows, prompts, enc["input_ids"], enc["attention_mask"], strict=True):
        eval_ids = [i for i, m in zip(ids, mask, strict=True) if m]
        train_ids = make_example(tok, prompt, response_text(r[mode])).input_ids
        assert list(train_ids[: len(eval_ids)]) == eval_ids
        assert len(train_ids) > len(eval_ids)


def test_packed_logits_equal_logits_alone(tiny_world) -> None:
    """Packing is invisible to the model: each example's logits inside a packed row equal its logits when
    run alone (to 1e-5), so no attention crosses examples and positions restart."""
    torch.manual_seed(0)
    tok = load_tokenizer(tiny_world["model"])
    model = load_model(tiny_world["model"]).eval()
    rows = generate_splits(3, n_sft=4, n_rl=1, n_test=1, min_steps=1, max_steps=2, max_value=12)["sft"]
    exs = [make_example(tok, chat_prompt(r["question"], m), response_text(r[m])) for r, m in zip(rows, ["cot", "pot", "tir", "cot"], strict=True)]
    batch = collate_rows([exs], tok.pad_token_id)
    assert batch["input_ids"].shape[1] == sum(len(e.input_ids) for e in exs)
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        t = 0
        for e in exs:
            alone = model(input_ids=torch.tensor([e.input_ids]), use_cache=False).logits[0]
            n = len(e.input_ids)
            assert torch.allclose(packed[t:t + n], alone, atol=1e-5, rtol=0), (packed[t:t + n] - alone).abs().max()
            t += n
        # control: without the restarted positions the logits do change (attention crosses examples)
        plain = model(input_ids=batch["input_ids"], use_cache=False).logits[0]
        n0 = len(exs[0].input_ids)
        assert not torch.allclose(plain[n0:n0 + 5], packed[n0:n0 + 5], atol=1e-3)


def test_packing_fills_rows_and_resumes(tiny_world) -> None:
    tok = load_tokenizer(tiny_world["model"])
    rows = [json.loads(x) for x in tiny_world["problems"].read_text().splitlines()[:40]]
    exs = [make_example(tok, chat_prompt(r["question"]), response_text(r["cot"])) for r in rows]
    packed = pack_examples(exs, 512)
    assert sorted(i for row in packed for i in row) == list(range(40))
    assert all(sum(len(exs[i].input_ids) for i in row) <= 512 for row in packed)
    assert len(packed) < 40 and len(pack_examples(exs, 512, pack=False)) == 40
    s = PackedExamples(exs, 512, seed=1, pad_id=tok.pad_token_id)
    s.next_batch(len(packed) - 1)
    st = s.state_dict()
    nxt = s.next_batch(3)  # crosses into the next epoch
    s2 = PackedExamples(exs, 512, seed=1, pad_id=tok.pad_token_id)
    s2.load_state_dict(st)
    assert all(torch.equal(a, b) for a, b in zip(nxt.values(), s2.next_batch(3).values(), strict=True))
    assert s.epoch == 1

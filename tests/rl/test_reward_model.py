"""Reward model pieces: step labels, AUC, replay, save/load, learning an easy labelling, and the wiring of
RM scores into outcome / process advantages (step ends at newline tokens) against a hand-made reference."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from stages.core.generation import Completion
from stages.core.modeling import load_tokenizer
from stages.core.prompts import chat_prompt
from stages.rl import reward_model as R
from stages.rl.reward_model import save_reward_model
from stages.rl.rollout import build_rollout

torch.set_num_threads(1)


def test_value_step_labels_hand_examples():
    right = ["Tom buys 2 more: 3 + 2 = 5.\n", "He doubles them: 5 * 2 = 10.\n", "The answer is \\boxed{10}."]
    assert R.value_step_labels(right, [5, 10], outcome=1) == [1, 1, 1]
    # second step wrong -> it and every later step are wrong; the last step carries the outcome label
    wrong = ["3 + 2 = 5.\n", "Then 5 * 2 = 11.\n", "He gets 1: 11 + 1 = 12.\n", "The answer is \\boxed{12}."]
    assert R.value_step_labels(wrong, [5, 10, 11], outcome=0) == [1, 0, 0, 0]
    # a line without an equation keeps the state; a step beyond the known values is wrong
    extra = ["Let me think.\n", "3 + 2 = 5.\n", "5 + 1 = 6.\n", "The answer is \\boxed{6}."]
    assert R.value_step_labels(extra, [5], outcome=0) == [1, 1, 0, 0]
    # a truncated output: last step is the outcome (0)
    assert R.value_step_labels(["3 + 2 = 5.\n", "5 * 2 ="], [5, 10], outcome=0) == [1, 0]


def test_completion_steps_split_at_newline_tokens(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    text = "Tom buys 2 more: 3 + 2 = 5.\nTom buys 1 more: 5 + 1 = 6.\nThe answer is \\boxed{6}."
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends, texts = R.completion_steps(ids, tok)
    assert len(ends) == 3 and ends[-1] == len(ids) - 1
    assert "".join(texts) == text
    assert texts[0].endswith("5.\n") and texts[1].endswith("6.\n") and texts[2] == "The answer is \\boxed{6}."
    for e in ends[:-1]:
        assert "\n" in tok.decode([ids[e]])


def test_auc_matches_pairwise_definition():
    rng = random.Random(0)
    s = [rng.choice([0.1, 0.2, 0.3, 0.5, 0.9]) for _ in range(40)]
    y = [rng.random() < 0.4 for _ in range(40)]
    pos = [a for a, b in zip(s, y, strict=True) if b]
    neg = [a for a, b in zip(s, y, strict=True) if not b]
    ref = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert R.auc(s, y) == pytest.approx(ref)
    assert R.auc([1, 2, 3], [0, 1, 1]) == 1.0 and R.auc([3, 2, 1], [0, 1, 1]) == 0.0
    assert math.isnan(R.auc([1, 2], [1, 1]))


def test_replay_mix_takes_the_fraction_of_history():
    hist = [{"k": i} for i in range(50)]
    new = [{"k": 100 + i} for i in range(7)]
    mixed, k = R.replay_mix(new, hist, 0.1, seed=3)
    assert k == 5 and len(mixed) == 12 and mixed[:7] == new
    replayed = [m["k"] for m in mixed[7:]]
    assert len(set(replayed)) == 5 and all(0 <= x < 50 for x in replayed)
    assert R.replay_mix(new, [], 0.1, seed=0) == (new, 0)


def _examples(tok, n: int, seed: int = 0) -> list[dict]:
    """Easy synthetic labelling: the final answer is right (label 1) iff the last line says \\boxed{5}."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a = rng.randint(2, 9)
        good = i % 2 == 0
        ans = 5 if good else 3
        text = f"Tom buys 2 more: {a} + 2 = {a + 2}.\nThe answer is \\boxed{{{ans}}}."
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ends, _ = R.completion_steps(ids, tok)
        out.append({"id": f"q{i}", "question": f"Tom has {a} apples. He buys 2 more. How many apples does Tom have now?",
                    "answer": "5", "completion_ids": ids, "step_ends": ends, "step_labels": [1] * (len(ends) - 1) + [int(good)],
                    "outcome": int(good), "origin": "synthetic"})
    return out


def test_rm_training_beats_chance_on_easy_labels(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = R.init_reward_model(tiny_model_dir)
    train, held = _examples(tok, 48, seed=0), _examples(tok, 16, seed=1)
    losses = R.train_reward_model(rm, tok, train, epochs=15, lr=3e-3, batch_size=16, seed=0, train_on="outcome")
    m = R.evaluate_reward_model(rm, tok, held)
    assert losses[-1] < losses[0]
    assert m["outcome_auc"] >= 0.9, m  # chance is 0.5


def test_rm_save_and_load_give_the_same_scores(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = R.init_reward_model(tiny_model_dir)
    ex = _examples(tok, 4)
    save_reward_model(rm, tok, tmp_path / "rm", ex, None, {"stage": "test"})
    again = R.load_reward_model(tmp_path / "rm")
    assert R.example_scores(rm, tok, ex) == R.example_scores(again, tok, ex)
    assert R.load_examples(tmp_path / "rm") == ex


class _StubRM(torch.nn.Module):
    """Score of a position = (token id mod 7) - 3: known, so the test can compute rewards by hand."""

    def forward(self, input_ids, attention_mask=None, use_cache=None):  # noqa: ARG002
        return SimpleNamespace(logits=((input_ids % 7) - 3).float().unsqueeze(-1))


def _estimate(source, ro, eps):
    """The step's path: the source's rewards, then the registered group-relative estimator."""
    from stages.rl.advantages import AdvantageConfig, AdvantageInput, estimate_advantages

    return estimate_advantages("grpo", AdvantageInput(source.rewards(ro), ro.completion_mask),
                               AdvantageConfig(scale_rewards="group", eps=eps))


def test_process_and_outcome_wiring_against_a_loop_reference(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    texts = [["3 + 2 = 5.\nThe answer is \\boxed{5}.", "3 + 2 = 6.\n6 + 1 = 7.\nThe answer is \\boxed{7}.", "5"],
             ["Tom buys 1 more: 7 - 4 = 3.\nThe answer is \\boxed{3}.", "The answer is \\boxed{3}.", "7 - 4 = 3.\n3"]]
    rows = [{"question": "Tom has 3 apples. He buys 2 more. How many apples does Tom have now?", "answer": "5"},
            {"question": "Anna has 7 coins. She loses 4 coins. How many coins?", "answer": "3"}]
    comps = []
    for group in texts:
        cg = []
        for j, t in enumerate(group):
            ids = tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if j < 2 else [])
            cg.append(Completion(text=t, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop" if j < 2 else "length"))
        comps.append(cg)
    ro = build_rollout(rows, [chat_prompt(r["question"]) for r in rows], comps, tok, mask_truncated=False)
    scorer = R.RewardModelSource(_StubRM(), tok, "process")
    T = ro.completion_mask.shape[1]
    eps = 1e-4

    # loop reference: step ends = tokens whose text holds "\n", plus the last token
    ref = torch.zeros(2, 3, T, dtype=torch.float64)
    out_r = torch.zeros(2, 3, dtype=torch.float64)
    for q, group in enumerate(comps):
        steps = []  # (output, end index, reward)
        for g, c in enumerate(group):
            ends = [t for t, i in enumerate(c.token_ids) if "\n" in tok.decode([i])]
            if ends[-1:] != [len(c.token_ids) - 1]:
                ends.append(len(c.token_ids) - 1)
            for e in ends:
                steps.append((g, e, 1 / (1 + math.exp(-((c.token_ids[e] % 7) - 3)))))
            out_r[q, g] = steps[-1][2]
        rs = [s[2] for s in steps]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((x - mean) ** 2 for x in rs) / (len(rs) - 1))
        for g in range(3):
            for t in range(T):
                ref[q, g, t] = sum((r - mean) / (std + eps) for gg, e, r in steps if gg == g and e >= t)
    got = _estimate(scorer, ro, eps)
    assert got.advantages.shape == (2, 3, T)
    assert torch.allclose(got.advantages.double(), ref, atol=1e-5)
    assert bool(got.valid.all()) and got.n_zero_std_groups == 0

    # outcome RM: reward = sigmoid(score of the last completion token), group-normalised
    out = _estimate(R.RewardModelSource(_StubRM(), tok, "outcome"), ro, eps)
    assert torch.allclose(out.rewards, out_r, atol=1e-9)
    exp = (out_r - out_r.mean(1, keepdim=True)) / (out_r.std(1, keepdim=True) + eps)
    assert torch.allclose(out.advantages.double(), exp, atol=1e-5)


def test_step_label_scorer_rewards_are_the_value_labels(tiny_model_dir):
    """reward_source process_rule: the step rewards are value_step_labels' 0/1 labels, and the advantages are the
    process-supervision formula (loop reference) over them."""
    tok = load_tokenizer(tiny_model_dir)
    texts = [["3 + 2 = 5.\nThe answer is \\boxed{5}.", "3 + 2 = 6.\n6 + 1 = 7.\nThe answer is \\boxed{7}.",
              "3 + 2 = 5.\nThe answer is \\boxed{6}."],
             ["7 - 4 = 3.\nThe answer is \\boxed{3}.", "The answer is \\boxed{3}.", "7 - 4 = 2.\nThe answer is \\boxed{2}."]]
    labels = [[[1, 1], [0, 0, 0], [1, 0]], [[1, 1], [1], [0, 0]]]
    rows = [{"question": "Tom has 3 apples. He buys 2 more. How many apples does Tom have now?", "answer": "5",
             "values": [5]},
            {"question": "Anna has 7 coins. She loses 4 coins. How many coins?", "answer": "3", "values": [3]}]
    comps = []
    for group in texts:
        cg = []
        for t in group:
            ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            cg.append(Completion(text=t, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        comps.append(cg)
    ro = build_rollout(rows, [chat_prompt(r["question"]) for r in rows], comps, tok, mask_truncated=False)
    scorer = R.StepLabelSource(tok)
    r, e = scorer.step_rewards(ro)
    for q in range(2):
        for g in range(3):
            n = len(labels[q][g])
            assert r[q, g, :n].tolist() == labels[q][g]
            assert bool(torch.isnan(r[q, g, n:]).all())
            ends = [t for t, i in enumerate(comps[q][g].token_ids) if "\n" in tok.decode([i])]
            ends = ends + ([len(comps[q][g].token_ids) - 1] if ends[-1:] != [len(comps[q][g].token_ids) - 1] else [])
            assert e[q, g, :n].tolist() == ends
    T = ro.completion_mask.shape[1]
    eps = 1e-4
    ref = torch.zeros(2, 3, T, dtype=torch.float64)
    for q in range(2):
        flat = [x for g in range(3) for x in labels[q][g]]
        mean = sum(flat) / len(flat)
        std = math.sqrt(sum((x - mean) ** 2 for x in flat) / (len(flat) - 1))
        for g in range(3):
            for t in range(T):
                ref[q, g, t] = sum((x - mean) / (std + eps) for x, end in zip(labels[q][g], e[q, g].tolist(), strict=False)
                                   if end >= t)
    got = _estimate(scorer, ro, eps)
    assert torch.allclose(got.advantages.double(), ref, atol=1e-5)
    assert got.rewards[0].tolist() == pytest.approx([1.0, 0.0, 0.5])

    rows_nv = [{k: v for k, v in r_.items() if k != "values"} for r_ in rows]
    ro2 = build_rollout(rows_nv, [chat_prompt(r_["question"]) for r_ in rows_nv], comps, tok, mask_truncated=False)
    with pytest.raises(R.PipelineError, match="process_rule needs problem rows with a 'values' field"):
        scorer.step_rewards(ro2)

"""Reward model pieces: step labels, AUC, replay, save/load, learning an easy labelling, and the wiring of
RM scores into outcome / process advantages (step ends at newline tokens) against a hand-made reference."""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace

import pytest
import torch

from stages.core.errors import PipelineError
from stages.core.generation import Completion
from stages.core.modeling import load_tokenizer
from stages.core.prompts import chat_prompt
from stages.rl.rm import labels as rm_labels
from stages.rl.rm import metrics as rm_metrics
from stages.rl.rm import model as rm_model
from stages.rl.rm import source as rm_source
from stages.rl.rm import train as rm_train
from stages.rl.rm.model import save_reward_model
from stages.rl.rollout import build_rollout

torch.set_num_threads(1)


def test_value_step_labels_hand_examples():
    right = ["Tom buys 2 more: 3 + 2 = 5.\n", "He doubles them: 5 * 2 = 10.\n", "The answer is \\boxed{10}."]
    assert rm_labels.value_step_labels(right, [5, 10], outcome=1) == [1, 1, 1]
    # second step wrong -> it and every later step are wrong; the last step carries the outcome label
    wrong = ["3 + 2 = 5.\n", "Then 5 * 2 = 11.\n", "He gets 1: 11 + 1 = 12.\n", "The answer is \\boxed{12}."]
    assert rm_labels.value_step_labels(wrong, [5, 10, 11], outcome=0) == [1, 0, 0, 0]
    # a line without an equation keeps the state; a step beyond the known values is wrong
    extra = ["Let me think.\n", "3 + 2 = 5.\n", "5 + 1 = 6.\n", "The answer is \\boxed{6}."]
    assert rm_labels.value_step_labels(extra, [5], outcome=0) == [1, 1, 0, 0]
    # a truncated output: last step is the outcome (0)
    assert rm_labels.value_step_labels(["3 + 2 = 5.\n", "5 * 2 ="], [5, 10], outcome=0) == [1, 0]


def test_completion_steps_split_at_newline_tokens(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    text = "Tom buys 2 more: 3 + 2 = 5.\nTom buys 1 more: 5 + 1 = 6.\nThe answer is \\boxed{6}."
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends, texts = rm_labels.completion_steps(ids, tok)
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
    assert rm_metrics.auc(s, y) == pytest.approx(ref)
    assert rm_metrics.auc([1, 2, 3], [0, 1, 1]) == 1.0 and rm_metrics.auc([3, 2, 1], [0, 1, 1]) == 0.0
    assert math.isnan(rm_metrics.auc([1, 2], [1, 1]))


def test_replay_mix_takes_the_fraction_of_history():
    hist = [{"k": i} for i in range(50)]
    new = [{"k": 100 + i} for i in range(7)]
    mixed, k = rm_train.replay_mix(new, hist, 0.1, seed=3)
    assert k == 5 and len(mixed) == 12 and mixed[:7] == new
    replayed = [m["k"] for m in mixed[7:]]
    assert len(set(replayed)) == 5 and all(0 <= x < 50 for x in replayed)
    assert rm_train.replay_mix(new, [], 0.1, seed=0) == (new, 0)


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
        ends, _ = rm_labels.completion_steps(ids, tok)
        out.append({"id": f"q{i}", "question": f"Tom has {a} apples. He buys 2 more. How many apples does Tom have now?",
                    "answer": "5", "completion_ids": ids, "step_ends": ends, "step_labels": [1] * (len(ends) - 1) + [int(good)],
                    "outcome": int(good), "origin": "synthetic"})
    return out


def test_rm_training_beats_chance_on_easy_labels(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = rm_model.init_reward_model(tiny_model_dir)
    train, held = _examples(tok, 48, seed=0), _examples(tok, 16, seed=1)
    losses = rm_train.train_reward_model(rm, tok, train, epochs=15, lr=3e-3, batch_size=16, seed=0, train_on="outcome")
    m = rm_metrics.evaluate_reward_model(rm, tok, held)
    assert losses[-1] < losses[0]
    assert m["outcome_auc"] >= 0.9, m  # chance is 0.5


def test_rm_save_and_load_give_the_same_scores(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = rm_model.init_reward_model(tiny_model_dir)
    ex = _examples(tok, 4)
    save_reward_model(rm, tok, tmp_path / "rm", ex, None, {"stage": "test"})
    again = rm_model.load_reward_model(tmp_path / "rm")
    assert rm_model.example_scores(rm, tok, ex) == rm_model.example_scores(again, tok, ex)
    assert rm_model.load_examples(tmp_path / "rm") == ex


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
    scorer = rm_source.RewardModelSource(_StubRM(), tok, "process")
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
    out = _estimate(rm_source.RewardModelSource(_StubRM(), tok, "outcome"), ro, eps)
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
    scorer = rm_source.StepLabelSource(tok)
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
    with pytest.raises(PipelineError, match="process_rule needs problem rows with a 'values' field"):
        scorer.step_rewards(ro2)


# ---------------------------------------------------------------------------------------------
# issue 19: shared-prompt scoring, resumable training, best-of-n, exact-label AUC, Math-Shepherd at scale


def test_shared_prompt_scores_and_gradients_equal_one_pass_per_row(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = rm_model.init_reward_model(tiny_model_dir)
    ex = _examples(tok, 6)
    ex = [dict(e, question=ex[0]["question"]) for e in ex[:3]] + ex[3:]  # 3 samples of one question, then 3 more
    ids, att, P = rm_model._grouped_batch(ex, tok, {})
    plain = rm_model.completion_scores(rm, ids, att, P, share_prompts=False)
    shared = rm_model.completion_scores(rm, ids, att, P, share_prompts=True)
    assert torch.allclose(plain, shared, atol=1e-5)
    # the rollout layout gives the right-padded layout's scores (token_scores, the reward source's path)
    ids_r, att_r, plens = rm_model._batch(ex, tok, {})
    ref = rm_model.token_scores(rm, ids_r, att_r)
    for i, e in enumerate(ex):
        for t in e["step_ends"]:
            assert shared[i, t].item() == pytest.approx(ref[i, plens[i] + t].item(), abs=1e-5)
    grads = []
    for share in (False, True):
        rm.zero_grad()
        rm_model.completion_scores(rm, ids, att, P, share_prompts=share)[att[:, P:].bool()].sum().backward()
        grads.append({k: p.grad.clone() for k, p in rm.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5), k
    for a, b in zip(rm_model.example_scores(rm, tok, ex, share_prompts=True), rm_model.example_scores(rm, tok, ex), strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_interrupted_training_resumes_to_the_same_weights(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    ex = _examples(tok, 20)
    kw = dict(epochs=2, lr=3e-3, batch_size=6, seed=1, train_on="process")  # 4 batches an epoch: 8 steps

    def fresh():
        torch.manual_seed(0)
        return rm_model.init_reward_model(tiny_model_dir)

    full = fresh()
    want = rm_train.train_reward_model(full, tok, ex, **kw)
    saved: dict = {}

    def stop_at_5(step, upd, sums):
        if step == 5:
            saved.update(step=step, model={k: v.clone() for k, v in full2.state_dict().items()},
                         optimizer=copy.deepcopy(upd.optimizer.state_dict()), loss_sums=copy.deepcopy(sums))
            raise KeyboardInterrupt

    full2 = fresh()
    with pytest.raises(KeyboardInterrupt):
        rm_train.train_reward_model(full2, tok, ex, on_step=stop_at_5, **kw)
    again = fresh()
    again.load_state_dict(saved["model"])
    got = rm_train.train_reward_model(again, tok, ex, resume={k: saved[k] for k in ("step", "optimizer", "loss_sums")}, **kw)
    assert got == pytest.approx(want, rel=1e-6)
    for k, v in full.state_dict().items():
        assert torch.allclose(v, again.state_dict()[k], atol=1e-6), k


def test_epoch_order_keeps_a_question_together_and_depends_on_the_epoch():
    ex = [{"question": f"q{i // 3}"} for i in range(12)]
    o0, o1 = rm_train.epoch_order(ex, 0, 0), rm_train.epoch_order(ex, 0, 1)
    assert sorted(o0) == list(range(12)) and o0 != o1 and o0 == rm_train.epoch_order(ex, 0, 0)
    for b in range(0, 12, 3):
        assert len({ex[i]["question"] for i in o0[b:b + 3]}) == 1


def test_best_of_n_against_hand_computed_picks():
    def e(q, ok, pred):
        return {"id": q, "question": q, "outcome": ok, "pred": pred}

    examples = [e("a", 0, "1"), e("a", 1, "2"), e("a", 0, "1"), e("a", 1, "2"),  # majority tie -> "1" (first): wrong
                e("b", 0, "3"), e("b", 0, "3"), e("b", 1, "4"), e("b", 0, "5"),  # majority "3": wrong
                e("c", 1, "7"), e("c", 1, "7"), e("c", 0, "8"), e("c", 1, "7"),
                e("d", 1, "9")]  # fewer than n samples: not ranked
    scores = [[0.1, 0.9], [0.5, 0.2], [0.3], [0.0, 0.4],
              [0.1], [0.2], [0.0, 0.15], [-1.0],
              [0.2, 0.3], [0.5, 0.1], [0.9], [0.0, 0.0],
              [1.0]]
    got = rm_metrics.best_of_n(examples, scores, 4)
    # rm_last picks the highest last score: a -> sample 0 (0.9, wrong), b -> 1 (0.2, wrong), c -> 2 (0.9, wrong)
    assert got["questions"] == 3
    assert got["random"] == pytest.approx(round((2 / 4 + 1 / 4 + 3 / 4) / 3, 4))
    assert got["rm_last"] == pytest.approx(round((0 + 0 + 0) / 3, 4))
    # rm_min: a -> mins [0.1, 0.2, 0.3, 0.0] -> idx 2 (wrong); b -> [0.1, 0.2, 0.0, -1] -> idx 1 (wrong);
    # c -> [0.2, 0.1, 0.9, 0.0] -> idx 2 (wrong)
    assert got["rm_min"] == 0.0
    assert got["majority"] == pytest.approx(round(1 / 3, 4))
    assert got["oracle"] == 1.0
    assert got["gain"] == pytest.approx(round(-(2 / 4 + 1 / 4 + 3 / 4) / 3, 4), abs=1e-4)
    scores[1] = [0.5, 2.0]  # a: now the correct sample 1 has the best last score
    assert rm_metrics.best_of_n(examples, scores, 4)["rm_last"] == pytest.approx(round(1 / 3, 4))
    assert rm_metrics.best_of_n(examples, scores, 5) == {"n": 5, "questions": 0}


def test_step_auc_values_uses_the_exact_labels(tiny_model_dir):
    """evaluate_reward_model measures the step AUC against value_labels (the exact labels) besides the training
    labels, with the stub RM's known scores."""
    tok = load_tokenizer(tiny_model_dir)
    ex = _examples(tok, 8)
    rng = random.Random(3)
    for e in ex:
        e["value_labels"] = [rng.randint(0, 1) for _ in e["step_labels"]]
    m = rm_metrics.evaluate_reward_model(_StubRM(), tok, ex, share_prompts=False)
    sc = rm_model.example_scores(_StubRM(), tok, ex)
    assert m["step_auc"] == pytest.approx(round(rm_metrics.auc([v for s in sc for v in s],
                                                      [y for e in ex for y in e["step_labels"]]), 4))
    assert m["step_auc_values"] == pytest.approx(round(rm_metrics.auc([v for s in sc for v in s],
                                                             [y for e in ex for y in e["value_labels"]]), 4))
    assert rm_metrics.evaluate_reward_model(_StubRM(), tok, [{k: v for k, v in e.items() if k != "value_labels"} for e in ex],
                                   share_prompts=False)["step_auc_values"] is None


class _ScriptedGenerator:
    """A generator whose completion of a prompt is fixed by a rule: sampled outputs are given per question; a
    rollout from a prefix reaches the gold answer iff the prefix has no wrong step ("= 9." marks a wrong one)."""

    def __init__(self, outputs: dict[str, list[str]], tok) -> None:
        self.outputs, self.tok, self.calls = outputs, tok, []

    def generate(self, prompts, sp):
        self.calls.append(list(prompts))
        out = []
        for pr in prompts:
            q = next((q for q in self.outputs if pr.startswith(chat_prompt(q, "cot"))), None)
            prefix = pr[len(chat_prompt(q, "cot")):]
            if prefix:  # a Math-Shepherd rollout from a step prefix
                text = "The answer is \\boxed{3}." if "= 9." in prefix else "The answer is \\boxed{5}."
                out.append([Completion(text=text, token_ids=[1], logprobs=[0.0], finish_reason="stop")] * sp.n)
            else:
                out.append([Completion(text=t, token_ids=self.tok(t, add_special_tokens=False)["input_ids"]
                                       + [self.tok.eos_token_id], logprobs=[0.0], finish_reason="stop")
                            for t in self.outputs[q][: sp.n]])
        return out


def test_math_shepherd_labels_deduplicate_prefixes_and_skip_correct_outputs(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    q = "Tom has 3 apples. He buys 2 more. How many apples does Tom have now?"
    outs = {q: ["3 + 2 = 5.\nThe answer is \\boxed{5}.",          # right: all steps right, no rollout
                "3 + 2 = 5.\n5 + 0 = 5.\nThe answer is \\boxed{6}.",  # wrong answer after right steps
                "3 + 2 = 5.\n5 + 0 = 5.\nThe answer is \\boxed{7}.",  # the same two first steps (dedup)
                "3 + 2 = 9.\nThe answer is \\boxed{9}."]}             # wrong at step 1
    gen = _ScriptedGenerator(outs, tok)
    cfg = rm_labels.SampleConfig(samples_per_question=4, temperature=1.0, max_new_tokens=16, labels="rollouts",
                         rollouts_per_step=2, seed=0)
    stats: dict = {}
    ex = rm_labels.collect_examples(None, tok, [{"id": "p0", "question": q, "answer": "5", "values": [5]}], cfg, origin="sft",
                            generator=gen, stats=stats)
    assert [e["step_labels"] for e in ex] == [[1, 1], [1, 1, 0], [1, 1, 0], [0, 0]]
    assert [e["value_labels"] for e in ex] == [[1, 1], [1, 0, 0], [1, 0, 0], [0, 0]]  # 5 + 0 = 5 is past values
    assert [e["pred"] for e in ex] == ["5", "6", "7", "9"]
    # prefixes: 2 + 2 + 1 from the three wrong outputs, 3 of them distinct; the right output needs none
    assert stats == {"sampled": 4, "examples": 4, "prefixes": 5, "distinct_prefixes": 3, "completions": 6}
    assert len(gen.calls) == 2 and len(gen.calls[1]) == 3


class _ReferenceGenerator:
    """Scripted policy on real rows: ``outputs`` gives each question's sampled outputs; a rollout from a step prefix
    finishes the row's reference solution (reaching the gold answer) iff the prefix is a prefix of it, else answers
    wrong. Records every call (batching)."""

    def __init__(self, rows, outputs, tok):
        self.by_prompt = {chat_prompt(r["question"], "cot"): (r, outputs[i]) for i, r in enumerate(rows)}
        self.tok, self.calls = tok, []

    def _c(self, text):
        return Completion(text=text, token_ids=self.tok(text, add_special_tokens=False)["input_ids"]
                          + [self.tok.eos_token_id], logprobs=[0.0], finish_reason="stop")

    def generate(self, prompts, sp):
        self.calls.append(len(prompts))
        out = []
        for pr in prompts:
            head = next(h for h in self.by_prompt if pr.startswith(h))
            row, outputs = self.by_prompt[head]
            prefix = pr[len(head):]
            if not prefix:
                out.append([self._c(t) for t in outputs[: sp.n]])
                continue
            ref = outputs[0]
            rest = ref[len(prefix):] if ref.startswith(prefix) else "The answer is \\boxed{WRONG}."
            out.append([self._c(rest)] * sp.n)
        return out


def _reference_outputs(rows):
    """Per row: its reference solution as the right output, the same with a wrong final answer, and one whose first
    step is wrong (the rollouts from its prefixes cannot recover)."""
    import re

    outs = []
    for r in rows:
        sol = re.sub(r"<<[^>]*>>", "", r["solution"])
        if "####" in sol:  # GSM8K
            lines = [ln for ln in sol.split("####")[0].splitlines() if ln.strip()]
            right = "\n".join(lines) + f"\nThe answer is \\boxed{{{r['answer']}}}."
            wrong_end = "\n".join(lines) + "\nThe answer is \\boxed{WRONG}."
            wrong_first = "\n".join(["This step is wrong."] + lines[1:]) + "\nThe answer is \\boxed{WRONG}."
        else:  # MATH: its solution text ends in \boxed{answer}
            body = sol.replace("\n\n", "\n").strip()
            right = body + f"\nThe answer is \\boxed{{{r['answer']}}}."
            wrong_end = body + "\nThe answer is \\boxed{WRONG}."
            wrong_first = "This step is wrong.\n" + body.replace("\\boxed", "\\fbox") + "\nThe answer is \\boxed{WRONG}."
        outs.append([right, wrong_end, wrong_first])
    return outs


def test_math_shepherd_labeller_on_50_real_gsm8k_and_math_rows(shared_data, tiny_model_dir):
    """The rollouts labeller (labels: rollouts) on real GSM8K and MATH training rows, read by the prompt loader: one
    batched sampling call and one batched rollout call for the 50 problems (25 of each), and on every row the hard-estimation
    labels a scripted policy implies (the right output: every step right without rollouts; the right steps before a
    wrong final answer: right; a wrong first step: every step wrong)."""
    from stages.rl.data import load_prompts

    tok = load_tokenizer(tiny_model_dir)
    rows = load_prompts(shared_data / "gsm8k" / "train.jsonl")[:25] + load_prompts(shared_data / "math" / "train.jsonl")[:25]
    assert len({r["id"] for r in rows}) == 50
    outputs = _reference_outputs(rows)
    gen = _ReferenceGenerator(rows, outputs, tok)
    cfg = rm_labels.SampleConfig(samples_per_question=3, temperature=1.0, max_new_tokens=64, labels="rollouts",
                         rollouts_per_step=4, seed=0)
    stats: dict = {}
    ex = rm_labels.collect_examples(None, tok, rows, cfg, origin="sft", generator=gen, stats=stats)
    assert len(ex) == 150 and gen.calls[0] == 50 and len(gen.calls) == 2
    for i, r in enumerate(rows):
        right, wrong_end, wrong_first = ex[3 * i: 3 * i + 3]
        assert right["outcome"] == 1 and right["step_labels"] == [1] * len(right["step_ends"]), r["id"]
        assert wrong_end["outcome"] == 0 and wrong_end["step_labels"] == [1] * (len(wrong_end["step_ends"]) - 1) + [0]
        assert wrong_first["outcome"] == 0 and wrong_first["step_labels"] == [0] * len(wrong_first["step_ends"])
        assert "value_labels" not in right  # real rows have no running values
    assert stats["distinct_prefixes"] == gen.calls[1] <= stats["prefixes"]
    assert stats["completions"] == 4 * stats["distinct_prefixes"]


def test_math_shepherd_labeller_runs_batched_on_50_real_rows_with_a_model(shared_data, tiny_model_dir):
    """The same labeller with the tiny model through the hf generator (batched): labels for every sample of 50 real
    GSM8K rows, the last step's label equal to the outcome, counts consistent."""
    from stages.core.modeling import load_model
    from stages.rl.data import load_prompts

    tok, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    rows = load_prompts(shared_data / "gsm8k" / "test.jsonl")[:50]
    cfg = rm_labels.SampleConfig(samples_per_question=2, temperature=1.0, max_new_tokens=12, labels="rollouts",
                         rollouts_per_step=2, seed=0)
    stats: dict = {}
    ex = rm_labels.collect_examples(model, tok, rows, cfg, origin="sft", stats=stats)
    assert stats["sampled"] == 100 and len(ex) == stats["examples"] >= 1  # empty outputs (EOS first) are dropped
    for e in ex:
        assert len(e["step_labels"]) == len(e["step_ends"]) >= 1 and set(e["step_labels"]) <= {0, 1}
        assert e["step_labels"][-1] == e["outcome"]
    assert stats["distinct_prefixes"] <= stats["prefixes"] and stats["completions"] == 2 * stats["distinct_prefixes"]


def test_within_question_auc_counts_pairs_of_one_question_only():
    ex = [{"id": q, "question": q} for q in ("a", "a", "a", "b", "b")]
    scores = [0.9, 0.1, 0.5, 0.0, 0.0]
    labels = [1, 0, 0, 1, 0]
    # a: (0.9 > 0.1), (0.9 > 0.5) -> 2 won; b: a tie -> 0.5; 3 pairs
    assert rm_metrics.within_question_auc(ex, scores, labels) == pytest.approx(2.5 / 3)
    # the pooled AUC mixes questions: b's positive (0) is below a's negatives
    assert rm_metrics.auc(scores, labels) != pytest.approx(2.5 / 3)
    assert math.isnan(rm_metrics.within_question_auc(ex[:1], scores[:1], labels[:1]))


# ---------------------------------------------------------------------------------------------
# issue 48: the pairwise (Bradley-Terry) objective on same-question pairs


def test_pairwise_loss_against_a_loop_reference_and_trls_formula():
    torch.manual_seed(0)
    chosen, rejected = torch.randn(7) * 5, torch.randn(7) * 5
    chosen[0], rejected[0] = 60.0, -60.0  # far tails: logsigmoid stays finite and exact
    chosen[1], rejected[1] = -60.0, 60.0
    got = rm_train.pairwise_loss(chosen, rejected)
    assert got.shape == (7,)
    for k in range(7):  # -log sigmoid(d) = log(1 + exp(-d)), written stably per sign of d
        d = float(chosen[k]) - float(rejected[k])
        ref = math.log1p(math.exp(-d)) if d >= 0 else -d + math.log1p(math.exp(d))
        assert got[k].item() == pytest.approx(ref, rel=1e-6, abs=1e-6)
    # TRL's RewardTrainer: loss = -nn.functional.logsigmoid(rewards_chosen - rewards_rejected).mean()
    trl = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
    assert torch.equal(got.mean(), trl)


def test_same_question_pairs_are_every_right_wrong_pair_of_one_question():
    ex = [{"id": q, "question": q, "outcome": y} for q, y in (("a", 1), ("a", 0), ("b", 0), ("a", 0), ("a", 1),
                                                             ("b", 1), ("c", 1), ("c", 1))]
    want = [(i, j) for i in range(8) for j in range(8)
            if ex[i]["question"] == ex[j]["question"] and ex[i]["outcome"] == 1 and ex[j]["outcome"] == 0]
    assert sorted(rm_train.same_question_pairs(ex)) == sorted(want) and len(want) == 5  # a: 2 x 2, b: 1, c: none


def _grouped_examples(tok, n: int, per_q: int, seed: int = 0) -> list[dict]:
    """_examples with every ``per_q`` consecutive ones made samples of one question (right and wrong alternate)."""
    ex = _examples(tok, n, seed)
    return [dict(e, id=f"g{i // per_q}", question=ex[i - i % per_q]["question"]) for i, e in enumerate(ex)]


@pytest.mark.parametrize("objective", ["pairwise", "both"])
def test_pairwise_objective_loss_is_the_formula_on_the_models_scores(tiny_model_dir, objective):
    """One batch at lr 0: the loss train_reward_model reports is the mean Bradley-Terry loss over the batch's
    same-question pairs of the outcome scores (plus the pointwise BCE for ``both``), computed here from the RM's own
    scores by a loop."""
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = rm_model.init_reward_model(tiny_model_dir)
    ex = _grouped_examples(tok, 8, 4)
    sc = rm_model.example_scores(rm, tok, ex)
    pair = [math.log1p(math.exp(-(sc[i][-1] - sc[j][-1]))) for i in range(8) for j in range(8)
            if ex[i]["question"] == ex[j]["question"] and ex[i]["outcome"] and not ex[j]["outcome"]]
    assert len(pair) == 8  # 2 questions x 2 right x 2 wrong
    want = sum(pair) / len(pair)
    if objective == "both":
        bce = [-(y * math.log(1 / (1 + math.exp(-s))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-s))))
               for e, es in zip(ex, sc, strict=True) for s, y in zip(es, e["step_labels"], strict=True)]
        want = sum(bce) / len(bce) + 0.5 * want
    got = rm_train.train_reward_model(rm, tok, ex, epochs=1, lr=0.0, batch_size=8, seed=0, train_on="process",
                                      objective=objective, pair_weight=0.5)
    assert got == pytest.approx([want], rel=1e-4)


def test_pairwise_training_ranks_the_samples_of_a_question(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    rm = rm_model.init_reward_model(tiny_model_dir)
    train, held = _grouped_examples(tok, 48, 4, seed=0), _grouped_examples(tok, 16, 4, seed=1)
    losses = rm_train.train_reward_model(rm, tok, train, epochs=10, lr=3e-3, batch_size=16, seed=0,
                                         train_on="outcome", objective="pairwise")
    m = rm_metrics.evaluate_reward_model(rm, tok, held)
    assert losses[-1] < losses[0]
    assert m["outcome_auc_within"] >= 0.9, m  # chance is 0.5
    # a batch without a pair makes no update
    before = {k: v.clone() for k, v in rm.state_dict().items()}
    alone = [dict(e, id=f"solo{i}", question=f"solo {i}") for i, e in enumerate(train[:4])]
    assert rm_train.train_reward_model(rm, tok, alone, epochs=1, lr=1.0, batch_size=4, seed=0, train_on="outcome",
                                       objective="pairwise") == [0.0]
    assert all(torch.equal(v, rm.state_dict()[k]) for k, v in before.items())

"""The recipes of issue 32 wired into the RL driver (stages/rl/recipes.py, the registered gspo / cispo losses, the
entropy bonus of the step): each is selected by its params group, does what it says on a run of the tiny model, and
logs its metrics. The maths of each is tested against loop references and TRL / verl elsewhere (test_losses_gspo_cispo,
test_dynamic_sampling, test_curriculum, test_reward_shaping; tests/benchmarks/test_rl_math_vs_trl.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from stages.core import paths
from stages.core.generation import Completion
from stages.core.modeling import load_model, load_tokenizer
from stages.rl.data import load_prompts, step_questions
from stages.rl.loop import begin_iteration, run_step, setup
from stages.rl.losses import POLICY_LOSSES, aggregate
from stages.rl.recipes import concat_rollouts, select_groups
from stages.rl.reward_shaping import overlong_penalty
from stages.rl.rollout import build_rollout, rollout_prompt, token_logprobs
from stages.rl.update import as_updater

from .test_grpo_stage import rl_train, tiny_params

torch.set_num_threads(1)


class Scripted:
    """A generator whose G outputs of a question are ``texts(row)`` (cycled): no model, known rewards."""

    def __init__(self, tok: Any, rows: list[dict[str, Any]], texts: Any) -> None:
        self.tok, self.rows, self.texts = tok, rows, texts
        self.calls: list[list[str]] = []

    def _row(self, prompt: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["question"] in prompt)

    def generate(self, prompts: list[str], sp: Any) -> list[list[Completion]]:
        self.calls.append([self._row(p)["id"] for p in prompts])
        out = []
        for p in prompts:
            texts = self.texts(self._row(p))
            group = []
            for g in range(sp.n):
                ids = self.tok(texts[g % len(texts)], add_special_tokens=False)["input_ids"][: sp.max_new_tokens]
                reason = "length" if len(ids) == sp.max_new_tokens else "stop"
                ids = ids + ([self.tok.eos_token_id] if reason == "stop" else [])
                group.append(Completion(texts[g % len(texts)], ids, [0.0] * len(ids), reason))
            out.append(group)
        return out

    def sync_weights(self, model: Any) -> None:
        pass


def _load() -> tuple[Any, Any, list[dict[str, Any]]]:
    return load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)


def _right(row: dict[str, Any]) -> str:
    return f"So {row['answer']}.\nThe answer is \\boxed{{{row['answer']}}}."


def _mixed(row: dict[str, Any]) -> list[str]:
    return [_right(row), "The answer is \\boxed{0}."]


def _sgd_step(p: Any, gen: Any, step: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, Any], torch.Tensor]:
    """One step of the driver with plain SGD(lr=1): (the gradient it applied, the metrics row, the (Q, G) rewards)."""
    model, tok, rows = _load()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = {n: w.detach().clone() for n, w in model.named_parameters()}
    run, models, state = setup(p, model, tok, rows=rows, generator=gen, updater=as_updater(model, opt, p))
    begin_iteration(run, models, state, 1, None)
    row, _, rewards = run_step(run, models, state, step)
    return {n: before[n] - w.detach() for n, w in model.named_parameters()}, row, rewards


# ---------------------------------------------------------------------------------------------
# GSPO, CISPO, entropy bonus


@pytest.mark.parametrize("name,metric", [("gspo", "seq_ratio_mean"), ("cispo", "clip_frac_high_pos")])
def test_policy_loss_selected_in_params_is_called_and_logs_its_metrics(project, monkeypatch, name, metric):
    calls = []
    fn = POLICY_LOSSES.get(name)

    def spy(*a: Any) -> Any:
        calls.append(a[7])  # the loss's own settings (grpo.loss.<name>; None for gspo)
        return fn(*a)

    monkeypatch.setitem(POLICY_LOSSES.impls, name, spy)
    rows: list[dict[str, Any]] = []
    p = tiny_params(steps=1, loss__policy=name, optim__minibatches=2, loss__cispo=dict(max_ratio=1.01, min_ratio=0.5))
    rl_train(*_load(), p, ckpt_dir=None, on_step=rows.append)
    assert calls and rows[0]["optimizer_steps"] == 2  # two minibatches: the second is off-policy
    assert metric in rows[0] and math.isfinite(rows[0][metric])
    if name == "cispo":
        assert (calls[0].max_ratio, calls[0].min_ratio) == (1.01, 0.5)
    assert rows[0]["ratio_mean"] != 1.0  # the second minibatch moved the ratio


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_gspo_and_cispo_apply_grpos_gradient_on_policy(project, name):
    """mu = 1 with one minibatch: every ratio is 1, so GSPO's sequence ratio and CISPO's clipped weight are 1 and the
    step applies exactly GRPO's gradient (the reason the comparison in docs/results/rl.md runs them off-policy)."""
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    over = dict(steps=1, optim__max_grad_norm=1e9, reward__custom=[], reward__custom_weights=[])
    ref, _, _ = _sgd_step(tiny_params(**over), Scripted(tok, rows, _mixed))
    got, row, _ = _sgd_step(tiny_params(loss__policy=name, **over), Scripted(tok, rows, _mixed))
    assert max(float(ref[k].abs().max()) for k in ref) > 1e-3  # a real gradient
    for k in ref:
        assert torch.allclose(got[k], ref[k], rtol=1e-5, atol=1e-7), k
    assert row["ratio_mean"] == pytest.approx(1.0)


def test_entropy_bonus_adds_the_entropy_gradient_and_is_logged(project):
    """The step's gradient with loss.entropy_coef c is GRPO's minus c x the gradient of the token-mean entropy of the
    same outputs (computed here from the full logits), and the row logs entropy_bonus = -c x that entropy."""
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    over = dict(steps=1, optim__max_grad_norm=1e9, loss__aggregation="token-mean", reward__custom=[],
                reward__custom_weights=[], kl__beta=0.0)
    c = 0.05
    ref, _, _ = _sgd_step(tiny_params(**over), Scripted(tok, rows, _mixed))
    got, row, _ = _sgd_step(tiny_params(loss__entropy_coef=c, **over), Scripted(tok, rows, _mixed))
    # the entropy term's own gradient on the same batch, from plain logits
    p = tiny_params(**over)
    model = load_model(paths.SFT_MODEL)
    qs = step_questions(len(rows), 0, p.questions_per_step, p.seed)
    batch = [rows[q] for q in qs]
    gen = Scripted(tok, rows, _mixed)
    prompts = [rollout_prompt(r["question"], "cot", p.template, tok) for r in batch]
    ro = build_rollout(batch, prompts, gen.generate(prompts, _Sp(p)), tok, mask_truncated=False, mask_written=True)
    logits = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask,
                   position_ids=(ro.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits
    logq = torch.log_softmax(logits[:, ro.prompt_len - 1:-1].float() / p.rollout.temperature, dim=-1)
    ent = -(logq.exp() * logq).sum(-1)
    h = (ent * ro.loss_mask).sum() / ro.loss_mask.sum()
    model.zero_grad()
    (-c * h).backward()
    for k, w in model.named_parameters():
        want = ref[k] + (w.grad if w.grad is not None else torch.zeros_like(w))
        assert torch.allclose(got[k], want, rtol=1e-4, atol=1e-6), k
    assert row["entropy_bonus"] == pytest.approx(-c * float(h.detach()), rel=1e-5)
    assert row["entropy"] == pytest.approx(float(h.detach()), rel=1e-5)


class _Sp:
    def __init__(self, p: Any) -> None:
        self.n, self.max_new_tokens = p.rollout.group_size, p.rollout.max_new_tokens


@pytest.mark.parametrize("share,top_k", [(False, 0), (True, 0), (True, 5)])
def test_token_entropy_gradient_equals_autograd_of_the_full_softmax(project, share, top_k):
    """stages.core.logprobs' chunked entropy with ``entropy_grad`` (the bonus's path) against autograd through
    softmax(logits / T) over the whole vocabulary, with and without the shared-prompt pass, chunks of 3 positions;
    with a top-k truncation of the log-probs the entropy is still the full distribution's."""
    model, tok, rows = _load()
    prompts = [rollout_prompt(r["question"], "cot", "deepseekmath", tok) for r in rows[:2]]
    gen = Scripted(tok, rows, lambda r: [_right(r), "no idea"])
    ro = build_rollout(rows[:2], prompts, gen.generate(prompts, type("S", (), {"n": 2, "max_new_tokens": 12})()), tok,
                       mask_truncated=False)
    w = torch.rand(ro.loss_mask.shape, generator=torch.Generator().manual_seed(0)) * ro.loss_mask
    _, ent = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, 0.7, entropy=True,
                            share_prompts=share, chunk_tokens=3, entropy_grad=True, top_k=top_k)
    (ent * w).sum().backward()
    got = {k: v.grad.clone() for k, v in model.named_parameters()}
    model.zero_grad()
    logits = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask,
                   position_ids=(ro.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits
    logq = torch.log_softmax(logits[:, ro.prompt_len - 1:-1].float() / 0.7, dim=-1)
    ref_ent = -(logq.exp() * logq).sum(-1) * ro.completion_mask
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    (ref_ent * w).sum().backward()
    for k, v in model.named_parameters():
        assert torch.allclose(got[k], v.grad, rtol=1e-4, atol=1e-6), k
    _, detached = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, 0.7, entropy=True)
    assert not detached.requires_grad  # without entropy_grad: a metric only, as before


# ---------------------------------------------------------------------------------------------
# overlong penalty


def test_overlong_penalty_is_a_reward_part(project):
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    long = "So " + "one two three " * 6
    p = tiny_params(steps=1, reward__custom=[], reward__custom_weights=[], reward__overlong=dict(factor=0.5, buffer_len=6),
                    rollout__max_new_tokens=12)
    gen = Scripted(tok, rows, lambda r: [_right(r), "The answer is \\boxed{0}.", long, "\\boxed{1}"])
    _, row, rewards = _sgd_step(p, gen)
    qs = step_questions(len(rows), 0, p.questions_per_step, p.seed)
    prompts = [rollout_prompt(rows[q]["question"], "cot", p.template, tok) for q in qs]
    ro = build_rollout([rows[q] for q in qs], prompts, gen.generate(prompts, _Sp(p)), tok, mask_truncated=False)
    pen = overlong_penalty(ro.completion_lengths.long(), max_len=12, buffer_len=6, factor=0.5).view(rewards.shape)
    acc = torch.tensor([[1.0 if _right(rows[q]) in t else 0.0 for t in ro.texts[i * 4:(i + 1) * 4]]
                        for i, q in enumerate(qs)], dtype=torch.float64)
    assert (pen < 0).any() and (pen == -0.5).any()  # the long output is cut at the limit: -factor
    assert torch.equal(rewards, acc + pen)
    assert row["overlong_penalty_mean"] == pytest.approx(float(pen.mean()))


# ---------------------------------------------------------------------------------------------
# dynamic sampling


def _planted(rows: list[dict[str, Any]], p: Any) -> tuple[set[str], Any]:
    """Step 0's first question always right (an all-equal group), every other question half right."""
    first = rows[step_questions(len(rows), 0, p.questions_per_step, p.seed)[0]]["id"]
    return {first}, lambda r: [_right(r)] if r["id"] == first else _mixed(r)


def test_dynamic_sampling_refills_a_planted_all_equal_group(project):
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    over = dict(steps=1, reward__custom=[], reward__custom_weights=[])
    p = tiny_params(dynamic_sampling=dict(enabled=True, metric="accuracy", max_rounds=3, max_per_round=None,
                                          oversample=1.0), **over)
    planted, texts = _planted(rows, p)
    gen = Scripted(tok, rows, texts)
    _, row, rewards = _sgd_step(p, gen)
    Q, G = p.questions_per_step, p.rollout.group_size
    assert len(gen.calls) == 2 and gen.calls[0][0] in planted  # round 1 held the planted group, a second round ran
    assert not planted & set(gen.calls[1]) and not set(gen.calls[0]) & set(gen.calls[1])  # new questions
    assert row["ds_rounds"] == 2 and row["ds_kept_groups"] == Q and row["ds_shortfall"] == 0
    assert row["ds_generated_groups"] == Q + len(gen.calls[1])
    assert rewards.shape == (Q, G) and row["n_train_outputs"] == Q * G and row["zero_std_frac"] == 0.0
    assert all(r.min() == 0.0 and r.max() == 1.0 for r in rewards)  # every trained group has spread
    # without dynamic sampling the planted group is only skipped: a step of Q - 1 groups
    _, plain, _ = _sgd_step(tiny_params(**over), Scripted(tok, rows, texts))
    assert plain["n_train_outputs"] == (Q - 1) * G and "ds_rounds" not in plain
    # one round: filter only, the batch runs short and the shortfall is logged
    p1 = tiny_params(dynamic_sampling=dict(enabled=True, metric="accuracy", max_rounds=1, max_per_round=None,
                                           oversample=1.0), **over)
    _, short, _ = _sgd_step(p1, Scripted(tok, rows, texts))
    assert short["ds_rounds"] == 1 and short["ds_shortfall"] == 1 and short["n_train_outputs"] == (Q - 1) * G


def test_dynamic_sampling_bounds_its_rounds_when_nothing_is_informative(project):
    """Every group all-equal: max_rounds rounds, then the plain step on the first round (nothing trains but the KL)."""
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    p = tiny_params(steps=1, reward__custom=[], reward__custom_weights=[],
                    dynamic_sampling=dict(enabled=True, metric="reward", max_rounds=3, max_per_round=2, oversample=1.0))
    gen = Scripted(tok, rows, lambda r: [_right(r)])
    _, row, rewards = _sgd_step(p, gen)
    assert len(gen.calls) == 3 and [len(c) for c in gen.calls] == [3, 2, 2]
    assert row["ds_rounds"] == 3 and row["ds_kept_groups"] == 0 and row["ds_shortfall"] == 3
    assert rewards.shape == (3, 4) and row["n_train_outputs"] == 0


def test_merged_rollout_keeps_every_row_and_its_log_probs(project):
    """Groups of two rollouts with different prompt and completion lengths, re-padded into one: the same tokens,
    masks and teacher-forced log-probs per output."""
    model, tok, rows = _load()
    gen = Scripted(tok, rows, lambda r: [_right(r), "The answer is \\boxed{0}.", "So"])
    parts = []
    for qs, n in (([0, 1], 12), ([5, 2, 3], 6)):
        prompts = [rollout_prompt(rows[q]["question"] + " x" * q, "cot", "deepseekmath", tok) for q in qs]
        comp = gen.generate(prompts, type("S", (), {"n": 3, "max_new_tokens": n})())
        parts.append(build_rollout([rows[q] for q in qs], prompts, comp, tok, mask_truncated=False))
    a, b = select_groups(parts[0], [1]), select_groups(parts[1], [0, 2])
    merged = concat_rollouts([a, b], tok.pad_token_id)
    assert len(merged.texts) == 9 and merged.rows[0]["id"] == rows[1]["id"] and merged.rows[3]["id"] == rows[5]["id"]
    lp_m, _ = token_logprobs(model, merged.input_ids, merged.attention_mask, merged.prompt_len, 1.0)
    at = 0
    for ro in (a, b):
        lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, 1.0)
        n, t = len(ro.texts), ro.completion_mask.shape[1]
        for i in range(n):
            assert ro.input_ids[i][ro.attention_mask[i] == 1].tolist() == \
                merged.input_ids[at + i][merged.attention_mask[at + i] == 1].tolist()
        assert torch.equal(merged.loss_mask[at:at + n, :t], ro.loss_mask)
        assert merged.loss_mask[at:at + n, t:].sum() == 0
        assert torch.allclose(lp_m[at:at + n, :t] * ro.completion_mask, lp * ro.completion_mask, atol=1e-5)
        at += n


# ---------------------------------------------------------------------------------------------
# curriculum


def _easy_even(row: dict[str, Any]) -> list[str]:
    """Even answers always right (easy after one step), odd ones half right."""
    return [_right(row)] if int(row["answer"]) % 2 == 0 else _mixed(row)


def _cur_params(**over: Any) -> Any:
    return tiny_params(steps=4, checkpoint_every=1, reward__custom=[], reward__custom_weights=[],
                       curriculum=dict(enabled=True, low=0.0, high=1.0, hard_weight=0.0, easy_weight=0.0,
                                       normal_weight=1.0, unseen_weight=0.5, ema=1.0), **over)


def test_curriculum_avoids_always_solved_prompts_and_resumes_exactly(project, monkeypatch):
    tok, rows = load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    p = _cur_params()
    easy = {r["id"] for r in rows if int(r["answer"]) % 2 == 0}
    ref_gen = Scripted(tok, rows, _easy_even)
    ref_rows: list[dict[str, Any]] = []
    ref, ref_samples, _ = rl_train(load_model(paths.SFT_MODEL), tok, rows, p, ckpt_dir=None, generator=ref_gen,
                                   on_step=ref_rows.append)
    seen: set[str] = set()
    for calls in ref_gen.calls:  # an easy prompt, once seen, is never drawn again while others have weight
        assert not (set(calls) & easy & seen)
        seen |= set(calls)
    assert sum(r["curriculum_sampled_normal"] for r in ref_rows[1:]) > 0  # seen, mixed prompts come back
    plain = Scripted(tok, rows, _easy_even)
    rl_train(load_model(paths.SFT_MODEL), tok, rows, tiny_params(steps=4, reward__custom=[], reward__custom_weights=[]),
             ckpt_dir=None, generator=plain)
    assert plain.calls != ref_gen.calls  # the curriculum changed the questions

    # interrupted after step 1 (checkpoint of steps 0-1), resumed: the same questions, rewards and losses
    ckpt = Path("checkpoints/grpo/cur")

    def crash(row: dict[str, Any]) -> None:
        if row["step"] == 2:
            raise KeyboardInterrupt

    gen1 = Scripted(tok, rows, _easy_even)
    with pytest.raises(KeyboardInterrupt):
        rl_train(load_model(paths.SFT_MODEL), tok, rows, p, ckpt_dir=ckpt, generator=gen1, on_step=crash)
    gen2 = Scripted(tok, rows, _easy_even)
    hist, samples, info = rl_train(load_model(paths.SFT_MODEL), tok, rows, p, ckpt_dir=ckpt, generator=gen2)
    assert info["resumed_from_step"] == 2
    assert gen1.calls[:2] + gen2.calls == ref_gen.calls
    assert samples == ref_samples
    for h, r in zip(hist, ref, strict=True):
        assert (h["loss"], h["reward_mean"], h["grad_norm"]) == (r["loss"], r["reward_mean"], r["grad_norm"])

    # negative control: without the saved pass rates the resumed run draws other questions
    from stages.rl.curriculum import PassRateCurriculum

    monkeypatch.setattr(PassRateCurriculum, "load_state_dict", lambda self, state: None)
    gen3 = Scripted(tok, rows, _easy_even)
    _, _, info3 = rl_train(load_model(paths.SFT_MODEL), tok, rows, p, ckpt_dir=ckpt, generator=gen3)
    assert info3["resumed_from_step"] == 3 and gen3.calls != ref_gen.calls[3:]


# ---------------------------------------------------------------------------------------------
# params


@pytest.mark.parametrize("over,expect", [
    (dict(algorithm="ppo", advantage__estimator="gae",
          dynamic_sampling=dict(enabled=True, metric="accuracy", max_rounds=2, max_per_round=None, oversample=1.0)),
     "dynamic_sampling.enabled: algorithm ppo has no group-relative advantage"),
    (dict(algorithm="online_rft", reward__custom=[], reward__custom_weights=[],
          curriculum=dict(enabled=True, low=0.0, high=1.0, hard_weight=0.1, easy_weight=0.1, normal_weight=1.0,
                          unseen_weight=1.0, ema=1.0)), "curriculum.enabled: algorithm online_rft"),
    (dict(reward__overlong=dict(factor=1.0, buffer_len=40)), "reward.overlong.buffer_len (40) is above"),
    (dict(rollout__mode="tir", reward__overlong=dict(factor=1.0, buffer_len=4)), "TIR output's length"),
    (dict(loss__cispo=dict(max_ratio=1.0, min_ratio=2.0)), "min_ratio (2.0) is above max_ratio (1.0)"),
    (dict(loss__policy="gpso"), "unknown policy loss 'gpso'; registered: clipped, nll, gspo, cispo"),
    (dict(curriculum=dict(enabled=True, low=0.5, high=0.5, hard_weight=0.1, easy_weight=0.1, normal_weight=1.0,
                          unseen_weight=1.0, ema=1.0)), "low (0.5) must be below high (0.5)"),
])
def test_bad_recipe_params_are_one_line_errors(over, expect):
    with pytest.raises(ValidationError, match=__import__("re").escape(expect)):
        tiny_params(**over)


def test_aggregation_of_the_entropy_bonus_is_the_loss_aggregation():
    """The bonus uses the step's batch-wide normaliser in the loss's aggregation (verl's agg_loss), so micro-batches
    sum to the batch's term (here: two halves of a batch against the whole)."""
    from stages.rl.losses import LossNormalizer, entropy_bonus

    g = torch.Generator().manual_seed(0)
    ent = torch.rand(6, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=g) > 0.3).double()
    for agg in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        norm = LossNormalizer.from_mask(mask, max_len=5)
        whole, _ = entropy_bonus(ent, mask, coef=0.1, aggregation=agg, normalizer=norm)
        halves = sum(entropy_bonus(ent[s], mask[s], coef=0.1, aggregation=agg, normalizer=norm)[0]
                     for s in (slice(0, 3), slice(3, 6)))
        assert float(whole) == pytest.approx(float(halves), rel=1e-12)
        assert float(whole) == pytest.approx(-0.1 * float(aggregate(ent, mask, agg, norm)), rel=1e-12)

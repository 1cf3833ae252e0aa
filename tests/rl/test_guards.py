"""Guards against reward hacking (stages/rl/guards.py): the running statistics, normalisation, the length term and
the last-step bump against loop references; the guarded source on outcome and process rewards against hand
computations; state round trip; the params' rules; a tiny GRPO run with every guard on that resumes; the divergence
criterion against its formula, and the divergence guard in tiny GRPO runs on a planted hacked RM (stop, revert) and on
an honest one (no event)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from stages.core.generation import Completion
from stages.core.prompts import chat_prompt
from stages.rl import guards as Gd
from stages.rl.rewards import Rewards, accuracy_reward
from tests.rl.test_grpo_stage import tiny_params
from tests.rl.test_iterative import rm_project  # noqa: F401 (the fixture)

torch.set_num_threads(1)


def _cfg(**over):
    raw = dict(normalize=False, clip=None, rule_weight=0.0, length_penalty=0.0, length_target=None)
    raw.update(over)
    return SimpleNamespace(**raw)


def test_running_stats_match_the_batch_formula_over_many_updates():
    rng = random.Random(0)
    st, seen = Gd.RunningStats(), []
    for _ in range(7):
        k = rng.randint(1, 9)
        x = torch.tensor([rng.gauss(2.0, 3.0) for _ in range(k)] + [math.nan], dtype=torch.float64)
        st.update(x)
        seen.extend(v for v in x.tolist() if math.isfinite(v))
        m = sum(seen) / len(seen)
        assert st.n == len(seen) and st.mean == pytest.approx(m, rel=1e-12)
        assert st.std == pytest.approx(math.sqrt(sum((v - m) ** 2 for v in seen) / len(seen)), rel=1e-10)
    st.update(torch.tensor([math.nan]))  # nothing finite: no change
    assert st.n == len(seen)


def test_normalize_clip_and_length_term_elementwise():
    st = Gd.RunningStats()
    st.update(torch.tensor([1.0, 2.0, 3.0, 10.0], dtype=torch.float64))
    x = torch.tensor([[0.0, 4.0, math.nan], [10.0, 2.0, -5.0]], dtype=torch.float64)
    got = Gd.normalize(x, st, clip=1.5)
    for i in range(2):
        for j in range(3):
            v = x[i, j].item()
            if math.isnan(v):
                assert math.isnan(got[i, j].item())
                continue
            want = max(-1.5, min(1.5, (v - st.mean) / (st.std + Gd.NORM_EPS)))
            assert got[i, j].item() == pytest.approx(want, rel=1e-12)
    lens = torch.tensor([[10, 45, 60]])
    assert Gd.length_term(lens, 40.0, 0.5)[0].tolist() == pytest.approx([0.5 * 30 / 40, 0.5 * 5 / 40, 0.5 * 20 / 40])


def test_add_to_last_step_bumps_the_last_finite_step_only():
    nan = math.nan
    steps = torch.tensor([[[0.1, 0.2, nan], [0.5, nan, nan], [nan, nan, nan]]], dtype=torch.float64)
    delta = torch.tensor([[1.0, -2.0, 3.0]], dtype=torch.float64)
    got = Gd.add_to_last_step(steps, delta)
    want = [[[0.1, 1.2, nan], [-1.5, nan, nan], [nan, nan, nan]]]
    for g, w in zip(got.flatten().tolist(), torch.tensor(want).flatten().tolist(), strict=True):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w)


class _Inner:
    """A stub RM source with fixed rewards (per output, or per step when ``steps`` is given)."""

    def __init__(self, output, steps=None):
        self.output, self.steps = output, steps
        self.rm = None

    def rewards(self, ro):
        if self.steps is None:
            return Rewards(self.output.clone())
        ends = torch.zeros(self.steps.shape, dtype=torch.long)
        return Rewards(torch.nanmean(self.steps, -1), self.steps.clone(), ends)


def _rollout(texts, answers, lengths, G):
    mask = torch.zeros(len(texts), max(lengths))
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return SimpleNamespace(texts=texts, rows=[{"answer": a} for a in answers], group_size=G, completion_mask=mask,
                           completion_lengths=mask.sum(-1))


def test_guarded_outcome_reward_is_normalised_mixed_and_length_penalised():
    out = torch.tensor([[0.9, 0.2], [0.6, 0.4]], dtype=torch.float64)
    ro = _rollout(["\\boxed{5}", "\\boxed{4}", "\\boxed{7}", "\\boxed{7}"], ["5", "5", "7", "8"], [40, 20, 50, 40], 2)
    src = Gd.GuardedSource(_Inner(out), _cfg(normalize=True, clip=None, rule_weight=0.5, length_penalty=0.2), 40.0)
    r = src.rewards(ro)
    m, s = out.mean().item(), out.std(unbiased=False).item()
    rule = [[1, 0], [1, 0]]
    lens = [[40, 20], [50, 40]]
    for q in range(2):
        for g in range(2):
            want = (out[q, g].item() - m) / (s + Gd.NORM_EPS) + 0.5 * rule[q][g] - 0.2 * abs(lens[q][g] - 40) / 40
            assert r.output[q, g].item() == pytest.approx(want, rel=1e-9)
    assert r.metrics["rm_raw_mean"] == pytest.approx(m)
    state = src.state_dict()
    again = Gd.GuardedSource(_Inner(out), src.cfg, 40.0)
    again.load_state_dict(state)
    assert again.stats == src.stats


def test_guarded_process_reward_adds_rule_and_length_at_the_last_step():
    nan = math.nan
    steps = torch.tensor([[[0.8, 0.6], [0.3, nan]]], dtype=torch.float64)
    ro = _rollout(["\\boxed{5}", "\\boxed{6}"], ["5", "5"], [30, 10], 2)
    src = Gd.GuardedSource(_Inner(None, steps), _cfg(rule_weight=1.0, length_penalty=0.1), 20.0)
    r = src.rewards(ro)
    assert r.per_step
    assert r.steps[0, 0].tolist() == pytest.approx([0.8, 0.6 + 1.0 - 0.1 * 10 / 20])
    assert r.steps[0, 1, 0].item() == pytest.approx(0.3 + 0.0 - 0.1 * 10 / 20) and math.isnan(r.steps[0, 1, 1].item())
    assert r.output[0].tolist() == pytest.approx([(0.8 + 0.6 + 1.0 - 0.05) / 2, 0.3 - 0.05])


def test_guarded_is_a_no_op_when_every_guard_is_off_and_needs_a_length_target():
    inner = _Inner(torch.zeros(1, 2))
    assert Gd.guarded(inner, _cfg(), []) is inner
    from stages.core.errors import PipelineError

    with pytest.raises(PipelineError, match="length_target"):
        Gd.guarded(inner, _cfg(length_penalty=0.1), [])
    ex = [{"completion_ids": [1] * 30, "origin": "sft"}, {"completion_ids": [1] * 50, "origin": "sft"},
          {"completion_ids": [1] * 90, "origin": "iter1"}]
    assert Gd.guarded(inner, _cfg(length_penalty=0.1), ex).length_target == 40.0
    assert Gd.guarded(inner, _cfg(length_penalty=0.1, length_target=12), ex).length_target == 12


def test_params_refuse_guards_without_a_reward_model():
    with pytest.raises(ValueError, match="rm_guards apply"):
        tiny_params(reward__rm_guards=dict(normalize=True, clip=None, rule_weight=0.0, length_penalty=0.0, length_target=None))
    with pytest.raises(ValueError, match="clip"):
        tiny_params(reward__source="outcome_rm",
                    reward__rm_guards=dict(normalize=False, clip=2.0, rule_weight=0.0, length_penalty=0.0, length_target=None))
    p = tiny_params(reward__source="process_rm",
                    reward__rm_guards=dict(normalize=True, clip=3.0, rule_weight=0.5, length_penalty=0.1, length_target=None))
    assert p.reward.rm_guards.rule_weight == 0.5


def test_grpo_with_every_guard_resumes_with_its_running_statistics(rm_project):  # noqa: F811
    """A guarded process-RM run interrupted after step 1 resumes with the checkpointed running statistics: the same
    rewards and weights as an uninterrupted run."""
    from stages.core import paths
    from stages.rl.iterative import run_iterations
    from stages.rl.loop import close, setup
    from tests.rl.test_grpo_stage import _load

    p = tiny_params(steps=3, checkpoint_every=1, reward__source="process_rm", baseline=dict(enabled=False, lr=1e-3),
                    reward__rm_guards=dict(normalize=True, clip=2.0, rule_weight=0.5, length_penalty=0.2, length_target=8))

    def go(ckpt: Path, crash: bool):
        model, tok, rows = _load()

        def on_step(row):
            if crash and row["step"] == 1:
                raise KeyboardInterrupt

        run, models, state = setup(p, model, tok, rows=rows, rm_dir=paths.REWARD_MODEL, on_step=on_step)
        try:
            hist = run_iterations(run, models, state, ckpt_dir=ckpt, out_dir=Path("iters"))
        finally:
            close(run, models, state)
        return hist, model

    full, m_full = go(Path("ck_full"), crash=False)
    with pytest.raises(KeyboardInterrupt):
        go(Path("ck"), crash=True)
    resumed, m_res = go(Path("ck"), crash=False)
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert "rm_norm_mean" in full[0] and "length_penalty_mean" in full[0]
    for a, b in zip(full, resumed, strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], rel=1e-6)
        assert a["rm_norm_mean"] == pytest.approx(b["rm_norm_mean"], rel=1e-9)
    for k, v in m_full.state_dict().items():
        assert torch.allclose(v, m_res.state_dict()[k], atol=1e-6)


def _divergence_reference(rm, acc, W, d):
    """The docstring's formula, spelled out: window means, the earliest best window, the two conditions."""
    a = [sum(acc[t - W + 1:t + 1]) / W for t in range(W - 1, len(acc))]
    r = [sum(rm[t - W + 1:t + 1]) / W for t in range(W - 1, len(rm))]
    if not a:
        return None, False
    best = a.index(max(a))
    return best + W - 1, a[-1] < a[best] - d and r[-1] >= r[best]


def test_divergence_matches_its_formula_on_hacked_held_and_random_series():
    hacked_rm = [0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8]  # Gao et al.'s shape: the proxy rises, the gold peaks and falls
    hacked_acc = [0.3, 0.4, 0.5, 0.45, 0.3, 0.2, 0.1]
    assert Gd.divergence(hacked_rm[:5], hacked_acc[:5], 3, 0.1) == (3, False)  # 0.317 is not below 0.45 - 0.1
    assert Gd.divergence(hacked_rm, hacked_acc, 3, 0.1) == (3, True)  # 0.2 < 0.45 - 0.1 while RM 0.7 >= 0.467
    assert Gd.divergence(hacked_rm, hacked_acc, 3, 0.3) == (3, False)
    honest_rm = [0.3, 0.35, 0.4, 0.38, 0.3, 0.25, 0.2]  # the RM falls with the accuracy: not overoptimisation
    assert Gd.divergence(honest_rm, hacked_acc, 3, 0.1) == (3, False)
    assert Gd.divergence([0.5, 0.6], [0.5, 0.1], 3, 0.1) == (None, False)  # before W steps
    assert Gd.divergence([0.5] * 4, [math.nan] * 4, 2, 0.1) == (None, False)
    assert Gd.divergence([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], 1, 0.0) == (0, False)  # ties: the earliest window
    rng = random.Random(1)
    for _ in range(300):
        n, W = rng.randint(1, 12), rng.randint(1, 4)
        rm = [round(rng.random(), 1) for _ in range(n)]
        acc = [round(rng.random(), 1) for _ in range(n)]
        d = rng.choice([0.0, 0.1, 0.3])
        got, want = Gd.divergence(rm, acc, W, d), _divergence_reference(rm, acc, W, d)
        assert got[0] == want[0] and got[1] == want[1], (rm, acc, W, d)


def test_params_of_the_divergence_guard():
    on = dict(divergence=dict(action="stop", window=3, drop=0.1))
    with pytest.raises(ValueError, match="rm_guards apply"):
        tiny_params(reward__rm_guards=on)
    with pytest.raises(ValueError, match="accuracy_weight"):
        tiny_params(reward__source="outcome_rm", reward__accuracy_weight=0.0, reward__rm_guards=on)
    p = tiny_params(reward__source="outcome_rm", reward__rm_guards=on)
    assert p.reward.rm_guards.divergence.action == "stop"
    assert tiny_params().reward.rm_guards.divergence.action == "none"


class ChoiceSampler:
    """A sampler whose choice the policy learns: for each prompt, one of two fixed completions of its row, the right
    answer written out (long) or the wrong ``\\boxed{0}.`` (short), drawn (seeded) with the softmax of
    ``scale`` x their mean token log-probs under the current policy, which GRPO's updates move."""

    def __init__(self, tok, rows, model, scale: float = 2.0) -> None:
        self.tok, self.model, self.scale = tok, model, scale
        self.by_prompt = {chat_prompt(r["question"], "cot"): r for r in rows}

    def _completion(self, text: str) -> Completion:
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return Completion(text, ids, [0.0] * len(ids), "stop")

    def _mean_logp(self, prompt: str, ids: list[int]) -> float:
        p = self.tok(prompt)["input_ids"]
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([p + ids]), use_cache=False).logits[0, len(p) - 1:-1]
        return float(torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None]).mean())

    def generate(self, prompts, sp):
        g, out = torch.Generator().manual_seed(sp.seed), []
        for prompt in prompts:
            a = self.by_prompt[prompt]["answer"]
            cands = [self._completion(f"So {a}.\nThe answer is \\boxed{{{a}}}."), self._completion("\\boxed{0}.")]
            probs = torch.softmax(self.scale * torch.tensor([self._mean_logp(prompt, c.token_ids) for c in cands]), 0)
            out.append([cands[i] for i in torch.multinomial(probs, sp.n, replacement=True, generator=g).tolist()])
        return out

    def sync_weights(self, model) -> None:
        self.model = model


def _planted_rm(hacked: bool):
    """``RewardModelSource.rewards`` of a planted RM: hacked = 0.9 for a short output (<= 6 tokens: the wrong
    ``\\boxed{0}.``), else 0.2; honest = 0.9 for a right answer, else 0.2."""

    def rewards(self, ro):
        if hacked:
            v = [0.9 if int(n) <= 6 else 0.2 for n in ro.completion_lengths]
        else:
            v = [0.9 if accuracy_reward(completion=t, answer=r["answer"]) else 0.2 for t, r in zip(ro.texts, ro.rows, strict=True)]
        return Rewards(torch.tensor(v, dtype=torch.float64).view(-1, ro.group_size))

    return rewards


def _guarded_run(monkeypatch, hacked: bool, action: str, ckpt_dir: Path | None = None):
    """A 12-step outcome-RM GRPO run of the tiny policy through :class:`ChoiceSampler` on the planted RM with the
    divergence guard (W = 3, d = 0.15); returns (rows, state, the policy's weights seen by on_step per step, model)."""
    from stages.core import paths
    from stages.rl.loop import fit
    from stages.rl.rm.source import RewardModelSource
    from tests.rl.test_grpo_stage import _load

    monkeypatch.setattr(RewardModelSource, "rewards", _planted_rm(hacked))
    p = tiny_params(reward__source="outcome_rm", steps=12, questions_per_step=4, checkpoint_every=0,
                    log_completions_every=0, rollout__group_size=8, optim__lr=5e-3, baseline=dict(enabled=False, lr=1e-3),
                    reward__rm_guards=dict(divergence=dict(action=action, window=3, drop=0.15)))
    model, tok, rows = _load()
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def on_step(row):
        seen[row["step"]] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    _, _, state = fit(p, model, tok, rows=rows, rm_dir=paths.REWARD_MODEL, generator=ChoiceSampler(tok, rows, model),
                      on_step=on_step, ckpt_dir=ckpt_dir)
    return state.history, state, seen, model


def _same(a, b) -> bool:
    return all(torch.equal(v, b[k]) for k, v in a.items())


def test_divergence_guard_stops_a_hacked_run_with_the_best_windows_policy(rm_project, monkeypatch):  # noqa: F811
    """The planted RM pays the short wrong output: the policy learns it, the RM reward rises and the rule accuracy of
    the same samples falls; the guard fires, ends the run and leaves the policy as after the best window's last step."""
    hist, state, seen, model = _guarded_run(monkeypatch, hacked=True, action="stop")
    (ev,) = state.info["rm_divergence"]
    fired, best = ev["step"], ev["best_step"]
    assert state.stopped and len(hist) == fired + 1 < 12 and ev["action"] == "stop" and ev["restored"]
    assert [r["rm_divergence"] for r in hist] == [0.0] * fired + [1.0]
    acc, rm = [r["accuracy"] for r in hist], [r["reward_mean"] for r in hist]
    assert sum(acc[-3:]) / 3 < sum(acc[best - 2:best + 1]) / 3 - 0.15 and sum(rm[-3:]) >= sum(rm[best - 2:best + 1])
    assert ev["accuracy_window"] == pytest.approx(sum(acc[-3:]) / 3, abs=1e-6)
    assert _same(model.state_dict(), seen[best]) and not _same(seen[fired - 1], seen[best])


def test_divergence_guard_reverts_and_goes_on(rm_project, monkeypatch, tmp_path):  # noqa: F811
    hist, state, seen, _ = _guarded_run(monkeypatch, hacked=True, action="revert", ckpt_dir=tmp_path / "ck")
    evs = state.info["rm_divergence"]
    assert not state.stopped and len(hist) == 12 and evs and all(e["action"] == "revert" and e["restored"] for e in evs)
    for e in evs:  # the policy after the firing step is the best window's, saved under ckpt_dir/divergence
        assert _same(seen[e["step"]], seen[e["best_step"]]) and hist[e["step"]]["rm_divergence"] == 1.0
    assert (tmp_path / "ck" / "divergence").is_dir()


def test_divergence_guard_leaves_an_honest_run_alone(rm_project, monkeypatch):  # noqa: F811
    hist, state, _, _ = _guarded_run(monkeypatch, hacked=False, action="stop")
    assert "rm_divergence" not in state.info and not state.stopped and len(hist) == 12
    assert all(r["rm_divergence"] == 0.0 for r in hist)
    assert hist[-1]["accuracy"] > hist[0]["accuracy"] + 0.3  # the honest RM's reward rises with the accuracy

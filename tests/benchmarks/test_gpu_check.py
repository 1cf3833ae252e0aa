"""benchmarks/gpu_check.py off a GPU: the one-line refusal, the --allow-cpu path on a tiny Qwen2 (GRPO steps through
the RL loop (stages.rl.loop.fit), SFT steps through the loop's forward and the update path), and the budget."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_check

TINY = ["--allow-cpu", "--size", "tiny", "--questions", "2", "--group-size", "2", "--max-new-tokens", "6",
        "--grpo-micro-batch", "4", "--sft-micro-batch", "2", "--seq", "64"]


def test_refuses_without_a_gpu(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA GPU" in err


def test_peak_tflops_by_device_name() -> None:
    assert gpu_check.peak_tflops("NVIDIA H200") == 989.0
    assert gpu_check.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_check.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.peak_tflops("Some Other GPU") is None


def test_allow_cpu_runs_grpo_and_sft_steps_within_the_budget(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(TINY + ["--grpo-steps", "2", "--sft-steps", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    g, s = res["grpo"], res["sft"]
    assert g["steps_run"] == 2 and all(x["rollout_tokens"] > 0 for x in g["per_step"])
    assert g["rollout_tokens_per_s"] > 0 and g["update_tokens_per_s"] > 0
    assert s["steps_run"] == 2 and s["tokens_per_s"] > 0 and s["loss_first"] > 0
    assert res["planner"]["grpo"] > 0 and res["planner"]["sft"] > 0 and res["within_budget"]
    from stages.plan import ModelShape

    tiny = ModelShape.from_config({**gpu_check.SIZES["tiny"], "tie_word_embeddings": True, "model_type": "qwen2"})
    assert res["n_params"] == tiny.n_params()
    printed = capsys.readouterr().out
    assert "rollout" in printed and "planner" in printed


def test_the_budget_stops_the_steps(monkeypatch, tmp_path, capsys) -> None:
    """A budget shorter than the model build: one GRPO step and one SFT step run, and the run says it went over."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(TINY + ["--grpo-steps", "5", "--sft-steps", "5", "--budget-s", "1", "--out", str(out)]) == 3
    res = json.loads(out.read_text())
    assert res["grpo"]["steps_run"] == 1 and res["sft"]["steps_run"] == 1 and not res["within_budget"]
    assert "over the budget" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["0.5b"])
def test_the_half_billion_shape_is_qwen25_05b(size) -> None:
    from stages.plan import KNOWN, ModelShape

    cfg = {**gpu_check.SIZES[size], "tie_word_embeddings": True, "model_type": "qwen2"}
    assert ModelShape.from_config(cfg) == KNOWN["Qwen/Qwen2.5-0.5B-Instruct"]
    assert 0.45e9 < KNOWN["Qwen/Qwen2.5-0.5B-Instruct"].n_params() < 0.5e9

"""benchmarks/gpu_check.py off a GPU: the one-line refusal, and the --allow-cpu path on a tiny model (hf backend)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_check
from tests.rl.conftest import make_tiny_model_dir, write_prompts

torch.set_num_threads(1)


def test_refuses_without_a_gpu(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--model", "Qwen/Qwen2.5-0.5B-Instruct"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA GPU" in err


def test_allow_cpu_runs_the_grpo_steps_on_a_tiny_model(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = make_tiny_model_dir(tmp_path / "m")
    data = write_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "gpu_check.json"
    args = ["--allow-cpu", "--model", str(model), "--backend", "hf", "--steps", "2", "--questions", "2",
            "--group-size", "2", "--max-new-tokens", "6", "--data", str(data), "--out", str(out)]
    assert gpu_check.main(args + ["--cpu-max-params", "1000"]) == 2  # the tiny model is still above 1000
    assert "only tiny models" in capsys.readouterr().err
    assert gpu_check.main(args) == 0
    res = json.loads(out.read_text())
    assert res["steps_run"] == 2 and len(res["per_step"]) == 2 and res["backend"] == "hf"
    assert all(x["rollout_tokens"] > 0 and x["rollout_tokens_per_s"] > 0 for x in res["per_step"])
    assert res["step_s_mean"] == pytest.approx(res["per_step"][1]["step_s"], abs=1e-3)  # first step excluded
    assert "rollout tokens/s" in capsys.readouterr().out

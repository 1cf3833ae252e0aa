"""The memory planner (stages/plan.py): parameter counts, the command line on the tiny default and on the 7B params,
the largest micro-batch, and (slow) its estimates against the peak resident memory of fresh CPU processes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from stages import plan
from stages.plan import GIB, ModelShape, TrainSetup, largest_micro_batch, train_memory

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", ["llama", "qwen2_gqa_tied"])
def test_parameter_count_is_the_models(kind) -> None:
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        model = Qwen2ForCausalLM(cfg)
    shape = ModelShape.from_config(cfg.to_dict())
    assert shape.n_params() == sum(p.numel() for p in model.parameters())


def test_known_shapes_and_the_7b_plan(tmp_path, capsys) -> None:
    """The 7B params on 8 x 80 GiB: every stage is planned, GPU-hours are positive, the JSON matches the table."""
    assert plan.KNOWN["deepseek-ai/deepseek-coder-7b-base-v1.5"].n_params() == pytest.approx(6.91e9, rel=0.01)
    out = tmp_path / "plan.json"
    assert plan.main(["--params", str(ROOT / "params/deepseekmath-7b.yaml"), "--gpus", "8", "--gpu-mem", "80",
                      "--json", str(out)]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert [s["stage"] for s in res["stages"]] == ["pretrain", "sft", "grpo", "reward_model"]
    for s in res["stages"]:
        assert s["peak_gib"] > 0 and s["gpu_hours"] > 0 and s["stage"] in text
        assert s["fits"] == (s["peak_gib"] <= 78.0)
    grpo = next(s for s in res["stages"] if s["stage"] == "grpo")
    assert grpo["parts_gib"]["vllm_engine"] == pytest.approx(0.3 * 80, rel=1e-3) and "KV cache" in text
    assert plan.main(["--params", str(ROOT / "params.yaml"), "--gpus", "1", "--gpu-mem", "24"]) == 0


def test_checkpointing_zero_and_chunking_lower_the_estimate() -> None:
    m = plan.KNOWN["deepseek-ai/deepseek-coder-7b-base-v1.5"]
    base = TrainSetup(micro_batch=4, seq=4096, world=8, deepspeed=True, zero=2, bf16=True)
    e = train_memory(m, base)
    assert train_memory(m, plan._with(base, checkpointing=True)).parts["activations"] < e.parts["activations"] / 10
    assert train_memory(m, plan._with(base, zero=0)).peak > e.peak
    assert train_memory(m, plan._with(base, chunk=0)).peak > e.peak
    budget = 70 * GIB
    mb = largest_micro_batch(m, plan._with(base, checkpointing=True), budget)
    assert mb >= 1
    assert train_memory(m, plan._with(base, checkpointing=True, micro_batch=mb)).peak <= budget
    assert train_memory(m, plan._with(base, checkpointing=True, micro_batch=mb + 1)).peak > budget


GRID = {"hidden": [256, 512, 768], "layers": [2, 4, 6], "vocab": [32000, 65536, 152064], "seq": [256, 512, 1024],
        "micro_batch": [1, 2, 4], "zero": [0, 2], "checkpointing": [False, True]}


def draw_configs(seed: int = 18, n: int = 4) -> list[dict]:
    """``n`` configurations drawn from :data:`GRID` (seeded): estimated between 1.1 and 3.5 GiB per rank (two ranks
    stay under ~8 GiB), half on ZeRO-0 and half on ZeRO-2, with and without checkpointing."""
    grid = [dict(zip(GRID, v, strict=True)) for v in itertools.product(*GRID.values())]
    random.Random(seed).shuffle(grid)
    out: list[dict] = []
    for c in grid:
        est = train_memory(_shape(c), _setup(c)).peak
        if not 1.1 * GIB <= est <= 3.5 * GIB:
            continue
        if sum(x["zero"] == c["zero"] for x in out) >= n // 2:
            continue
        if len(out) == n - 1 and len({x["checkpointing"] for x in out + [c]}) < 2:
            continue
        out.append(c)
        if len(out) == n:
            return out
    raise AssertionError("the grid has too few configurations in range")


def _shape(c: dict) -> ModelShape:
    h = c["hidden"]
    return ModelShape(h, c["layers"], h // 64, h // 64, 4 * h, c["vocab"])


def _setup(c: dict) -> TrainSetup:
    return TrainSetup(micro_batch=c["micro_batch"], seq=c["seq"], world=2, deepspeed=True, zero=c["zero"],
                      checkpointing=c["checkpointing"], device="cpu", masked=False)


@pytest.mark.slow  # four 2-rank runs, ~1 min each on the shared 2-core machine; .ci/run runs it
def test_estimates_within_20_percent_of_measured_peaks() -> None:
    """Each configuration trains 2 steps on 2 gloo ranks (DeepSpeed's CPU accelerator, fp32, the stages' chunked
    loss) in fresh processes (benchmarks/memory.py); the larger rank's peak RSS above its post-import baseline is
    at least 1 GiB and within 20% of the planner's estimate."""
    pytest.importorskip("deepspeed")
    from benchmarks.memory import measure_train

    torch.set_num_threads(1)
    rows = []
    for c in draw_configs():
        h = c["hidden"]
        res = measure_train({**c, "heads": h // 64, "kv_heads": h // 64, "intermediate": 4 * h, "ranks": 2})
        measured = max(r["peak_bytes"] for r in res)
        est = train_memory(_shape(c), _setup(c)).peak
        rows.append((c, est / GIB, measured / GIB))
    print("\n".join(f"{c}: estimate {e:.3f} GiB, measured {m:.3f} GiB ({e / m - 1:+.1%})" for c, e, m in rows))
    for c, est, measured in rows:
        assert measured >= 1.0, c
        assert abs(est / measured - 1) <= 0.2, (c, est, measured)

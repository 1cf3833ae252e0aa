"""Fixtures for the training tests: a tiny tokenizer + Llama directory, a tiny corpus and SFT problems,
all built locally in temporary directories (no downloads, no pipeline outputs needed)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from stages.base_model import init_model, train_tokenizer
from stages.core.modeling import save_model
from stages.data.problems import generate_splits
from stages.params import BaseModelParams, PretrainParams, SftParams, TrainLoopParams

torch.set_num_threads(1)

FILLER = ["The weather was mild and the market opened early.", "Trains left the station every ten minutes.",
          "A recipe needs 3 eggs, 200 grams of flour and a pinch of salt.", "The team scored 2 goals in the second half.",
          "Hotels near the beach cost more in summer.", "She paid 45 dollars for two tickets."]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"model": HF dir, "math": jsonl, "general": jsonl, "problems": sft jsonl, "test": test jsonl}."""
    return build_tiny_world(tmp_path_factory.mktemp("tiny_world"))


def build_tiny_world(root: Path) -> dict[str, Path]:
    """Build the tiny world under ``root`` (tests outside tests/train/ call it from their own fixture)."""
    splits = generate_splits(0, n_sft=160, n_rl=1, n_test=20, min_steps=1, max_steps=2, max_value=12)
    rng = random.Random(0)
    math_rows = [{"text": f"Problem: {r['question']}\nSolution: {r['cot']}"} for r in splits["sft"][:120]]
    gen_rows = [{"text": " ".join(rng.choice(FILLER) for _ in range(6))} for _ in range(60)]
    texts = [r["text"] for r in math_rows + gen_rows] + [
        "\n".join([r["question"], r["cot"], r["pot"], r["tir"]]) for r in splits["sft"]]
    tok = train_tokenizer(texts, 400)
    bp = BaseModelParams(checkpoint=None, prompt_format="deepseekmath", seed=0, vocab_size=400, tokenizer_texts=1000, hidden_size=64,
                         intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=2,
                         max_position_embeddings=256, rope_theta=10000.0)
    model = init_model(bp, tok)
    save_model(model, tok, root / "base")
    return {
        "model": root / "base",
        "math": _write_jsonl(root / "math.jsonl", math_rows),
        "general": _write_jsonl(root / "general.jsonl", gen_rows),
        "problems": _write_jsonl(root / "sft.jsonl", splits["sft"]),
        "test": _write_jsonl(root / "test.jsonl", splits["test"]),
    }


LAUNCHER: dict[str, Any] = {"nproc_per_node": 1, "nnodes": 1, "kind": "none", "rdzv_endpoint": None, "hostfile": None,
                            "retries": 0, "retry_delay_s": 0.0}
"""One process (the launcher block every training section has)."""


def loop_params(**kw: Any) -> TrainLoopParams:
    """Small, fast loop settings (fp32, one thread); override any field."""
    ds = kw.pop("deepspeed", {"enabled": False, "zero_stage": 0, "offload_optimizer": False})
    base: dict[str, Any] = dict(seed=0, steps=6, micro_batch_size=2, grad_accum=2, seq_len=64, lr=3e-3,
                                schedule="constant", warmup_steps=2, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
                                adam_eps=1e-8, max_grad_norm=1.0, precision="fp32", num_threads=1, checkpoint_every=2,
                                eval_every=0, log_every=1, attn_implementation="sdpa",
                                gradient_checkpointing=False, logprob_chunk_tokens=256, deepspeed=ds)
    base.update(kw)
    return TrainLoopParams.model_validate(base)


def pretrain_params(world: dict[str, Path], **kw: Any) -> PretrainParams:
    train = kw.pop("train", {})
    raw: dict[str, Any] = dict(enabled=True, mixture=[{"path": str(world["math"]), "ratio": 0.75}, {"path": str(world["general"]), "ratio": 0.25}],
                               eval_docs=10, eval_tokens=512, train=loop_params(**train).model_dump(), launcher=LAUNCHER)
    raw.update(kw)
    return PretrainParams.model_validate(raw)


def sft_params(world: dict[str, Path], **kw: Any) -> SftParams:
    train = kw.pop("train", {})
    raw: dict[str, Any] = dict(enabled=True, problems=str(world["problems"]), formats={"cot": 0.6, "pot": 0.2, "tir": 0.2},
                               verify_programs=False, val_problems=16, pack=True,
                               train=loop_params(**{"seq_len": 256, "eval_every": 2, **train}).model_dump(),
                               launcher=LAUNCHER)
    raw.update(kw)
    return SftParams.model_validate(raw)

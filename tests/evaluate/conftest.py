"""Fixtures of the evaluation tests: a tiny random Llama saved as a HF directory, and a tiny project
directory (data/generated/problems/{test,sft}.jsonl) to run the stage in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.base_model import train_tokenizer
from stages.core.modeling import save_model
from stages.data.problems import generate_splits


@pytest.fixture(scope="session")
def problem_splits() -> dict[str, list[dict]]:
    return generate_splits(0, n_sft=40, n_rl=1, n_test=12, min_steps=1, max_steps=3, max_value=12)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, problem_splits: dict[str, list[dict]]) -> Path:
    """A random 2-layer Llama (hidden 64) with a byte-level BPE tokenizer; 4096 positions so that the
    GSM8K 8-shot prompt fits."""
    torch.manual_seed(0)
    texts = [r["question"] + "\n" + r["cot"] + "\n" + r["pot"] for r in problem_splits["sft"]]
    tok = train_tokenizer(texts * 3, vocab_size=400)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny_llama") / "model"
    save_model(model, tok, path)
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem_splits: dict[str, list[dict]]) -> Path:
    """A temporary project root holding the generated test and SFT problems, and the test problems as the testsets
    stage writes them (data/testsets/generated.jsonl); the cwd for the test."""
    d = tmp_path / "data" / "generated" / "problems"
    d.mkdir(parents=True)
    (tmp_path / "data" / "testsets").mkdir()
    for split, f_out in (("test", d / "test.jsonl"), ("sft", d / "sft.jsonl"),
                         ("test", tmp_path / "data" / "testsets" / "generated.jsonl")):
        with open(f_out, "w") as f:
            for r in problem_splits[split]:
                f.write(json.dumps(r) + "\n")
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    return tmp_path

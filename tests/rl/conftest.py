"""Fixtures of the RL tests: a tiny Llama + tokenizer, and ``project``: a temporary project root holding it as
data/models/sft and a small prompt file (custom-prompt schema of stages/rl/data.py, with ``values``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.base_model import train_tokenizer
from stages.core import paths
from stages.core.modeling import save_model

TEXTS = [
    "User: Tom has 3 apples. He buys 2 more. How many apples does Tom have now?\n"
    "Please reason step by step, and put your final answer within \\boxed{}.\n\nAssistant: "
    "Tom buys 2 more: 3 + 2 = 5.\nThe answer is \\boxed{5}.",
    "Anna has 7 coins. She loses 4 coins. 7 - 4 = 3. The answer is \\boxed{3}.",
] * 20


def make_tiny_model_dir(path: Path, seed: int = 0) -> Path:
    """Save a ~60k-parameter Llama with a 300-token byte-level BPE tokenizer at ``path``."""
    tok = train_tokenizer(TEXTS, 300)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    save_model(model, tok, path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def write_prompts(path: Path, n: int = 8) -> Path:
    rows = []
    for i in range(n):
        a, b = 2 + i, 1 + i % 3
        rows.append({"id": f"p{i}", "question": f"Tom has {a} apples. He buys {b} more. How many apples does Tom have now?",
                     "answer": str(a + b), "values": [a + b],
                     "cot": f"Tom buys {b} more: {a} + {b} = {a + b}.\nThe answer is \\boxed{{{a + b}}}."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> Path:
    """A temporary project root (the working directory) holding data/models/sft and data/corpus/problems/rl.jsonl."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, paths.SFT_MODEL)
    paths.RL_PROMPTS.parent.mkdir(parents=True)
    write_prompts(paths.RL_PROMPTS, 8)
    return tmp_path

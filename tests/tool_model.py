"""A tiny Llama that has memorised CoT, PoT and TIR answers to a few questions, so that greedy decoding writes
programs, stops at ```output and continues after the injected output: the tool loop end to end on a real model
(tests/core/test_tool_loop.py, tests/rl/test_tool_rollout.py, and the vllm backend's tests).

Training: the chat prompt of each (question, mode) plus its response and EOS, loss on the response, full-batch AdamW
until every greedy continuation is the memorised one (~1-3 s on one core). Deterministic (seeded, one thread)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.base_model import train_tokenizer
from stages.core.modeling import save_model
from stages.core.prompts import chat_prompt

QUESTIONS = [("Tom has 3 apples. He buys 2 more. How many apples does Tom have now?", 3, 2),
             ("Anna has 7 coins. She finds 4 more. How many coins does Anna have now?", 7, 4)]


def responses(a: int, b: int) -> dict[str, str]:
    """The memorised response per mode (TIR with its output block, as the training text holds it)."""
    return {
        "cot": f" {a} + {b} = {a + b}.\nThe answer is \\boxed{{{a + b}}}.",
        "pot": f" def solution():\n    x = {a}\n    x = x + {b}\n    return x",
        "tir": f" Let me compute.\n```python\nx = {a} + {b}\nprint(x)\n```\n```output\n{a + b}\n```\n"
               f"The answer is \\boxed{{{a + b}}}.",
    }


def examples() -> list[tuple[str, str, str]]:
    """(mode, prompt, response) of every memorised answer."""
    return [(m, chat_prompt(q, m), r) for q, a, b in QUESTIONS for m, r in responses(a, b).items()]


def make_tool_model_dir(path: Path, steps: int = 400) -> Path:
    """Train and save the memorising model (and its tokenizer) at ``path``."""
    torch.manual_seed(0)
    ex = examples()
    tok = train_tokenizer([p + r for _, p, r in ex] * 4, 320)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    rows = []
    for _, p, r in ex:
        pi = tok(p)["input_ids"]
        ri = tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((pi + ri, [-100] * len(pi) + ri))
    width = max(len(i) for i, _ in rows)
    ids = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    att = (torch.arange(width)[None, :] < torch.tensor([len(i) for i, _ in rows])[:, None]).long()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 1e-3:
                break
    finally:
        torch.set_num_threads(threads)
    model.eval()
    save_model(model, tok, path)
    return path

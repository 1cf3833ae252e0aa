"""Prompt formats, written once: the DeepSeekMath chat format with its instructions (zero-shot, for
SFT and RL models) and few-shot formats for base / pretrained models.

Chat format (DeepSeekMath evaluation, ../shared/docs/deepseekmath.md section 7; SFT uses the same):
``User: {question}\\n{instruction}\\n\\nAssistant:`` followed directly by the response.
The CoT and TIR instructions are DeepSeekMath's English ones. The PoT instruction is ours: the paper
trains on PoT data but its evaluation code has no zero-shot PoT instruction.
"""

from __future__ import annotations

from typing import Literal

Mode = Literal["cot", "pot", "tir"]

INSTRUCTIONS: dict[str, str] = {
    "cot": "Please reason step by step, and put your final answer within \\boxed{}.",
    "tir": (
        "Please integrate natural language reasoning with programs to solve the problem above, "
        "and put your final answer within \\boxed{}."
    ),
    # Ours (documented in README): asks for the PAL convention that the sandbox executes.
    "pot": "Please write a Python function solution() that returns the final answer.",
}


def chat_prompt(question: str, mode: Mode = "cot") -> str:
    """The zero-shot prompt for SFT/RL models: ``User: {q}\\n{instruction}\\n\\nAssistant:``."""
    return f"User: {question}\n{INSTRUCTIONS[mode]}\n\nAssistant:"


def response_text(solution: str) -> str:
    """The training/target response for a solution: a space, then the solution (EOS added by the tokenizer step)."""
    return " " + solution.strip()

"""Zero-shot prompt formats (stages/core/prompts.py): the DeepSeekMath prompt and the tokenizer's chat template,
recorded with the model, giving the same prompt token ids in every stage (SFT, RL, RM, evaluation) with one BOS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages.core.errors import PipelineError
from stages.core.generation import tokenize_prompts
from stages.core.modeling import MODEL_REF, load_tokenizer, save_model
from stages.core.prompts import (
    INSTRUCTIONS,
    PromptFormat,
    chat_prompt,
    prompt_format,
    record_style,
    recorded_style,
    user_message,
)
from stages.params import resolve
from tests.tiny_models import chat_tokenizer, tiny_qwen2

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Tom has 3 apples and buys 4 more. How many apples does he have? 3 + 4 = 7."] * 30
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
SOLUTION = "3 + 4 = 7.\nThe answer is $\\boxed{7}$."


def _template_ids(tok: Any, mode: str = "cot") -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": user_message(QUESTION, mode)}], tokenize=True,
                                  add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def _saved(tok: Any, tmp_path: Path, name: str) -> Any:
    """The tokenizer as a stage loads it (save_pretrained, then load_tokenizer of a model directory)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=len(tok) + 8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=256)
    save_model(Qwen2ForCausalLM(cfg), tok, tmp_path / name)
    return load_tokenizer(tmp_path / name)


def test_deepseekmath_format_is_the_papers_prompt() -> None:
    f = PromptFormat("deepseekmath")
    assert f.prompt("Q?", "tir") == chat_prompt("Q?", "tir") == f"User: Q?\n{INSTRUCTIONS['tir']}\n\nAssistant:"
    assert f.response("  x = 1 \n") == " x = 1"


@pytest.mark.parametrize("style", ["qwen", "llama3"])
def test_chat_template_prompt_ids_equal_apply_chat_template_with_one_bos(style: str, tmp_path: Path) -> None:
    tok = chat_tokenizer(TEXTS, 400, style=style)
    record_style(tok, "chat_template")
    tok = _saved(tok, tmp_path, style)
    f = prompt_format(tok)
    assert f.style == "chat_template" and recorded_style(tok) == "chat_template"
    for mode in ("cot", "pot", "tir"):
        ids = tok(f.prompt(QUESTION, mode))["input_ids"]
        assert ids == _template_ids(tok, mode)
        assert tok.bos_token_id is None or ids.count(tok.bos_token_id) == 1  # llama3: the template's BOS, once
    assert f.prompt(QUESTION).endswith("<|im_start|>assistant\n") and f.response(" 7 ") == "7"


def test_template_without_bos_keeps_the_tokenizers_single_bos(tmp_path: Path) -> None:
    """A tokenizer that adds BOS with a template that writes none: the prompt is BOS + the template's ids."""
    tok = chat_tokenizer(TEXTS, 400, style="bos_no_template")
    record_style(tok, "chat_template")
    tok = _saved(tok, tmp_path, "nobos")
    ids = tok(prompt_format(tok).prompt(QUESTION))["input_ids"]
    assert ids == [tok.bos_token_id] + _template_ids(tok)


def test_style_is_recorded_with_the_model_and_checked(tmp_path: Path) -> None:
    tok = chat_tokenizer(TEXTS, 400)
    assert recorded_style(tok) == "deepseekmath"  # nothing recorded: the default
    plain = chat_tokenizer(TEXTS, 400)
    plain.chat_template = None
    with pytest.raises(PipelineError, match="no chat template"):
        record_style(plain, "chat_template")
    with pytest.raises(PipelineError, match="expected one of"):
        record_style(tok, "alpaca")
    # a checkpoint used in place (base_model in real mode): model_ref.json carries the format
    model = tiny_qwen2(TEXTS, tmp_path / "ckpt", vocab_size=400)
    ref = tmp_path / "base"
    ref.mkdir()
    (ref / MODEL_REF).write_text(json.dumps({"path": str(model), "prompt_format": "chat_template"}))
    assert prompt_format(load_tokenizer(ref)).style == "chat_template"
    assert prompt_format(load_tokenizer(model)).style == "deepseekmath"  # the directory itself records nothing


def _stage_prompt_ids(model_dir: Path, tmp_path: Path) -> dict[str, list[int]]:
    """The prompt token ids of QUESTION (CoT) as each stage's own code builds them."""
    from stages import sft as sft_stage
    from stages.core.generation import SamplingParams
    from stages.core.problems import Problem
    from stages.evaluate.benchmarks import build_prompt
    from stages.evaluate.loop import generator_format
    from stages.rl.baseline import sft_batch
    from stages.rl.heldout import HeldoutEval
    from stages.rl.rm import labels as rm_labels
    from stages.rl.rm import model as rm_model
    from stages.rl.rollout import build_rollout
    from stages.schema.base import validate_section
    from stages.schema.sft import SftParams

    tok = load_tokenizer(model_dir)
    row = {"id": "q", "question": QUESTION, "answer": "7", "cot": SOLUTION}
    out: dict[str, list[int]] = {}

    # SFT: build_examples (the prompt is the part of the example without labels)
    raw = resolve(ROOT / "params.yaml")
    p = validate_section(SftParams, raw, "params.yaml").model_copy(update={
        "formats": SftParams.model_fields["formats"].annotation(cot=1.0, pot=0.0, tir=0.0),
        "verify_programs": False, "val_problems": 1})
    train_ex, _, _ = sft_stage.build_examples(p, [row, row], tok)
    ex = train_ex[0]
    out["sft"] = list(ex.input_ids[: next(i for i, x in enumerate(ex.labels) if x != -100)])

    # GRPO's continued-SFT baseline
    ids, _, labels = sft_batch([row], tok)
    n = int((labels[0] == -100).sum())
    out["grpo_baseline"] = [int(x) for x in ids[0, :n]]

    class Spy:
        """A generator that records the prompts it is given (it has the model's tokenizer, as the real ones)."""

        def __init__(self) -> None:
            self.tokenizer = tok
            self.prompts: list[str] = []

        def generate(self, prompts: list[str], sp: SamplingParams) -> list[list[Any]]:
            self.prompts += prompts

            class C:
                text, token_ids, logprobs, finish_reason = "7", [tok.eos_token_id], None, "stop"
            return [[C()] for _ in prompts]

    # GRPO: the held-out curve's prompts, the rollout's prompt ids, the engine's length budget
    spy = Spy()
    HeldoutEval([Problem("q", "generated", QUESTION, "7", 1)], every=1, max_new_tokens=4).evaluate(0, spy)
    out["grpo_heldout"] = tokenize_prompts(tok, spy.prompts)[0]
    prompts = list(spy.prompts)
    ro = build_rollout([row], prompts, spy.generate(prompts, SamplingParams()), tok, mask_truncated=False)
    P = ro.prompt_len
    out["grpo_rollout"] = [int(x) for x, a in zip(ro.input_ids[0, :P], ro.attention_mask[0, :P], strict=True) if a]

    # reward model: the labelled examples' prompt part
    cache: dict[str, list[int]] = {}
    rm_model._batch([{"question": QUESTION, "completion_ids": [tok.eos_token_id]}], tok, cache)
    out["reward_model"] = cache[QUESTION]
    spy = Spy()
    rm_labels.collect_examples(None, tok, [{**row, "values": [7]}], rm_labels.SampleConfig(
        samples_per_question=1, temperature=1.0, max_new_tokens=4, labels="values", rollouts_per_step=1, seed=0,
        backend="hf"), origin="test", generator=spy)
    out["reward_model_sampling"] = tokenize_prompts(tok, spy.prompts)[0]

    # evaluation (zero-shot): the prompt built with the generator's model format, tokenised as the backends do
    prob = Problem("q", "gsm8k", QUESTION, "7", 1)
    out["evaluate"] = tokenize_prompts(tok, [build_prompt(prob, "cot", "zero_shot", None, generator_format(Spy()))])[0]
    return out


@pytest.mark.parametrize("style", ["deepseekmath", "chat_template"])
def test_prompt_ids_are_the_same_in_every_stage(style: str, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    tiny_qwen2(TEXTS, model_dir, vocab_size=400, style="llama3")  # BOS added and written by the template
    tok = load_tokenizer(model_dir)
    record_style(tok, style)
    tok.save_pretrained(model_dir)
    ids = _stage_prompt_ids(model_dir, tmp_path)
    expected = _template_ids(tok) if style == "chat_template" else tok(chat_prompt(QUESTION))["input_ids"]
    for stage, got in ids.items():
        assert got == expected, stage
        assert got.count(tok.bos_token_id) == 1, stage

"""Rollout tensors: layout, teacher-forced log-probs with left padding, tool-output masking."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from stages.core.modeling import load_model, load_tokenizer
from stages.rl.rollout import build_rollout, mismatch_metrics, token_logprobs, tool_output_mask

torch.set_num_threads(1)


def _completion(tok, text, eos=True, reason="stop"):
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    return SimpleNamespace(text=text, token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason=reason)


def test_layout_and_logprobs_match_unpadded_forward(tiny_model_dir):
    tok, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir).eval()
    prompts = ["User: Tom has 3 apples.\n\nAssistant:", "User: Anna?\n\nAssistant:"]
    comps = [[_completion(tok, " 3 + 2 = 5."), _completion(tok, " 5", eos=False, reason="length")],
             [_completion(tok, " The answer is \\boxed{3}."), _completion(tok, "")]]
    rows = [{"question": "a", "answer": "5"}, {"question": "b", "answer": "3"}]
    ro = build_rollout(rows, prompts, comps, tok, mask_truncated=True)
    assert ro.input_ids.shape[0] == 4 and ro.group_size == 2
    assert ro.rows[2] is rows[1]
    assert ro.completion_mask.sum(-1).tolist() == [len(c.token_ids) for g in comps for c in g]
    assert ro.loss_mask[1].sum() == 0  # truncated output masked (mask_truncated=True)
    with torch.no_grad():
        lp, ent = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, 0.7, entropy=True)
        for n, c in enumerate(c for g in comps for c in g):
            if not c.token_ids:
                continue
            p = tok(prompts[n // 2])["input_ids"]
            full = torch.tensor([p + c.token_ids])
            logits = model(input_ids=full).logits[0, len(p) - 1:-1] / 0.7
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            assert torch.allclose(lp[n, :len(c.token_ids)], ref, atol=1e-5)
    assert ent is not None and torch.all(ent >= 0)
    m = mismatch_metrics(ro.sampler_logprobs, lp, ro.completion_mask)
    assert m["mismatch_abs_mean"] > 0


def test_tool_output_tokens_masked(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    text = "x = 3\n```python\nprint(x)\n```\n```output\n3\n```\nThe answer is 3."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    keep = tool_output_mask(ids, tok)
    masked = tok.decode([i for i, k in zip(ids, keep, strict=True) if not k])
    kept = tok.decode([i for i, k in zip(ids, keep, strict=True) if k])
    assert masked == "```output\n3\n```"
    assert "print(x)" in kept and "The answer is 3." in kept and "output" not in kept
    plain = tok("3 + 2 = 5.", add_special_tokens=False)["input_ids"]
    assert tool_output_mask(plain, tok) == [1] * len(plain)

"""Rollout tensors: layout, teacher-forced log-probs with left padding, tool-output masking."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from stages.core.modeling import load_model, load_tokenizer
from stages.rl.rollout import Sample, build_rollout, mismatch_metrics, token_logprobs, tool_output_mask

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


def test_injected_tokens_masked_by_provenance(tiny_model_dir):
    """The loss mask of a TIR output is 0 exactly on the tokens the tool loop injected (Sample.policy_mask), the
    policy's ```output header trains; an ```output block a CoT output wrote itself trains unless ``mask_written``
    (grpo.loss.mask_written_outputs, the text rule every output had before issue 21)."""
    tok = load_tokenizer(tiny_model_dir)
    enc = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    policy, injected, after = enc("x = 3\n```python\nprint(x)\n```\n```output"), enc("\n3\n```\n"), enc("So 3.")
    ids = policy + injected + after + [tok.eos_token_id]
    mask = [1] * len(policy) + [0] * len(injected) + [1] * (len(after) + 1)
    tir = Sample("...", ids, [-0.5] * len(ids), "stop", policy_mask=mask, mode="tir")
    written = enc("```output\n3\n```\nThe answer is 3.")  # the policy wrote an output block itself
    cot = SimpleNamespace(text="", token_ids=written, logprobs=[-1.0] * len(written), finish_reason="stop")
    for mask_written in (False, True):
        ro = build_rollout([{"question": "q", "answer": "3"}], ["User: q\n\nAssistant:"], [[tir, cot]], tok,
                           mask_truncated=False, mask_written=mask_written)
        assert ro.loss_mask[0, :len(ids)].tolist() == [float(m) for m in mask]
        want = tool_output_mask(written, tok) if mask_written else [1] * len(written)
        assert ro.loss_mask[1, :len(written)].tolist() == [float(m) for m in want]
    assert 0 < sum(tool_output_mask(written, tok)) < len(written)
    assert ro.completion_mask[0].sum() == len(ids)  # injected tokens are part of the sequence, only not trained
    assert ro.modes == ["tir", "cot"] and ro.program_answers == [None, None]


def test_shared_prompt_pass_gives_the_same_logprobs_and_gradients(tiny_model_dir):
    """share_prompts: the distinct prompts run once and their KV cache rows are copied to the outputs; log-probs,
    entropies and parameter gradients equal the plain full pass (left-padded prompts, padded completions, rows of a
    group not adjacent), and a batch without a repeated prompt takes the plain pass."""
    model = load_model(tiny_model_dir).train()
    torch.manual_seed(0)
    P, T, U, G = 7, 5, 3, 4
    V = model.config.vocab_size
    prompt_mask = torch.ones(U, P, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_mask[1, :1] = 0
    prompts = torch.randint(3, V, (U, P)).masked_fill(prompt_mask == 0, 0)
    ids = torch.cat([prompts.repeat_interleave(G, 0), torch.randint(3, V, (U * G, T))], 1)
    att = torch.cat([prompt_mask.repeat_interleave(G, 0), torch.ones(U * G, T, dtype=torch.long)], 1)
    att[1, -2:] = 0  # a shorter completion
    perm = torch.randperm(U * G)
    ids, att = ids[perm], att[perm]

    def run(share: bool):
        model.zero_grad()
        lp, ent = token_logprobs(model, ids, att, P, 0.9, entropy=True, share_prompts=share)
        (lp * torch.linspace(0.5, 1.5, T)).sum().backward()
        return lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    lp_a, ent_a, g_a = run(False)
    lp_b, ent_b, g_b = run(True)
    assert torch.allclose(lp_a, lp_b, atol=1e-5, rtol=0) and torch.allclose(ent_a, ent_b, atol=1e-5, rtol=0)
    for name, g in g_a.items():
        assert (g - g_b[name]).norm() <= 1e-5 * g.norm() + 1e-8, name
    one = token_logprobs(model, ids[:1], att[:1], P, 0.9, share_prompts=True)[0]  # nothing to share
    assert torch.allclose(one, lp_a[:1], atol=1e-5, rtol=0)

"""benchmarks/grpo_vs_trl.py's float64 finite-difference arbiter agrees with an exact gradient (no TRL needed: the
gradient of our grpo_loss stands in for both sides)."""

from __future__ import annotations

import torch

from benchmarks.grpo_vs_trl import _fd_check
from stages.core.modeling import load_model, load_tokenizer
from stages.rl.losses import grpo_loss
from stages.rl.rollout import token_logprobs
from tests.rl.conftest import make_tiny_model_dir

torch.set_num_threads(1)


def test_finite_differences_agree_with_the_exact_gradient(tmp_path) -> None:
    model_dir = make_tiny_model_dir(tmp_path / "m")
    tok, model = load_tokenizer(model_dir), load_model(model_dir)
    g = torch.Generator().manual_seed(0)
    B, P, T = 6, 5, 9
    ids = torch.randint(3, len(tok), (B, P + T), generator=g)
    att = torch.ones(B, P + T, dtype=torch.long)
    att[:2, :2] = 0  # left-padded prompts
    mask = torch.ones(B, T)
    mask[1, 6:], mask[4, 3:] = 0, 0
    adv = torch.randn(B, generator=g)
    with torch.no_grad():
        ref, _ = token_logprobs(load_model(model_dir), ids, att, P, 1.0)
        ref = ref + 0.05 * torch.randn(B, T, generator=g)  # a reference that differs from the policy: KL term on
    lp, _ = token_logprobs(model, ids, att, P, 1.0)
    loss, _ = grpo_loss(lp, lp.detach(), ref, adv, mask, clip_eps=0.2, beta=0.04, aggregation="seq-mean-token-mean")
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    rec = {"state_dict": model.state_dict(), "inputs": {"advantages": adv}, "grads": grads}
    fd = _fd_check(model_dir, rec, grads, ids, att, P, mask, ref)
    assert fd["unit_directions"] and len(fd["directions"]) == 3
    assert fd["ours_max_rel_err"] <= 1e-3 and fd["trl_max_rel_err"] <= 1e-3, fd
    assert abs(fd["directions"][0]["fd"]) > 0  # along the gradient: the derivative is its norm

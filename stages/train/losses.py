"""Token-level language-modelling loss."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from stages.core.logprobs import IGNORE, lm_logprobs

__all__ = ["IGNORE", "lm_nll_sum", "token_nll_sum"]


def token_nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood and the number of scored tokens.

    ``logits``: (B, T, V), ``labels``: (B, T) aligned with the inputs (HF convention); position ``t`` predicts
    ``labels[:, t + 1]``; positions whose label is :data:`IGNORE` are not scored. Returns
    ``(sum_t -log p(labels[t+1] | x_<=t), n_tokens)``, both 0-dim; computed in fp32 whatever the logits'
    dtype. The training loss of a step is ``sum over its micro-batches of nll_sum / n_tokens(step)``: every
    target token of the step weighs the same (the paper does not say how it averages; this is the usual
    token-level mean, the same with or without packing and accumulation).
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    nll = F.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                          ignore_index=IGNORE, reduction="sum")
    return nll, (shift_labels != IGNORE).sum()


def lm_nll_sum(model: torch.nn.Module, labels: torch.Tensor, *, chunk_tokens: int | None = None, **forward_kw: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_nll_sum` of ``model(**forward_kw)`` without materialising its (B, T, V) logits: the head computes
    the targets' log-probs over chunks of ``chunk_tokens`` positions (stages.core.logprobs; positions with label
    :data:`IGNORE` are not computed). The same values and gradients as ``token_nll_sum(model(...).logits, labels)``
    to float rounding. ``chunk_tokens=0``: materialise the logits (the plain path, for comparison)."""
    targets = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE)], dim=1)
    _, logp, _ = lm_logprobs(model, targets, chunk_tokens=chunk_tokens, **forward_kw)
    return -logp.sum(), (labels[:, 1:] != IGNORE).sum()

"""Token-level language-modelling loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100
"""Label value of positions that carry no loss (prompt tokens, padding)."""


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

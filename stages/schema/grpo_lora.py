"""The ``grpo.lora`` group: LoRA for the RL policy (stages/rl/lora.py; TRL ``peft_config``, verl ``lora_rank``,
OpenRLHF ``lora.rank``, NeMo-RL ``lora_cfg``). Off by default: the paper trains every weight."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from stages.schema.base import PosFloat, PosInt, Section


class GrpoLoraParams(Section):
    """LoRA (Hu et al. 2021): each targeted linear map W of the policy is frozen and learns W + (alpha / rank) B A,
    B = 0 at the start; the frozen base is the KL's reference model (adapter disabled: no second copy), the sampler
    gets merged weights, and the stage saves the merged model plus the adapter (``adapter/``)."""

    enabled: bool = False
    """Train a LoRA adapter instead of every weight of the policy (and of the continued-SFT baseline, so both fit the
    same memory); false = full-parameter training (the paper)."""
    rank: PosInt = 16
    """r, the adapter's rank (TRL / peft ``r``; verl ``lora_rank``)."""
    alpha: PosFloat = 32.0
    """The update's scale is alpha / rank (peft ``lora_alpha``)."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Dropout on the adapter's input while the update trains (peft ``lora_dropout``); with dropout > 0 the update's
    forward differs from the no-dropout pi_old pass, so the ratio is no longer exactly 1 at mu = 1."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Names of the linear maps that get an adapter (a module whose name ends with one), e.g. q_proj, k_proj, v_proj,
    o_proj, gate_proj, up_proj, down_proj of a Llama / Qwen2 decoder; ["all-linear"] = every linear map but the
    output head (peft's shorthand)."""

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if not v or any(not t.strip() for t in v):
            raise ValueError("name at least one linear map (e.g. [q_proj, v_proj]) or ['all-linear']")
        if "all-linear" in v and len(v) > 1:
            raise ValueError("'all-linear' stands alone: it already names every linear map but the head")
        heads = sorted({"lm_head", "embed_tokens"} & set(v))
        if heads:
            raise ValueError(
                f"{heads[0]}: LoRA here adapts the decoder's linear maps, not the embedding or the "
                "output head (whose weights are tied in some models)"
            )
        return v


def check_lora(p: Any) -> str | None:
    """A one-line problem with ``grpo.lora`` in the grpo section ``p``, or None."""
    if p.lora.enabled and p.algorithm == "ppo":
        return (
            "lora.enabled with algorithm ppo: PPO's value model is a second full model trained with every weight; "
            "use lora with grpo / online_rft / rft / sft, or set lora.enabled false"
        )
    return None

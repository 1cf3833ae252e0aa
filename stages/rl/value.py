"""PPO's value model (DeepSeekMath paper section 4.1.1, Figure 4): the policy architecture with a scalar head per
token, trained alongside the policy; GRPO's point is to do without it.

The model is the reward model's class (``AutoModelForTokenClassification`` with one label, stages/rl/rm/model.py),
initialised from the model RL starts from (``grpo.ppo.value_init: policy``: its backbone, a new head) or from the
trained reward model (``reward_model``: backbone and head; the paper's PPO initialises it from the RM, as
InstructGPT does). V(s_t), the value of the state before completion token t (prompt + o_<t), is the head's output at
the position whose logits predict token t, so a rollout's (B, P + T) inputs give (B, T) values aligned with its
log-probs; the value after the last token is 0 (stages.rl.advantages.gae_advantages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from stages.core import paths
from stages.core.modeling import enable_checkpointing
from stages.rl.checkpoint import load_updaters
from stages.rl.rm.model import load_reward_model
from stages.rl.update import rl_updater
from stages.train.update import Updater


def value_model_from(policy: Any) -> Any:
    """A 1-label token-classification model with ``policy``'s backbone weights and a new scalar head (drawn from
    torch's RNG, as transformers initialises it)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    raw = {k: v for k, v in policy.config.to_dict().items() if k not in ("id2label", "label2id")}
    cfg = AutoConfig.for_model(**{**raw, "num_labels": 1, "classifier_dropout": 0.0})
    vm = AutoModelForTokenClassification.from_config(cfg, dtype=policy.dtype)  # the policy's dtype (bf16 or fp32)
    missing, unexpected = vm.base_model.load_state_dict(policy.base_model.state_dict(), strict=False)
    if unexpected or missing:
        raise ValueError(f"value model: the policy's backbone does not fit ({len(missing)} missing, "
                         f"{len(unexpected)} unexpected weights)")
    return vm


def init_value_model(policy: Any, value_init: str, reward_model_dir: Any = None) -> Any:
    """The value model for ``grpo.ppo.value_init``: ``policy`` (from the policy's weights) or ``reward_model`` (a copy
    of the reward model at ``reward_model_dir``)."""
    if value_init == "policy":
        return value_model_from(policy)
    if value_init == "reward_model":
        return load_reward_model(reward_model_dir, dtype=policy.dtype,
                                 attn_implementation=getattr(policy.config, "_attn_implementation", None))
    raise ValueError(f"value_init must be 'policy' or 'reward_model', got {value_init!r}")


def token_values(model: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
    """(B, T) V(s_t) of the T completion tokens of left-padded (B, P + T) inputs (with gradient when enabled):
    the head's output at positions P - 1 .. P + T - 2, position ids following the attention mask."""
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False).logits[..., 0]
    return out[:, prompt_len - 1:-1].float()


@dataclass
class Critic:
    """PPO's value model and its update path (one :class:`stages.train.update.Updater`, its own AdamW at
    ``grpo.ppo.value_lr``); ``clip``: the clipped value loss's range (None: plain squared error)."""

    model: Any
    updater: Updater
    clip: float | None

    def values(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, *, train: bool) -> Tensor:
        """(B, T) values of a batch on the value model's device (``train``: through the updater, with gradient)."""
        fwd = self.updater.forward_model if train else self.model
        dev = self.updater.device
        return token_values(fwd, input_ids.to(dev), attention_mask.to(dev), prompt_len)


def make_critic(policy: Any, p: Any, resume: dict[str, Any] | None = None) -> Critic:
    """PPO's value model (``grpo.ppo.value_init``, from ``policy`` or data/models/reward_model) and its updater (AdamW
    at ``grpo.ppo.value_lr``, the policy's update path); ``resume``: a checkpoint's state to load its optimizer from
    (a run restarted after an iteration: stages.rl.iterative)."""
    ppo = p.ppo
    vm = init_value_model(policy, ppo.value_init, paths.REWARD_MODEL)
    enable_checkpointing(vm, p.compute.gradient_checkpointing)
    critic = Critic(vm, rl_updater(vm, p, lr=ppo.value_lr), ppo.value_clip)
    if resume is not None:
        load_updaters(resume, {"critic": critic.updater})
    return critic

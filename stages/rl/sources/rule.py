"""The rule reward: the weighted rule / format / custom reward functions of ``grpo.reward`` (stages/rl/rewards.py),
outcome supervision; the only source that scores PoT outputs (by their program's answer) and TIR outputs."""

from stages.rl.registry import RewardSourceSpec

SOURCES = (
    RewardSourceSpec("rule", "the weighted reward functions of grpo.reward (answer correctness, format, custom)",
                     modes=("cot", "pot", "tir"), build="stages.rl.rewards:rule_source"),
)

"""The learned reward model (data/models/reward_model, the reward_model stage) as a reward: outcome_rm, the sigmoid
of its last-token score; process_rm, its score at every step end (paper 4.1.3), both behind the guards of
``grpo.reward.rm_guards`` (stages/rl/guards.py)."""

from stages.rl.registry import RewardSourceSpec

SOURCES = (
    RewardSourceSpec("outcome_rm", "the reward model's last-token score (sigmoid): outcome supervision",
                     reward_model=True, build="stages.rl.rm.source:outcome_rm_source"),
    RewardSourceSpec("process_rm", "the reward model's score at every step end: process supervision (paper 4.1.3)",
                     reward_model=True, supervision="process", build="stages.rl.rm.source:process_rm_source"),
)

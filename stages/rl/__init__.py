"""GRPO building blocks (paper section 4): advantages, the clipped surrogate loss, rollouts, rewards.

- :mod:`stages.rl.advantages`: outcome (group-normalised) and process-supervision advantages (pure).
- :mod:`stages.rl.losses`: ``grpo_loss`` with its aggregation modes and micro-batch normaliser (pure).
- :mod:`stages.rl.rewards`: rule / format / custom reward functions.
- :mod:`stages.rl.rollout`: sampling G outputs per question through ``stages.core.generation`` and
  teacher-forced log-probs of the training model.
"""

"""GRPO building blocks (paper section 4): advantages, the clipped surrogate loss, rollouts, rewards.

- :mod:`stages.rl.advantages`: outcome (group-normalised) and process-supervision advantages (pure).
- :mod:`stages.rl.losses`: ``grpo_loss`` with its aggregation modes and micro-batch normaliser (pure).
- :mod:`stages.rl.rewards`: rule / format / custom reward functions.
- :mod:`stages.rl.rollout`: rollout tensors from the generation interface's completions, teacher-forced
  log-probs of the training model, tool-output masking, train/rollout mismatch.
- :mod:`stages.rl.data`: the prompt JSONL schema and the per-step question order.
- :mod:`stages.rl.baseline`: the continued-SFT baseline.
- :mod:`stages.rl.checkpoint`: resumable GRPO state (layout of ``stages.train.checkpoint``).
- :mod:`stages.rl.paradigm`: the paper's unified paradigm (section 5.2.1): RFT / online RFT gradient
  coefficients, the weighted NLL loss, RFT's sample filter and offline pool (pure where maths is involved).
- :mod:`stages.rl.update`: the policy update, plain PyTorch or DeepSpeed ZeRO 0-2 on one or many ranks.

The stage itself (one GRPO step, the training loop, outputs) is :mod:`stages.grpo`.
"""

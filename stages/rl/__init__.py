"""RL building blocks (paper section 4; docs/rl.md). One step is five phases (stages/rl/step.py); what differs
between methods is a strategy object, an advantage estimator and a policy loss, each from one registry.

- :mod:`stages.rl.step`: the step: collect -> score -> targets -> log-probs -> update, typed phases, one timer.
- :mod:`stages.rl.algorithms`: the algorithms registry (sft, rft, online_rft, grpo, ppo), ``grpo.algorithm``.
- :mod:`stages.rl.advantages`: the estimator registry (grpo: outcome / process group-relative; gae: PPO) and the
  pure functions behind it, ``grpo.advantage.estimator``.
- :mod:`stages.rl.losses`: the policy-loss registry (clipped: eq. 1 / 3; nll: eq. 5), the aggregation modes and
  micro-batch normaliser, PPO's value loss (pure).
- :mod:`stages.rl.rewards`: the one reward interface (``Rewards``, ``RewardSource``) and the rule / format /
  custom reward functions; :mod:`stages.rl.reward_model`: the reward models, their data, and the RM and exact
  step-label reward sources.
- :mod:`stages.rl.value`: PPO's value model.
- :mod:`stages.rl.rollout`: rollout tensors from the generation interface's completions, teacher-forced
  log-probs, tool-output masking, train/rollout mismatch.
- :mod:`stages.rl.data`: the prompt JSONL schema and the per-step question order.
- :mod:`stages.rl.paradigm`: the paper's unified paradigm (section 5.2.1): RFT / online RFT gradient
  coefficients, RFT's sample filter and offline pool.
- :mod:`stages.rl.baseline`: the continued-SFT baseline. :mod:`stages.rl.iterative`: Algorithm 1.
- :mod:`stages.rl.checkpoint`: resumable state. :mod:`stages.rl.update`: the policy's (and value model's)
  :class:`stages.train.update.Updater` from the grpo params, idle-model offloading.

The stage itself (training loop, held-out curve, outputs) is :mod:`stages.grpo`.
"""

"""RL building blocks (paper section 4; docs/rl.md). The stage (stages/grpo.py) loads, runs the driver, saves.

- :mod:`stages.rl.run`: the driver: ``setup(p, model, tokenizer) -> StepContext``, ``train(ctx, first, last)`` (the
  loop), ``begin_iteration``, checkpoints, ``close``; ``train_sft`` for the sft algorithm; ``fit`` for tests.
- :mod:`stages.rl.iterative`: Algorithm 1 (iterations around ``train``; the reward model's updates).
- :mod:`stages.rl.step`: one step: collect -> score -> targets -> log-probs -> update, typed phases, one timer;
  :mod:`stages.rl.types`: the types the phases pass (StepContext, Batch, Targets, LogProbs).
- Four registries: :mod:`stages.rl.registry` declares algorithms, advantage estimators and policy losses with what
  each needs (torch-free), :mod:`stages.rl.sources` the reward sources (one module each, discovered);
  :mod:`stages.rl.needs` answers what a run needs. Implementations: :mod:`stages.rl.algorithms` (strategies: sft,
  rft, online_rft, grpo, ppo), :mod:`stages.rl.advantages` (grpo, gae, rloo), :mod:`stages.rl.losses` (clipped,
  nll; the aggregations, PPO's value loss), the sources' ``build`` functions (:mod:`stages.rl.rewards`,
  :mod:`stages.rl.rm.source`).
- :mod:`stages.rl.rewards`: the one reward interface (``Rewards``, ``RewardSource``) and the rule / format / custom
  reward functions; :mod:`stages.rl.guards`: reward-hacking guards of a reward-model reward.
- :mod:`stages.rl.rm`: the neural reward model, by concern (model, labels, train, metrics, source).
- :mod:`stages.rl.rollout`: the rollout generator, sampled outputs as tensors, teacher-forced log-probs,
  tool-output masking, train/rollout mismatch. :mod:`stages.rl.value`: PPO's value model.
- :mod:`stages.rl.heldout`: the held-out curve, scored by the evaluation stage's code.
- :mod:`stages.rl.metrics`: the per-step log line, completion tables, the stage summary, the plotted metrics.
- :mod:`stages.rl.data`: the prompt JSONL schema and the per-step question order.
- :mod:`stages.rl.paradigm`: the paper's unified paradigm (section 5.2.1): RFT / online RFT gradient
  coefficients, RFT's sample filter and offline pool. :mod:`stages.rl.baseline`: the continued-SFT baseline.
- :mod:`stages.rl.corrections`: rollout importance-sampling corrections (pure functions).
- :mod:`stages.rl.checkpoint`: resumable state. :mod:`stages.rl.update`: the policy's (and value model's)
  :class:`stages.train.update.Updater` from the grpo params, idle-model offloading.
"""

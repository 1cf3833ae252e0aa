"""RL building blocks (paper section 4; docs/rl.md). The stage (stages/grpo.py) loads, runs the loop, saves.

- :mod:`stages.rl.loop`: the RL loop, top to bottom: ``setup -> (RunSpec, Models, LoopState)``, ``begin_iteration``,
  ``train`` and ``run_step`` (draw questions -> sample -> reward -> advantages -> log-probs -> update), the departures
  from the paper; ``fit`` for tests. :mod:`stages.rl.types`: what it works with and what the phases pass.
- :mod:`stages.rl.iterative`: Algorithm 1 (iterations around ``train``; the reward model's updates).
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
  coefficients, RFT's sample filter and offline pool. :mod:`stages.rl.baseline`: the continued-SFT baseline (and the
  ``sft`` algorithm).
- Issues 31-32, wired into the step: :mod:`stages.rl.corrections` (rollout importance-sampling corrections),
  :mod:`stages.rl.recipes` (the loop's hooks, with :mod:`stages.rl.curriculum`, :mod:`stages.rl.dynamic_sampling`,
  :mod:`stages.rl.reward_shaping`), :mod:`stages.rl.sync` (the checked weight sync), :mod:`stages.rl.ledger` and
  :mod:`stages.rl.replay` (every step's rollouts, and a step re-run from them).
- :mod:`stages.rl.checkpoint`: resumable state. :mod:`stages.rl.update`: the policy's (and value model's)
  :class:`stages.train.update.Updater` from the grpo params, idle-model offloading, one optimizer step of the update.
"""

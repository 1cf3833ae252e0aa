"""The neural reward model for GRPO (DeepSeekMath paper sections 4.1.3-4.1.4), by concern:

- :mod:`stages.rl.rm.model`: the model (a scalar head per token over the policy's backbone), its files, its scores;
- :mod:`stages.rl.rm.labels`: training data from policy samples, outcome and step labels (values, Math-Shepherd);
- :mod:`stages.rl.rm.train`: training, resumable; the held-out split and the replay mix of iterative RL;
- :mod:`stages.rl.rm.metrics`: AUCs and best-of-n;
- :mod:`stages.rl.rm.source`: the RM (outcome / process) and the exact step labels as GRPO reward sources.

The reward_model stage (stages/reward_model.py) trains the first RM; iterative RL (stages/rl/iterative.py) trains it
further between iterations.
"""

"""The RL loop of the grpo stage, top to bottom: the step of GRPO (DeepSeekMath section 4.1) and of the paradigm's
other methods, as nanochat's ``chat_rl.py`` holds its loop in one file. Algorithm 1 (iterative RL, section 4.1.4;
stages/rl/iterative.py) runs :func:`begin_iteration` and :func:`train` once per iteration.

::

    setup                                 the policy's update path, the sampler, the rule rewards, the reward model
    begin_iteration                       pi_ref <- pi_theta; the reward source; rft's pool; PPO's value model; resume
    train: for each step                  run_step, then evaluate (held-out, validation), the divergence guard,
                                          log, checkpoint
        1. draw questions                 hook recipes.draw_questions: grpo.curriculum, else the seeded shuffle
        2. sample G outputs each          algorithm.collect (rft: its offline pool)
        3. reward them                    algorithm.score (the reward source); hook recipes.shape_rewards (overlong)
           filter groups                  hook recipes.filter_groups: grpo.dynamic_sampling (refill all-equal groups)
        4. advantages                     algorithm.targets: an estimator (stages/rl/advantages.py) or the
                                          gradient coefficients of the paradigm (stages/rl/paradigm.py)
        5. old and reference log-probs    logprobs (and PPO's values; its GAE: algorithm.finish_targets)
        6. mu x minibatch updates         update: the registered policy loss (stages/rl/losses.py), PPO's value
                                          loss; then the sampler takes the new weights (stages/rl/sync.py)

The strategies (sft, rft, online_rft, grpo, ppo) are stages/rl/algorithms.py; what the phases pass is
stages/rl/types.py (:class:`RunSpec` fixed for the run, :class:`Models` computed with, :class:`LoopState` carried).
The thread policy for a shared machine acts here only: the step's thread count from the load, held at the limit for
an update whose kernels round by thread count (stages/core/threads.py).

Departures from the paper (docs/results/rl.md has the measurements; each recipe below is off in params.yaml):

- advantages: eps = 1e-4 added to the group std, the unbiased std; an output whose reward is NaN (a reward function
  failed) is left out of its group and of the loss (stages/rl/advantages.py);
- the clip epsilon is 0.2 (the paper does not give it); log-probs at the sampling temperature, over the truncated
  distribution with top-k / top-p; a step whose loss or gradient norm is not finite is skipped and counted;
- RFT / online RFT normalise the SFT loss over the correct outputs, not all sampled ones (stages/rl/paradigm.py);
- PPO's value model starts from the policy unless ``ppo.value_init: reward_model`` (the paper's);
- a continued-SFT baseline on the same questions and steps (stages/rl/baseline.py) beside every run;
- not in the paper, selected by params: the rloo estimator, GSPO / CISPO losses, the entropy bonus, clip-higher and
  the token-level aggregations, the curriculum, dynamic sampling, the overlong penalty, rollout corrections, LoRA,
  reward-model guards (the divergence guard: :func:`watch_divergence`), pot / tir rollouts, the R1-Zero start.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from stages.core import threads
from stages.core.dist import all_reduce, is_main_process, world_size
from stages.core.errors import PipelineError
from stages.core.generation import resolve_backend
from stages.core.modeling import enable_checkpointing, frozen_copy, n_trainable, on_device
from stages.rl import lora, recipes
from stages.rl.algorithms import get_algorithm
from stages.rl.checkpoint import load_latest, load_state, load_updaters, save_checkpoint, save_state
from stages.rl.curriculum import PassRateCurriculum
from stages.rl.data import load_prompts
from stages.rl.guards import divergence
from stages.rl.metrics import (
    PhaseTimer,
    log_step,
    mean_finite,
    publish_samples,
    reward_metrics,
    rollout_metrics,
    run_logger,
    sample_table,
)
from stages.rl.needs import run_needs
from stages.rl.rewards import RewardSet
from stages.rl.rm.model import load_examples, load_reward_model
from stages.rl.rollout import Rollout, rollout_generator, rollout_modes, token_logprobs, trim, truncation
from stages.rl.sources import REWARD_SOURCES, SourceInputs
from stages.rl.sync import sync_policy
from stages.rl.types import Batch, LogProbs, LoopState, Models, Row, RunSpec, Targets
from stages.rl.update import UpdateSums, minibatch_step, rl_updater, update_adapts
from stages.rl.value import make_critic
from stages.train.update import micro_slices


def setup(p: Any, model: Any, tokenizer: Any, *, rows: list[Row] | None = None, rm_dir: str | Path | None = None,
          generator: Any = None, updater: Any = None, **reporters: Any) -> tuple[RunSpec, Models, LoopState]:
    """The run of ``p.algorithm`` (a sampling one) on ``model`` (trained in place): the update path (DeepSpeed when
    ``p.deepspeed.enabled`` or launched with several ranks; built first, so that a vLLM engine joins its process
    group), the rollout generator, the rule reward functions, the reward model when the source scores with it (from
    ``rm_dir``), the sandbox threads of pot / tir rollouts, the curriculum. ``rows``: the prompt rows (default:
    ``p.prompts_file``); ``generator`` / ``updater``: use these (tests and benchmarks: a scripted generator, a plain
    optimizer through stages.rl.update.as_updater); ``reporters``: RunSpec's heldout, validation, tracker, ledger,
    on_step."""
    algo = get_algorithm(p.algorithm)
    if not algo.samples:
        raise ValueError(f"algorithm {p.algorithm} has no sampling loop; see stages.rl.baseline.train_sft")
    if world_size() > p.questions_per_step:
        raise PipelineError(f"grpo.questions_per_step: {p.questions_per_step} is below the {world_size()} ranks; each "
                            "rank samples its share of a step's questions, so give at least one per rank")
    rows = load_prompts(p.prompts_file) if rows is None else rows
    run = RunSpec(p, rows, algo, p.steps * p.iterative.iterations, **reporters)
    model = lora.attach(model, p.lora, p.seed)  # grpo.lora: the adapter trains, the base is pi_ref
    enable_checkpointing(model, p.compute.gradient_checkpointing)
    upd = rl_updater(model, p) if updater is None else updater
    if generator is None:  # sized for the prompts, the held-out and the validation problems (vLLM's context)
        h, v = run.heldout, run.validation
        questions = [r["question"] for r in rows + (v.rows if v else []) + (h.rows if h else [])]
        gen_len = max(p.rollout.max_new_tokens, h.max_new_tokens if h else 0,
                      p.validation.max_new_tokens if p.validation.size else 0)
        bf16 = upd.bf16 or upd.autocast_bf16
        generator = lora.merged_sampler(model, lambda m: rollout_generator(p, m, tokenizer, questions, gen_len, bf16=bf16),
                                        resolve_backend(p.rollout.backend), bf16=bf16)
    models = Models(model, tokenizer, upd, generator, algo.reward_functions(p), offload=p.compute.offload_idle_models)
    if rollout_modes(p) != ("cot",):
        models.sandbox = ThreadPoolExecutor(max_workers=p.rollout.exec_workers, thread_name_prefix="sandbox")
    state = LoopState()
    if p.curriculum.enabled:
        if p.questions_per_step > len(rows):
            raise PipelineError(f"grpo.curriculum: questions_per_step ({p.questions_per_step}) is above the "
                                f"{len(rows)} prompts; the curriculum draws a step's questions without replacement")
        state.curriculum = PassRateCurriculum.from_params(p.curriculum, len(rows), p.seed)
    if run_needs(p).scoring_model:
        if rm_dir is None:
            raise ValueError(f"grpo.reward.source {p.reward.source} scores with the reward model: pass its rm_dir")
        models.reward_model = load_reward_model(rm_dir, device="cpu" if models.offload else upd.device,
                                                attn_implementation=p.compute.attn_implementation)
        models.rm_examples = load_examples(rm_dir)
    state.info = {"resumed_from_step": None, "generation_backend": resolve_backend(p.rollout.backend),
                  "deepspeed_zero_stage": upd.zero_stage if upd.distributed else None, "world_size": upd.world,
                  "trained_parameters": {"policy": n_trainable(model)}, "rollout_modes": list(rollout_modes(p))}
    if lora.has_lora(model):
        state.info["lora"] = lora.summary(model, p.lora)
    return run, models, state


def begin_iteration(run: RunSpec, models: Models, state: LoopState, iteration: int, ckpt_dir: Path | None) -> None:
    """Start iteration ``iteration`` of Algorithm 1 (1: the run's start) on the policy as it is now: pi_ref <- the
    policy, a fresh optimizer (after the first), the reward source on the current reward model, rft's pool (drawn
    once, from the start model), PPO's value model (kept across iterations); then resume from ``ckpt_dir`` when it
    holds a checkpoint, and sync the sampler."""
    p, algo, model = run.p, run.algorithm, models.policy
    state.iteration, state.ckpt_dir = iteration, ckpt_dir
    if iteration > 1:
        if lora.has_lora(model):  # the adapter into the base: disabled, it is the policy (pi_ref <- pi_theta)
            lora.fold(model, p.seed * 104729 + iteration)
        enable_checkpointing(model, p.compute.gradient_checkpointing)
        models.updater = rl_updater(model, p)
    models.reference = None
    if algo.uses_reference(p) and lora.has_lora(model):
        models.reference = lora.reference(model)  # the frozen base: the policy with its adapter disabled
    elif algo.uses_reference(p):
        models.reference = frozen_copy(model, "cpu" if models.offload else None)
        if models.updater.bf16:
            models.reference.to(torch.bfloat16)
        if not models.offload:
            models.reference.to(models.device)
    models.scorer = build_scorer(p.reward.source, SourceInputs(p, models.tokenizer, models.reward_set,
                                                               models.reward_model, models.rm_examples))
    if models.reward_model is not None:
        models.reward_model.to("cpu" if models.offload else models.device)
    if models.pool is None:
        t0 = time.perf_counter()
        models.pool = algo.offline_pool(model, models.generator, run.rows, p, run.total_steps)
        if models.pool is not None:
            state.info["rft_pool_s"] = round(time.perf_counter() - t0, 2)
    if models.pool is not None:
        state.info["rft_pool"] = models.pool.summary()
    if algo.spec.critic and models.critic is None:
        models.critic, state.resumed = make_critic(model, p, state.resumed), None
    if models.critic is not None:
        state.info["trained_parameters"]["value_model"] = n_trainable(models.critic.model)
    load_state(run, models, state, ckpt_dir)
    model.eval()
    state.info.update(sync_policy(run, models, state.step))  # checked on the probe (stages/rl/sync.py)


def build_scorer(name: str, inputs: SourceInputs) -> Any:
    """The scorer of the registered reward source ``name``: its spec's ``build(inputs)``, or for a source declared by
    a per-output ``score`` function, a rule-style RewardSet of that one function at weight 1 (a raise or a
    non-finite value excludes the output)."""
    spec = REWARD_SOURCES.spec(name)
    if spec.score is not None:
        return RewardSet([(spec.name, spec.score, 1.0)])
    module, _, attr = str(spec.build).partition(":")
    return getattr(importlib.import_module(module), attr)(inputs)


def train(run: RunSpec, models: Models, state: LoopState, first: int, last: int) -> list[Row]:
    """Steps ``first`` .. ``last`` - 1 (global step numbers; a resumed run starts after its checkpoint); returns the
    run's metric rows."""
    p, start, logger = run.p, max(first, state.step), run_logger()
    if start == first == 0:
        evaluate(run, models, state, 0, last, None, logger)
    for step in range(start, last):
        threads.step()  # the torch thread count for this step, from the machine's load (stages/core/threads.py)
        row, ro, rewards = run_step(run, models, state, step)
        row["iteration"] = state.iteration
        done = step + 1
        evaluate(run, models, state, done, last, row, logger)
        state.history.append(row)
        stop = watch_divergence(run, models, state, row)
        if run.tracker is not None and is_main_process():
            run.tracker.log(row, state.history)
        log_step(logger, run.algorithm.name, done, last, row, n_outputs=len(ro.texts) if ro is not None else 0)
        if ro is not None and p.log_completions_every and step % p.log_completions_every == 0:
            table = sample_table(step, ro, rewards)
            state.samples.extend(table)
            publish_samples(step, table)
        if run.on_step is not None:
            run.on_step(row)
        state.step = done
        if stop:
            state.stopped = True
            break
        if state.ckpt_dir is not None and p.checkpoint_every and done % p.checkpoint_every == 0 and done < last:
            save_state(run, models, state)
    return state.history


def evaluate(run: RunSpec, models: Models, state: LoopState, done: int, total: int, row: Row | None,
             logger: Any) -> None:
    """The held-out and the validation evaluations after ``done`` steps, each when due (rank 0); their accuracies
    go into ``row`` (None: before the first step, logged)."""
    for name, ev, extra in (("heldout", run.heldout, ()), ("validation", run.validation, (models.policy,
                                                                                             state.iteration))):
        if ev is None or not is_main_process() or not ev.due(done, total):
            continue
        acc = ev.evaluate(done, models.generator, *extra)
        if row is not None:
            row[f"{name}_accuracy"] = acc
        else:
            logger.info("%s accuracy before step 1: %.3f", name, acc)


def watch_divergence(run: RunSpec, models: Models, state: LoopState, row: Row) -> bool:
    """The divergence guard (``grpo.reward.rm_guards.divergence``) after step ``row``: the criterion
    (stages.rl.guards.divergence) on the RM reward (``rm_raw_mean``, before the reshaping guards, else
    ``reward_mean``) and ``accuracy`` of this iteration's rows since the last revert. A step that ends the best
    window saves the policy's (and PPO's value model's) update state (``ckpt_dir/divergence``, else a temporary
    directory); a divergence restores it, when the saved one is that window's, and records the event in
    ``state.info["rm_divergence"]``. Sets ``row["rm_divergence"]``; returns True when the run stops."""
    cfg = run.p.reward.rm_guards.divergence
    if cfg.action == "none":
        return False
    rows = [r for r in state.history if r.get("iteration") == state.iteration]
    rows = rows[max((i + 1 for i, r in enumerate(rows) if r.get("rm_divergence")), default=0):]
    best, fired = divergence([r.get("rm_raw_mean", r["reward_mean"]) for r in rows], [r["accuracy"] for r in rows],
                             cfg.window, cfg.drop)
    fired = all_reduce([float(fired)])[0] > 0  # rm_raw_mean is this rank's: every rank acts alike
    row["rm_divergence"] = float(fired)
    if state.ckpt_dir is None and state.scratch is None:
        if world_size() > 1:
            raise PipelineError("grpo.reward.rm_guards.divergence on several ranks needs the stage's checkpoint "
                                "directory (a path every rank sees)")
        state.scratch = tempfile.TemporaryDirectory(prefix="grpo-divergence-")
    root = Path(state.ckpt_dir if state.ckpt_dir is not None else state.scratch.name) / "divergence"
    updaters = {"policy": models.updater, **({"critic": models.critic.updater} if models.critic is not None else {})}
    if best is None or not fired:
        if best is not None and rows[best] is row:
            save_checkpoint(root, updaters=updaters, step=row["step"], history=[])
        return False
    saved = load_latest(root)
    restored = saved is not None and saved["step"] == rows[best]["step"]
    if restored:
        load_updaters(saved, updaters)
        sync_policy(run, models, row["step"] + 1)
    event = {"step": row["step"], "action": cfg.action, "best_step": rows[best]["step"], "restored": restored,
             "accuracy_best_window": mean_finite([r["accuracy"] for r in rows[best - cfg.window + 1:best + 1]]),
             "accuracy_window": mean_finite([r["accuracy"] for r in rows[-cfg.window:]])}
    state.info.setdefault("rm_divergence", []).append(event)
    run_logger().warning("rm_guards.divergence at step %d: windowed accuracy %.3f, best %.3f (step %d); %s%s",
                         row["step"] + 1, event["accuracy_window"], event["accuracy_best_window"], event["best_step"] + 1,
                         cfg.action, " to the best window's state" if restored else " (its state was not saved)")
    return cfg.action == "stop"


def run_step(run: RunSpec, models: Models, state: LoopState, step: int) -> tuple[Row, Rollout | None, torch.Tensor]:
    """One step of ``run.algorithm`` in the paper's order (module docstring); returns (metrics row, rollout, the
    (Q, G) per-output rewards; (N, 1) for rft's kept samples). The rollout is None when rft kept nothing."""
    p, algo, timer, upd = run.p, run.algorithm, PhaseTimer(), models.updater
    row: Row = {"step": step}
    if run.ledger is not None:
        run.ledger.begin(models.policy)  # the rollout ledger: the weights that sample this step (stages/rl/ledger.py)
    questions, recipe_metrics = recipes.draw_questions(run, state.curriculum, step)  # 1. every rank's questions
    mine = questions[upd.rank :: upd.world]
    with timer("generation"):
        batch = Batch(step, mine, algo.collect(run, models, step, mine))  # 2. G outputs per question
    with timer("scoring"):
        rewards = recipes.shape_rewards(p, batch, algo.score(run, models, batch))  # 3. rewards
    rounds = [(questions, batch, rewards)]
    if p.dynamic_sampling.enabled:
        batch, rewards = recipes.filter_groups(run, models, state.curriculum, step, timer, rounds, recipe_metrics)
    if state.curriculum is not None:
        recipes.observe(state.curriculum, models, rounds)
    with timer("scoring"):
        tg = algo.targets(run, models, batch, rewards)  # 4. advantages (or gradient coefficients) and the loss mask
    with timer("logprobs"):
        lp = logprobs(run, models, batch, tg)  # 5. pi_old, pi_ref (and PPO's values)
        tg = algo.finish_targets(p, batch, rewards, tg, lp)
    with timer("scoring"):
        row.update(reward_metrics(tg.stats, batch.rollout), **rewards.metrics, **(tg.metrics or {}))
        row.update(rollout_metrics(batch.rollout, rewards), **recipe_metrics)
    hold = not update_adapts(upd, *([models.critic.updater] if models.critic is not None else []))
    with timer("update"), threads.held(hold):  # float32 under strict MKL follows the load, else the thread limit
        row.update(update(run, models, batch, tg, lp))  # 6. mu x minibatch optimizer steps
    row["n_train_outputs"] = int(all_reduce([float(tg.train_rows.numel())])[0])
    if run.ledger is not None:
        run.ledger.record(models, state.iteration, batch, rewards, tg, lp, row)
    row.update(timer.totals())
    return row, batch.rollout, tg.rewards


def logprobs(run: RunSpec, models: Models, batch: Batch, tg: Targets) -> LogProbs:
    """pi_old (when the algorithm needs its own pass), pi_ref and the values of the outputs that train (no grad)."""
    p, ro, dev, rows = run.p, batch.rollout, models.device, tg.train_rows
    zeros = torch.zeros_like(tg.loss_mask)
    out = LogProbs(zeros.clone() if run.algorithm.needs_old_logprobs(p) else None,
                   zeros.clone() if models.reference is not None else None,
                   zeros.clone() if models.critic is not None else None)
    if ro is None or not rows.numel() or (out.old is None and out.ref is None and out.values is None):
        return out
    kw = dict(share_prompts=p.compute.share_prompt_prefix, chunk_tokens=p.compute.logprob_chunk_tokens,
              **truncation(p))
    with torch.no_grad(), on_device(models.reference, dev, models.offload), models.updater.autocast():
        for sl in micro_slices(rows, p.optim.micro_batch_size):
            ids, att, t = trim(ro, sl)
            if out.old is not None:
                lp, _ = token_logprobs(models.policy, ids.to(dev), att.to(dev), ro.prompt_len, p.rollout.temperature,
                                       **kw)
                out.old[sl, :t] = lp.cpu()
            if out.ref is not None:
                rdev = next(models.reference.parameters()).device
                rlp, _ = token_logprobs(models.reference, ids.to(rdev), att.to(rdev), ro.prompt_len,
                                        p.rollout.temperature, **kw)
                out.ref[sl, :t] = rlp.float().cpu()
            if out.values is not None:
                out.values[sl, :t] = models.critic.values(ids, att, ro.prompt_len, train=False).cpu()
    return out


def update(run: RunSpec, models: Models, batch: Batch, tg: Targets, lp: LogProbs) -> dict[str, Any]:
    """``mu`` passes over the outputs that train, each split into ``minibatches`` optimizer steps
    (stages.rl.update.minibatch_step: micro-batches with batch-wide loss normalisers); the first pass in sampling
    order with one minibatch, else a seeded shuffle. Then the sampler takes the new weights, checked on the probe."""
    p, critic, rows = run.p, models.critic, tg.train_rows
    sums = UpdateSums(torch.zeros_like(tg.loss_mask))
    models.policy.train()
    if critic is not None:
        critic.model.train()
    gen = torch.Generator().manual_seed(p.seed * 7919 + batch.step)
    for it in range(p.optim.mu):
        order = rows[torch.randperm(rows.numel(), generator=gen)] if it or p.optim.minibatches > 1 else rows
        for mb in order.tensor_split(p.optim.minibatches):
            minibatch_step(run, models, batch, tg, lp, it, mb, sums)
    models.policy.eval()
    m = sums.loss_metrics(run, critic is not None)
    m.update(sync_policy(run, models, batch.step + 1))
    m.update(sums.step_metrics(p, batch, tg, critic is not None))
    return m


def close(run: RunSpec, models: Models, state: LoopState) -> None:
    """Release what the run holds besides the models: the vLLM engine, the sandbox threads."""
    wake = getattr(models.generator, "wake_up", None)
    if callable(wake):
        wake()
    if resolve_backend(run.p.rollout.backend) == "vllm" and callable(getattr(models.generator, "close", None)):
        models.generator.close()
    if models.sandbox is not None:
        models.sandbox.shutdown(wait=True)
    state.info["reward_failures_by_fn"] = dict(models.reward_set.failures)


def fit(p: Any, model: Any, tokenizer: Any, *, rows: list[Row] | None = None, ckpt_dir: Path | None = None,
        **kw: Any) -> tuple[RunSpec, Models, LoopState]:
    """:func:`setup`, one iteration of ``p.steps`` steps (:func:`begin_iteration`, :func:`train`) and :func:`close`:
    RL on ``model`` in place without Algorithm 1's per-iteration outputs (tests and benchmarks call it; ``kw`` goes
    to setup). The state's ``history``, ``samples`` and ``info`` hold the run's rows and facts."""
    run, models, state = setup(p, model, tokenizer, rows=rows, **kw)
    try:
        begin_iteration(run, models, state, 1, ckpt_dir)
        train(run, models, state, 0, p.steps)
    finally:
        close(run, models, state)
    return run, models, state

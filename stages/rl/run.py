"""The RL driver: a run of any algorithm of stages/rl/algorithms.py on the policy, from setup to the last step.

::

    ctx = setup(p, model, tokenizer)   # everything the steps work with: a StepContext (stages/rl/types.py)
    train(ctx, first, last)            # steps first .. last - 1, the loop below
    close(ctx)

:func:`train` is the whole loop, as nanochat's ``chat_rl.py``: per step, :func:`stages.rl.step.run_step` (collect ->
score -> targets -> log-probs -> update), the held-out evaluation when due, a log line, a completions table, a
checkpoint when due. Iterative RL (Algorithm 1, stages/rl/iterative.py) calls :func:`begin_iteration` and
:func:`train` once per iteration (one iteration is plain RL); the stage (stages/grpo.py) runs setup -> Algorithm 1 ->
close, or :func:`train_sft` for ``sft`` (no sampling loop). What a run needs besides the policy (a reference model, the reward
model, a value model) comes from stages/rl/needs.py, which asks the registries' specs.

Resuming: ``ckpt_dir`` (a run directory of stages/rl/checkpoint.py) holds the policy's (and PPO's value model's)
update state, the metric and completion rows, the held-out records, the reward guards' statistics and the
curriculum's pass rates every ``checkpoint_every`` steps; a restarted run continues after the last one.
"""

from __future__ import annotations

import importlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from stages.core import threads
from stages.core.dist import is_main_process, train_device, world_size
from stages.core.errors import PipelineError
from stages.core.generation import resolve_backend
from stages.core.modeling import enable_checkpointing, frozen_copy, n_trainable
from stages.rl import lora
from stages.rl.algorithms import get_algorithm
from stages.rl.baseline import continued_sft
from stages.rl.checkpoint import load_latest, load_updaters, save_checkpoint
from stages.rl.curriculum import PassRateCurriculum
from stages.rl.data import load_prompts
from stages.rl.heldout import HeldoutEval
from stages.rl.metrics import log_step, publish_samples, run_logger, sample_table
from stages.rl.needs import run_needs
from stages.rl.rewards import RewardSet
from stages.rl.rm.model import load_examples, load_reward_model
from stages.rl.rollout import rollout_generator, rollout_modes
from stages.rl.sources import REWARD_SOURCES, SourceInputs
from stages.rl.step import run_step
from stages.rl.sync import sync_policy
from stages.rl.types import StepContext
from stages.rl.update import rl_updater
from stages.train.update import Updater

Rows = list[dict[str, Any]]


def setup(p: Any, model: Any, tokenizer: Any, *, rows: Rows | None = None, heldout: HeldoutEval | None = None,
          rm_dir: str | Path | None = None, cache: dict[str, Any] | None = None, on_step: Any = None,
          generator: Any = None, updater: Updater | None = None, validation: Any = None,
          tracker: Any = None) -> StepContext:
    """The context of a run of ``p.algorithm`` (a sampling one) on ``model`` (trained in place): the update path
    (DeepSpeed when ``p.deepspeed.enabled`` or launched with several ranks; built first, so that a vLLM engine joins
    its process group), the rollout generator, the rule reward functions, the reward model when the reward source
    scores with it (from ``rm_dir``), the sandbox threads of pot / tir rollouts. The reference model, the reward
    source, PPO's value model, rft's pool and a resumed state come with :func:`begin_iteration`. ``rows``: the prompt
    rows (default: ``p.prompts_file``); ``cache``: what later calls continue with (rft's pool, PPO's value model);
    ``generator`` / ``updater``: use these instead of building them (tests and benchmarks: a scripted generator, a
    plain optimizer through stages.rl.update.as_updater); ``validation`` (stages.rl.validation.Validation) /
    ``tracker`` (stages.rl.tracking.StepLog): the validation split's evaluations, the per-step dvclive log."""
    algo = get_algorithm(p.algorithm)
    if not algo.samples:
        raise ValueError(f"algorithm {p.algorithm} has no sampling loop; see stages.rl.run.train_sft")
    if world_size() > p.questions_per_step:
        raise PipelineError(f"grpo.questions_per_step: {p.questions_per_step} is below the {world_size()} ranks; each "
                            "rank samples its share of a step's questions, so give at least one per rank")
    rows = load_prompts(p.prompts_file) if rows is None else rows
    model = lora.attach(model, p.lora, p.seed)  # grpo.lora: the adapter trains, the base is pi_ref
    enable_checkpointing(model, p.compute.gradient_checkpointing)
    upd = rl_updater(model, p) if updater is None else updater
    if generator is None:
        generator = _generator(p, model, tokenizer, rows + (validation.rows if validation else []), heldout, upd)
    ctx = StepContext(p=p, model=model, tokenizer=tokenizer, generator=generator,
                      updater=upd, rows=rows, algorithm=algo, reward_set=algo.reward_functions(p),
                      offload=p.compute.offload_idle_models, heldout=heldout, on_step=on_step,
                      total_steps=p.steps * p.iterative.iterations, cache={} if cache is None else cache,
                      validation=validation, tracker=tracker)
    ctx.sandbox_pool = ThreadPoolExecutor(max_workers=p.rollout.exec_workers, thread_name_prefix="sandbox") \
        if rollout_modes(p) != ("cot",) else None
    if p.curriculum.enabled:
        if p.questions_per_step > len(rows):
            raise PipelineError(f"grpo.curriculum: questions_per_step ({p.questions_per_step}) is above the "
                                f"{len(rows)} prompts; the curriculum draws a step's questions without replacement")
        ctx.curriculum = PassRateCurriculum.from_params(p.curriculum, len(rows), p.seed)
    if run_needs(p).scoring_model:
        if rm_dir is None:
            raise ValueError(f"grpo.reward.source {p.reward.source} scores with the reward model: pass its rm_dir")
        ctx.reward_model = load_reward_model(rm_dir, device="cpu" if ctx.offload else train_device(),
                                             attn_implementation=p.compute.attn_implementation)
        ctx.rm_examples = load_examples(rm_dir)
    ctx.info = {"resumed_from_step": None, "generation_backend": resolve_backend(p.rollout.backend),
                "deepspeed_zero_stage": upd.zero_stage if upd.distributed else None, "world_size": upd.world,
                "trained_parameters": {"policy": n_trainable(model)}, "rollout_modes": list(rollout_modes(p))}
    if lora.has_lora(model):
        ctx.info["lora"] = lora.summary(model, p.lora)
    return ctx


def _generator(p: Any, model: Any, tokenizer: Any, rows: Rows, heldout: HeldoutEval | None, upd: Any) -> Any:
    """The rollout generator, sized for the prompts and the held-out problems (vLLM's context)."""
    questions = [r["question"] for r in rows] + ([r["question"] for r in heldout.rows] if heldout else [])
    gen_len = max(p.rollout.max_new_tokens, heldout.max_new_tokens if heldout else 0,
                  p.validation.max_new_tokens if p.validation.size else 0)
    bf16 = upd.bf16 or upd.autocast_bf16
    return lora.merged_sampler(model, lambda m: rollout_generator(p, m, tokenizer, questions, gen_len, bf16=bf16),
                               resolve_backend(p.rollout.backend), bf16=bf16)


def begin_iteration(ctx: StepContext, iteration: int, ckpt_dir: Path | None) -> None:
    """Start iteration ``iteration`` of Algorithm 1 (1: the run's start) on the policy as it is now: pi_ref <- the
    policy, a fresh optimizer (after the first), the reward source on the current reward model, rft's pool (drawn
    once, from the start model), PPO's value model; then resume from ``ckpt_dir`` when it holds a checkpoint."""
    p, algo, model = ctx.p, ctx.algorithm, ctx.model
    ctx.iteration, ctx.ckpt_dir = iteration, ckpt_dir
    if iteration > 1:
        if lora.has_lora(model):  # the adapter into the base: disabled, it is the policy (pi_ref <- pi_theta)
            lora.fold(model, p.seed * 104729 + iteration)
        enable_checkpointing(model, p.compute.gradient_checkpointing)
        ctx.updater = rl_updater(model, p)
    ctx.ref_model = None
    if algo.uses_reference(p) and lora.has_lora(model):
        ctx.ref_model = lora.reference(model)  # the frozen base: the policy with its adapter disabled
    elif algo.uses_reference(p):
        ctx.ref_model = frozen_copy(model, "cpu" if ctx.offload else None)
        if ctx.updater.bf16:
            ctx.ref_model.to(torch.bfloat16)
        if not ctx.offload:
            ctx.ref_model.to(ctx.device)
    ctx.source = build_source(p.reward.source, SourceInputs(p, ctx.tokenizer, ctx.reward_set, ctx.reward_model,
                                                            ctx.rm_examples))
    if ctx.reward_model is not None:
        ctx.reward_model.to("cpu" if ctx.offload else ctx.device)
    if ctx.pool is None and ctx.cache.get("pool") is None:
        t0 = time.perf_counter()
        ctx.cache["pool"] = algo.offline_pool(model, ctx.generator, ctx.rows, p, ctx.total_steps)
        if ctx.cache["pool"] is not None:
            ctx.info["rft_pool_s"] = round(time.perf_counter() - t0, 2)
    ctx.pool = ctx.cache.get("pool")
    if ctx.pool is not None:
        ctx.info["rft_pool"] = ctx.pool.summary()
    ctx.critic = algo.make_critic(ctx, ctx.cache)
    if ctx.critic is not None:
        ctx.info["trained_parameters"]["value_model"] = n_trainable(ctx.critic.model)
    resume(ctx, ckpt_dir)
    model.eval()
    ctx.info.update(sync_policy(ctx, ctx.step))  # checked on the probe (stages/rl/sync.py)


def build_source(name: str, inputs: SourceInputs) -> Any:
    """The scorer of the registered reward source ``name``: its spec's ``build(inputs)``, or for a source declared by
    a per-output ``score`` function, a rule-style RewardSet of that one function at weight 1 (a raise or a
    non-finite value excludes the output)."""
    spec = REWARD_SOURCES.spec(name)
    if spec.score is not None:
        return RewardSet([(spec.name, spec.score, 1.0)])
    module, _, attr = str(spec.build).partition(":")
    return getattr(importlib.import_module(module), attr)(inputs)


def train(ctx: StepContext, first: int, last: int) -> Rows:
    """Steps ``first`` .. ``last`` - 1 (global step numbers; a resumed run starts after its checkpoint); returns the
    run's metric rows."""
    start, logger = max(first, ctx.step), run_logger()
    if start == first == 0:
        _heldout(ctx, 0, last, None, logger)
        _validate(ctx, 0, last, None, logger)
    for step in range(start, last):
        threads.step()  # the torch thread count for this step, from the machine's load (stages/core/threads.py)
        row, ro, rewards = run_step(step, ctx)
        row["iteration"] = ctx.iteration
        done = step + 1
        _heldout(ctx, done, last, row, logger)
        _validate(ctx, done, last, row, logger)
        ctx.history.append(row)
        if ctx.tracker is not None and is_main_process():
            ctx.tracker.log(row, ctx.history)
        log_step(logger, ctx.algorithm.name, done, last, row, n_outputs=len(ro.texts) if ro is not None else 0)
        every = ctx.p.log_completions_every
        if ro is not None and every and step % every == 0:
            table = sample_table(step, ro, rewards)
            ctx.samples.extend(table)
            publish_samples(step, table)
        if ctx.on_step is not None:
            ctx.on_step(row)
        ctx.step = done
        if ctx.ckpt_dir is not None and ctx.p.checkpoint_every and done % ctx.p.checkpoint_every == 0 and done < last:
            checkpoint(ctx)
    return ctx.history


def _heldout(ctx: StepContext, done: int, total: int, row: dict[str, Any] | None, logger: Any) -> None:
    """The held-out evaluation after ``done`` steps, when due (rank 0); its accuracy goes into ``row``."""
    h = ctx.heldout
    if h is None or not is_main_process() or not h.due(done, total):
        return
    acc = h.evaluate(done, ctx.generator)
    if row is not None:
        row["heldout_accuracy"] = acc
    else:
        logger.info("held-out accuracy before step 1: %.3f", acc)


def _validate(ctx: StepContext, done: int, total: int, row: dict[str, Any] | None, logger: Any) -> None:
    """The validation split's evaluation after ``done`` steps, when due (rank 0); its accuracy goes into ``row``."""
    v = ctx.validation
    if v is None or not is_main_process() or not v.due(done, total):
        return
    acc = v.evaluate(done, ctx.generator, ctx.model, ctx.iteration)
    if row is not None:
        row["validation_accuracy"] = acc
    else:
        logger.info("validation accuracy before step 1: %.3f", acc)


def checkpoint(ctx: StepContext) -> None:
    """Save the run's state after ``ctx.step`` steps in ``ctx.ckpt_dir`` (every rank)."""
    assert ctx.ckpt_dir is not None
    updaters = {"policy": ctx.updater, **({"critic": ctx.critic.updater} if ctx.critic is not None else {})}
    extra: dict[str, Any] = {"samples": ctx.samples, "heldout": ctx.heldout.records if ctx.heldout else [],
                             "validation": ctx.validation.state_dict() if ctx.validation is not None else None}
    if hasattr(ctx.source, "state_dict"):
        extra["reward_source"] = ctx.source.state_dict()  # the guards' running statistics
    if ctx.curriculum is not None:
        extra["curriculum"] = ctx.curriculum.state_dict()  # the pass rates: the next steps' questions
    save_checkpoint(ctx.ckpt_dir, updaters=updaters, step=ctx.step, history=ctx.history, extra=extra)


def resume(ctx: StepContext, ckpt_dir: Path | None) -> None:
    """Load the latest checkpoint of ``ckpt_dir`` into ``ctx`` (update state, rows, held-out records, the reward
    guards' statistics), if there is one."""
    state = load_latest(ckpt_dir) if ckpt_dir is not None else None
    if state is None:
        return
    load_updaters(state, {"policy": ctx.updater, **({"critic": ctx.critic.updater}
                                                     if ctx.critic is not None and "critic" in state.get("updaters", [])
                                                     else {})})
    ctx.step, ctx.history = state["step"], state["history"]
    ctx.samples = state["extra"].get("samples", [])
    if ctx.heldout is not None:
        ctx.heldout.records = list(state["extra"].get("heldout", ctx.heldout.records))
    if ctx.validation is not None and state["extra"].get("validation") is not None:
        ctx.validation.load_state_dict(state["extra"]["validation"])
    if state["extra"].get("reward_source") is not None and hasattr(ctx.source, "load_state_dict"):
        ctx.source.load_state_dict(state["extra"]["reward_source"])
    if ctx.curriculum is not None and state["extra"].get("curriculum") is not None:
        ctx.curriculum.load_state_dict(state["extra"]["curriculum"])
    ctx.info["resumed_from_step"] = ctx.step


def close(ctx: StepContext) -> None:
    """Release what the run holds besides the models: the vLLM engine, the sandbox threads."""
    _call(ctx.generator, "wake_up")
    if resolve_backend(ctx.p.rollout.backend) == "vllm":
        _call(ctx.generator, "close")
    if ctx.sandbox_pool is not None:
        ctx.sandbox_pool.shutdown(wait=True)
    ctx.info["reward_failures_by_fn"] = dict(ctx.reward_set.failures)


def train_sft(model: Any, tokenizer: Any, rows: Rows, p: Any, *, heldout: HeldoutEval | None = None
              ) -> tuple[Rows, Rows, dict[str, Any]]:
    """algorithm sft: the continued SFT of stages.rl.baseline on the rows' gold CoT solutions, ``p.steps`` x
    ``iterative.iterations`` steps of ``questions_per_step`` questions (the RL question order) at ``p.optim.lr``; one
    plain process. ``heldout`` is evaluated with a generator of ``p.rollout.backend`` synced to the model."""
    if world_size() > 1:
        raise PipelineError("grpo.algorithm sft runs in one process; launch it without deepspeed / torchrun")
    total = p.steps * p.iterative.iterations
    model = lora.attach(model, p.lora, p.seed)
    generator = None
    if heldout is not None:
        questions = [r["question"] for r in heldout.rows]
        generator = lora.merged_sampler(model, lambda m: rollout_generator(p, m, tokenizer, questions,
                                                                          heldout.max_new_tokens),
                                        resolve_backend(p.rollout.backend), bf16=False)
        generator.sync_weights(model)
        heldout.evaluate(0, generator)

    def on_step(done: int) -> None:
        if heldout is not None and heldout.due(done, total):
            generator.sync_weights(model)
            heldout.evaluate(done, generator)

    enable_checkpointing(model, p.compute.gradient_checkpointing)
    hist = continued_sft(model, tokenizer, rows, steps=total, per_step=p.questions_per_step, seed=p.seed,
                         lr=p.optim.lr, max_grad_norm=p.optim.max_grad_norm, micro_batch_size=p.optim.micro_batch_size,
                         on_step=on_step, updater=rl_updater(model, p, weight_decay=0.0),
                         chunk_tokens=p.compute.logprob_chunk_tokens)
    for r in heldout.records if heldout is not None else []:
        if r["step"] > 0:
            hist[r["step"] - 1]["heldout_accuracy"] = r["heldout_accuracy"]
    if generator is not None and resolve_backend(p.rollout.backend) == "vllm":
        _call(generator, "close")
    return hist, [], {"resumed_from_step": None}


def _call(obj: Any, name: str) -> None:
    fn = getattr(obj, name, None)
    if callable(fn):
        fn()


def fit(p: Any, model: Any, tokenizer: Any, *, rows: Rows | None = None, ckpt_dir: Path | None = None,
        **kw: Any) -> StepContext:
    """:func:`setup`, one iteration of ``p.steps`` steps (:func:`begin_iteration`, :func:`train`) and :func:`close`:
    RL on ``model`` in place without Algorithm 1's per-iteration outputs (tests and benchmarks call it; ``kw`` goes
    to setup). Returns the context: ``history``, ``samples`` and ``info`` hold the run's rows and facts."""
    ctx = setup(p, model, tokenizer, rows=rows, **kw)
    try:
        begin_iteration(ctx, 1, ckpt_dir)
        train(ctx, 0, p.steps)
    finally:
        close(ctx)
    return ctx

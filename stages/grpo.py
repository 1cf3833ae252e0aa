"""The ``grpo`` stage: Group Relative Policy Optimisation from the SFT model (paper section 4, Algorithm 1 with
``iterative.iterations`` iterations: stages/rl/iterative.py), plus a continued-SFT baseline on the same questions
for the same number of steps. Rewards: rule functions, or a reward model (``reward_source``: outcome_rm /
process_rm, stages/rl/reward_model.py), or exact step labels as process rewards (process_rule).

``algorithm`` picks a method of the paper's unified paradigm (section 5.2.1; stages/rl/paradigm.py has the table):
``grpo`` (below), ``online_rft`` (the same step with the rule reward and the SFT loss on the correct outputs,
gradient coefficient 1 / 0, no reference model), ``rft`` (group_size outputs per question sampled once from the SFT
model for every question of the run; each step trains with the SFT loss on the correct, deduplicated outputs of its
questions) and ``sft`` (continued SFT on the gold CoT solutions, stages/rl/baseline.py, at ``lr``). All but sft
run through ``grpo_step``; every method writes the same outputs (the policy to data/models/grpo).

One step (``grpo_step``, i.e. stages.rl.step.run_step): collect rollouts -> score -> targets (advantages or
gradient coefficients) -> log-probs -> update, each phase a typed function of stages/rl/step.py; what differs
between algorithms is a strategy object of stages/rl/algorithms.py (``grpo.algorithm``, one registry), the
advantage estimator one of stages/rl/advantages.py (``grpo.advantage.estimator``) and the policy loss one of
stages/rl/losses.py (``grpo.loss.policy``). ``ppo`` adds a value model (stages/rl/value.py, ``grpo.ppo``).

Real mode (stages/rl/update.py, stages/train/update.py): the update can run under DeepSpeed ZeRO 0-2 (``deepspeed``; one process, or
``deepspeed --module stages.grpo`` on several GPUs, each rank sampling its share of every step's questions), the
rollouts on a colocated vLLM engine (``backend: vllm``; weights loaded into it after every update, optional sleep
mode between rollouts), and the reference / reward models kept in CPU memory while idle (``offload_idle_models``).
``heldout``: greedy held-out accuracy every N steps (plots/grpo/heldout_accuracy.csv; benchmarks/paradigm.py).

Outputs: data/models/grpo (policy), data/models/sft_continued (baseline), data/metrics/grpo.json,
data/plots/grpo/<metric>.csv (one curve per metric, x = step), data/models/grpo/samples.jsonl
(sampled completions every ``log_completions_every`` steps, also published as Prefect table artifacts
when run inside a flow), data/models/grpo_iters/ (per-iteration policies iter<k>/ for k < I and reward
models rm_iter<k>/, index iterations.json). Resumable from checkpoints/grpo (see stages.rl.checkpoint; with
several iterations, within the current iteration only: a restart redoes the earlier iterations; under DeepSpeed
the optimizer state is not checkpointed).
"""

from __future__ import annotations

import copy
import csv
import functools
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from stages.core import hardware, paths
from stages.core.dist import is_main_process, train_device, world_size
from stages.core.errors import PipelineError
from stages.core.generation import SamplingParams, make_generator, model_max_length, resolve_backend
from stages.core.io import atomic_path, write_metrics
from stages.core.modeling import check_compatible, enable_checkpointing, load_model, load_tokenizer, save_model
from stages.core.problems import load_problem_file
from stages.core.prompts import rl_prompt
from stages.rl.algorithms import get_algorithm, rule_reward_set
from stages.rl.baseline import continued_sft
from stages.rl.checkpoint import load_latest, load_updaters, run_dir, save_checkpoint
from stages.rl.data import load_prompts, step_questions
from stages.rl.iterative import mean_finite, run_iterations, untimed
from stages.rl.losses import grpo_loss
from stages.rl.paradigm import RftPool
from stages.rl.rewards import RewardSet, accuracy_reward
from stages.rl.rollout import Rollout, rollout_prompt
from stages.rl.step import StepContext, run_step
from stages.rl.update import as_updater, release_memory, rl_updater
from stages.schema.grpo import GrpoParams
from stages.train.loop import use_bf16
from stages.train.update import use_deepspeed

__all__ = ["accuracy_reward", "grpo_loss", "rule_reward_set", "step_questions"]  # also read from here by tests

log = logging.getLogger(__name__)

START_MODELS = {"sft": paths.SFT_MODEL, "pretrain": paths.PRETRAIN_MODEL}
"""``grpo.start`` -> the model RL starts from (and the baseline and the reference model)."""

PLOT_METRICS = (
    "reward_mean", "reward_std", "accuracy", "zero_std_frac", "kl", "clip_frac_low", "clip_frac_high", "entropy",
    "completion_len", "grad_norm", "loss", "mismatch_abs_mean", "t_generation", "t_scoring", "t_logprobs", "t_update",
    "value_loss", "vf_clip_frac", "value_mean", "value_grad_norm", "return_mean", "adv_abs_mean",
    "tool_programs", "tool_programs_per_s", "tool_wait_s", "tool_exec_s", "tool_wait_frac", "tir_rounds_mean",
    "accuracy_cot", "accuracy_pot", "accuracy_tir",
)


def grpo_step(step: int, p: GrpoParams, model: Any, tokenizer: Any, ref_model: Any | None, generator: Any,
              optimizer: Any, rows: list[dict[str, Any]], reward_set: RewardSet,
              scorer: Any = None, *, pool: RftPool | None = None, offload: bool = False, critic: Any = None
              ) -> tuple[dict[str, Any], Rollout | None, torch.Tensor]:
    """One step of ``p.algorithm`` (stages.rl.step.run_step; sft has no step here): returns (metrics row, rollout,
    rewards: (Q, G), or (N, 1) for rft's kept samples; the rollout is None when rft kept nothing for the step).

    ``optimizer``: a :class:`stages.train.update.Updater` (plain or DeepSpeed) or a torch optimizer.
    ``scorer``: the reward source when ``p.reward.source`` is not rule (stages.rl.reward_model.RewardModelSource or
    StepLabelSource); the rule reward functions are still scored for the accuracy metric. ``pool``: rft's offline
    samples (required for rft). ``offload``: keep the reference / reward model in CPU memory except while they score
    (GPU only). ``critic``: PPO's value model (stages.rl.value.Critic)."""
    ctx = StepContext(p=p, model=model, tokenizer=tokenizer, generator=generator, updater=as_updater(model, optimizer, p),
                      rows=rows, reward_set=reward_set, source=scorer, ref_model=ref_model, critic=critic, pool=pool,
                      offload=offload)
    return run_step(step, ctx)


def _logger() -> Any:
    """Prefect's run logger inside a flow run (shown in the UI), else this module's logger."""
    try:
        from prefect import get_run_logger
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is not None:
            return get_run_logger()
    except ImportError:  # pragma: no cover
        pass
    return log


def _publish_samples(step: int, table: list[dict[str, Any]]) -> None:
    """A Prefect table artifact of sampled completions, when running inside a flow run."""
    try:
        from prefect.artifacts import create_table_artifact
        from prefect.context import FlowRunContext
    except ImportError:  # pragma: no cover
        return
    if FlowRunContext.get() is None:
        return
    create_table_artifact(key="grpo-completions", table=table, description=f"GRPO sampled completions at step {step}")


def sample_table(step: int, ro: Rollout, rewards: torch.Tensor, k: int = 8) -> list[dict[str, Any]]:
    """The first output of the first ``k`` groups: question, gold, completion, reward."""
    G = ro.group_size
    out = []
    for q in range(min(k, rewards.shape[0])):
        n = q * G
        out.append({"step": step, "id": ro.rows[n].get("id"), "question": ro.rows[n]["question"],
                    "gold": ro.rows[n]["answer"], "completion": ro.texts[n], "reward": float(rewards[q, 0]),
                    "group_rewards": [float(x) for x in rewards[q]]})
    return out


class HeldoutEval:
    """Greedy CoT accuracy of the policy on fixed held-out problems (``grpo.heldout``), with the rollout generator
    (synced to the policy): before the first step, every ``every`` steps and after the last. Records
    ``{"step": steps done, "heldout_accuracy": share correct}`` (the rule reward: extracted answer == gold)."""

    def __init__(self, rows: list[dict[str, Any]], every: int, max_new_tokens: int,
                 template: str = "deepseekmath") -> None:
        self.rows = rows
        self.every = every
        self.max_new_tokens = max_new_tokens
        self.template = template
        self.records: list[dict[str, Any]] = []

    @classmethod
    def from_params(cls, h: Any, template: str = "deepseekmath") -> HeldoutEval | None:
        """None when ``h.every`` is 0 (off); prompts in the RL ``template`` (the one the policy is trained with)."""
        if not h.every:
            return None
        problems = load_problem_file(h.problems_file or paths.problems_file("test"), h.limit)
        rows = [{"id": q.id, "question": q.question, "answer": q.gold} for q in problems]
        return cls(rows, h.every, h.max_new_tokens, template)

    def due(self, done: int, total: int) -> bool:
        """Whether the policy after ``done`` of ``total`` steps is evaluated (and was not yet)."""
        hit = done == 0 or done % self.every == 0 or done == total
        return hit and not any(r["step"] == done for r in self.records)

    def evaluate(self, done: int, generator: Any) -> float:
        """Evaluate now (``generator`` holds the current weights); record and return the accuracy."""
        outs = generator.generate([rl_prompt(r["question"], self.template, getattr(generator, "tokenizer", None))
                                   for r in self.rows],
                                  SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens))
        ok = sum(accuracy_reward(completion=o[0].text, answer=r["answer"]) for o, r in zip(outs, self.rows, strict=True))
        acc = ok / len(self.rows)
        self.records.append({"step": done, "heldout_accuracy": acc})
        self.records.sort(key=lambda r: r["step"])
        return acc

    def metrics(self) -> dict[str, Any]:
        """The curve for the stage metrics: problem count, first / last accuracy and ``accuracy_at_step`` (a mapping
        step -> accuracy, not a list: ``dvc exp show`` drops list values, and benchmarks/paradigm.py reads it there)."""
        acc = [round(r["heldout_accuracy"], 6) for r in self.records]
        return {"n": len(self.rows), "every": self.every, "first": acc[0] if acc else None,
                "last": acc[-1] if acc else None,
                "accuracy_at_step": {str(r["step"]): a for r, a in zip(self.records, acc, strict=True)}}


TIR_INJECT_TOKENS = 128
"""Context reserved per TIR round for the injected output block (the output is cut to 103 characters)."""


def max_model_len(tokenizer: Any, model: Any, questions: list[str], max_new_tokens: int,
                  template: str = "deepseekmath", modes: tuple[str, ...] = ("cot",), tir_rounds: int = 1) -> int:
    """Longest prompt (``questions`` in the RL ``template``, or the PoT / TIR prompt of ``modes``) plus what the
    completion may take (``max_new_tokens``; tir: per round, plus :data:`TIR_INJECT_TOKENS` per injected output),
    capped by the model's context: the vLLM engine's ``max_model_len`` (its KV-cache reservation follows it)."""
    prompts = [rollout_prompt(q, m, template, tokenizer) for q in questions for m in modes]
    longest = max((len(ids) for ids in tokenizer(prompts)["input_ids"]), default=1) if prompts else 1
    gen = max_new_tokens if "tir" not in modes else tir_rounds * (max_new_tokens + TIR_INJECT_TOKENS)
    cap = model_max_length(model.config) or (longest + gen)
    return int(min(cap, longest + gen))


def rollout_modes(p: GrpoParams) -> tuple[str, ...]:
    """The rollout modes a run may sample (``grpo.rollout``)."""
    r = p.rollout
    if r.mode != "mixture":
        return (r.mode,)
    return tuple(m for m in ("cot", "pot", "tir") if getattr(r.mixture, m) > 0)


def rollout_generator(p: GrpoParams, model: Any, tokenizer: Any, questions: list[str], max_new_tokens: int,
                      bf16: bool = False) -> Any:
    """The rollout generator of ``p.rollout.backend``: hf (decodes with the policy object itself) or a vLLM engine sized by
    ``vllm_gpu_memory_utilization`` and ``max_model_len`` (see :func:`max_model_len`), with sleep mode on a GPU
    when ``vllm_enable_sleep_mode``; bfloat16 when the update trains in bf16. Built after the update path, so
    under a multi-rank launch the engine joins its process group (stages.core.vllm_backend: external launcher,
    this rank's device, ``vllm_tensor_parallel_size`` ranks per engine) and starts from the policy in memory."""
    if resolve_backend(p.rollout.backend) == "hf":  # bf16: a bf16 copy of an fp32 policy (refreshed by sync_weights)
        return make_generator("hf", model, tokenizer, batch_size=p.questions_per_step * p.rollout.group_size,
                              dtype="bfloat16" if bf16 else None)
    modes = tuple(dict.fromkeys(("cot", *rollout_modes(p))))  # cot: the held-out curve's prompts
    kw: dict[str, Any] = {"gpu_memory_utilization": p.rollout.vllm.gpu_memory_utilization, "seed": p.seed,
                          "max_model_len": max_model_len(tokenizer, model, questions, max_new_tokens, p.template,
                                                         modes, p.rollout.tir_max_rounds)}
    if p.rollout.vllm.enable_sleep_mode:
        if torch.cuda.is_available():
            kw["enable_sleep_mode"] = True
        else:
            log.info("grpo.rollout.vllm.enable_sleep_mode: ignored on CPU (vLLM sleeps on CUDA only)")
    if bf16:
        kw["dtype"] = "bfloat16"
    if p.rollout.vllm.tensor_parallel_size > 1:
        kw["tensor_parallel_size"] = p.rollout.vllm.tensor_parallel_size
    return make_generator("vllm", model, tokenizer, **kw)


def frozen_copy(model: Any, device: str | torch.device | None = None) -> Any:
    """A copy of ``model`` with no gradients, in eval mode (the reference model pi_ref), on ``device`` (None: the
    model's). The copy is made tensor by tensor on ``device``, so a policy on a GPU is not duplicated there."""
    if device is None:
        ref = copy.deepcopy(model)
    else:
        with torch.device("meta"):
            ref = type(model)(model.config)
        ref.load_state_dict({k: v.detach().to(device, copy=True) for k, v in model.state_dict().items()},
                            assign=True, strict=False)
        for name, buf in model.named_buffers():  # non-persistent buffers too (rotary frequencies)
            owner, _, leaf = name.rpartition(".")
            ref.get_submodule(owner)._buffers[leaf] = buf.detach().to(device, copy=True)
        ref.tie_weights()
    ref.eval()
    for prm in ref.parameters():
        prm.requires_grad_(False)
    return ref


def train_grpo(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: GrpoParams, *, ckpt_dir: Path | None,
               on_step: Callable[[dict[str, Any]], None] | None = None, first_step: int = 0, scorer: Any = None,
               heldout: HeldoutEval | None = None, cache: dict[str, Any] | None = None,
               rft_steps: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run ``p.steps`` steps of ``p.algorithm`` (any sampling algorithm of stages.rl.algorithms) on ``model`` in
    place, resuming from the latest checkpoint in ``ckpt_dir`` (a run directory of stages.rl.checkpoint; None: no
    checkpoints). Returns (metric rows, sample rows, info).

    Steps run from ``first_step`` (iterative RL: global step numbers continue across iterations) to
    ``p.steps - 1``; the reference model is a copy of ``model`` as passed in (Algorithm 1: pi_ref <- pi_theta;
    when the algorithm uses one). ``scorer``: the reward source (None: the rule / custom reward functions).
    ``heldout``: evaluated on rank 0 at its due steps. ``cache`` keeps what later calls (iterations) continue with:
    rft's pool of offline samples, drawn from ``model`` as passed in (the SFT model) for every question of steps
    0 .. ``rft_steps`` - 1 (default ``p.steps``) before any checkpoint is loaded, and PPO's value model.
    The update runs through :func:`stages.rl.update.rl_updater` (DeepSpeed when ``p.deepspeed.enabled`` or
    launched with several ranks; each rank then samples its share of every step's questions)."""
    algo = get_algorithm(p.algorithm)
    if not algo.samples:
        raise ValueError(f"train_grpo: algorithm {p.algorithm} has no sampling loop; see train_sft")
    cache = {} if cache is None else cache
    reward_set = algo.reward_functions(p)
    offload = p.compute.offload_idle_models
    ref_model = frozen_copy(model, "cpu" if offload else None) if algo.uses_reference(p) else None
    world = world_size()
    if world > 1 and p.questions_per_step < world:
        raise PipelineError(f"grpo.questions_per_step: {p.questions_per_step} is below the {world} ranks; each rank "
                            "samples its share of a step's questions, so give at least one per rank")
    # the update path first: under DeepSpeed it joins the process group, which the rollout engine is built in
    enable_checkpointing(model, p.compute.gradient_checkpointing)
    upd = rl_updater(model, p)
    questions = [r["question"] for r in rows] + ([r["question"] for r in heldout.rows] if heldout else [])
    gen_len = max(p.rollout.max_new_tokens, heldout.max_new_tokens if heldout else 0)
    generator = rollout_generator(p, model, tokenizer, questions, gen_len, bf16=upd.bf16 or upd.autocast_bf16)
    info: dict[str, Any] = {"resumed_from_step": None, "generation_backend": resolve_backend(p.rollout.backend)}
    pool: RftPool | None = None
    if cache.get("pool") is None:  # rft's offline samples, drawn before any checkpoint is loaded
        t0 = time.perf_counter()
        cache["pool"] = algo.offline_pool(model, generator, rows, p, rft_steps or p.steps)
        if cache["pool"] is not None:
            info["rft_pool_s"] = round(time.perf_counter() - t0, 2)
    pool = cache["pool"]
    if pool is not None:
        info["rft_pool"] = pool.summary()
    history: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    start = first_step
    state = load_latest(ckpt_dir) if ckpt_dir is not None else None
    if state is not None:
        load_updaters(state, {"policy": upd})
        start, history = state["step"], state["history"]
        samples = state["extra"].get("samples", [])
        if heldout is not None:
            heldout.records = list(state["extra"].get("heldout", heldout.records))
        if state["extra"].get("reward_source") is not None and hasattr(scorer, "load_state_dict"):
            scorer.load_state_dict(state["extra"]["reward_source"])  # the guards' running statistics
        info["resumed_from_step"] = start
    info["deepspeed_zero_stage"] = upd.zero_stage if upd.distributed else None
    info["world_size"] = upd.world
    info["trained_parameters"] = {"policy": _n_trainable(model)}
    if ref_model is not None:
        if upd.bf16:
            ref_model.to(torch.bfloat16)
        if not offload:
            ref_model.to(upd.device)
    if getattr(scorer, "rm", None) is not None:
        scorer.rm.to("cpu" if offload else upd.device)
    sandbox_pool = ThreadPoolExecutor(max_workers=p.rollout.exec_workers, thread_name_prefix="sandbox") \
        if rollout_modes(p) != ("cot",) else None
    ctx = StepContext(p=p, model=model, tokenizer=tokenizer, generator=generator, updater=upd, rows=rows,
                      reward_set=reward_set, source=scorer, ref_model=ref_model, pool=pool, offload=offload,
                      sandbox_pool=sandbox_pool)
    ctx.critic = algo.make_critic(ctx, cache)
    if ctx.critic is not None:
        info["trained_parameters"]["value_model"] = _n_trainable(ctx.critic.model)
    if ctx.critic is not None and state is not None and "critic" in state.get("updaters", []):
        load_updaters(state, {"critic": ctx.critic.updater})
    logger = _logger()
    model.eval()
    _wake(generator)
    generator.sync_weights(model)
    if heldout is not None and is_main_process() and heldout.due(start, p.steps) and start == first_step == 0:
        logger.info("held-out accuracy before step 1: %.3f", heldout.evaluate(0, generator))
    for step in range(start, p.steps):
        row, ro, rewards = grpo_step(step, p, model, tokenizer, ref_model, generator, upd, rows, reward_set,
                                     scorer=scorer, pool=pool, offload=offload, critic=ctx.critic)
        done = step + 1
        if heldout is not None and is_main_process() and heldout.due(done, p.steps):
            row["heldout_accuracy"] = heldout.evaluate(done, generator)
        history.append(row)
        logger.info("%s step %d/%d: reward %.3f acc %.3f zero-std %.2f kl %.4f len %.1f | %.1fs (gen %.1f, upd %.1f)%s",
                    algo.name, done, p.steps, row["reward_mean"], row["accuracy"], row["zero_std_frac"], row["kl"],
                    row["completion_len"], row["step_s"], row["t_generation"], row["t_update"],
                    f" | held-out {row['heldout_accuracy']:.3f}" if "heldout_accuracy" in row else "")
        if ro is not None and p.log_completions_every and step % p.log_completions_every == 0:
            table = sample_table(step, ro, rewards)
            samples.extend(table)
            _publish_samples(step, table)
        if on_step is not None:
            on_step(row)
        if ckpt_dir is not None and p.checkpoint_every and (done % p.checkpoint_every == 0) and done < p.steps:
            updaters = {"policy": upd, **({"critic": ctx.critic.updater} if ctx.critic is not None else {})}
            extra: dict[str, Any] = {"samples": samples, "heldout": heldout.records if heldout is not None else []}
            if hasattr(scorer, "state_dict"):
                extra["reward_source"] = scorer.state_dict()  # the guards' running statistics
            save_checkpoint(ckpt_dir, updaters=updaters, step=done, history=history, extra=extra)
    _wake(generator)
    close = getattr(generator, "close", None)
    if callable(close) and resolve_backend(p.rollout.backend) == "vllm":
        close()
    if sandbox_pool is not None:
        sandbox_pool.shutdown(wait=True)
    info["reward_failures_by_fn"] = dict(reward_set.failures)
    info["rollout_modes"] = list(rollout_modes(p))
    return history, samples, info


def load_policy(path: Any, p: GrpoParams) -> Any:
    """A causal LM of the stage (the policy, the baseline's start), its weights read directly in the update's dtype
    (bf16 under DeepSpeed's bf16 mode, else float32) onto this rank's device, with ``p.compute.attn_implementation``."""
    dev = train_device()
    bf16 = use_deepspeed(p.deepspeed.enabled) and use_bf16(p.compute.precision, dev)
    return load_model(path, dtype=torch.bfloat16 if bf16 else torch.float32, device=dev,
                      attn_implementation=p.compute.attn_implementation)


def _n_trainable(model: Any) -> int:
    return sum(q.numel() for q in model.parameters() if q.requires_grad)


def peak_memory() -> dict[str, float]:
    """This process's peak resident memory (MiB, ``ru_maxrss``) and, on a GPU, torch's peak allocated memory."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    out = {"peak_rss_mib": round(rss, 1)}
    if torch.cuda.is_available():
        out["peak_cuda_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _wake(generator: Any) -> None:
    fn = getattr(generator, "wake_up", None)
    if callable(fn):
        fn()


def train_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: GrpoParams, *,
              heldout: HeldoutEval | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """algorithm sft: the continued SFT of stages.rl.baseline on the rows' gold CoT solutions, ``p.steps`` x
    ``iterative.iterations`` steps of ``questions_per_step`` questions (the GRPO question order) at ``p.optim.lr``; one
    plain process (no DeepSpeed). ``heldout`` is evaluated with a generator of ``p.rollout.backend`` synced to the model."""
    if world_size() > 1:
        raise PipelineError("grpo.algorithm sft runs in one process; launch it without deepspeed / torchrun")
    total = p.steps * p.iterative.iterations
    generator = None
    if heldout is not None:
        generator = rollout_generator(p, model, tokenizer, [r["question"] for r in heldout.rows],
                                      heldout.max_new_tokens)
        generator.sync_weights(model)
        heldout.evaluate(0, generator)

    def on_step(done: int) -> None:
        if heldout is not None and heldout.due(done, total):
            generator.sync_weights(model)
            heldout.evaluate(done, generator)

    enable_checkpointing(model, p.compute.gradient_checkpointing)
    hist = continued_sft(model, tokenizer, rows, steps=total, per_step=p.questions_per_step, seed=p.seed, lr=p.optim.lr,
                         max_grad_norm=p.optim.max_grad_norm, micro_batch_size=p.optim.micro_batch_size, on_step=on_step,
                         updater=rl_updater(model, p, weight_decay=0.0), chunk_tokens=p.compute.logprob_chunk_tokens)
    if heldout is not None:
        for r in heldout.records:
            if r["step"] > 0:
                hist[r["step"] - 1]["heldout_accuracy"] = r["heldout_accuracy"]
    if generator is not None and callable(getattr(generator, "close", None)) and resolve_backend(p.rollout.backend) == "vllm":
        generator.close()
    return hist, [], {"resumed_from_step": None}


def write_plots(out_dir: Path, history: list[dict[str, Any]], names: tuple[str, ...], prefix: str = "") -> None:
    """One CSV per metric (columns step,<metric>) in ``out_dir``: DVC plots them with x = step."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        if not any(name in r for r in history):
            continue
        with atomic_path(out_dir / f"{prefix}{name}.csv") as tmp, open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", name])
            for r in history:
                v = r.get(name)
                w.writerow([r["step"], "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.6g}"])


def summarize(history: list[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """Stage metrics from the per-step rows: first/last-window means and time totals."""
    if not history:
        return {}
    first, last = history[:window], history[-window:]
    out: dict[str, Any] = {"steps": len(history)}
    for k in ("reward_mean", "accuracy", "kl", "entropy", "completion_len", "zero_std_frac"):
        out[f"{k}_first{window}"] = mean_finite([r.get(k) for r in first])
        out[f"{k}_last{window}"] = mean_finite([r.get(k) for r in last])
    for k in ("t_generation", "t_scoring", "t_logprobs", "t_update", "step_s", "cpu_generation", "cpu_scoring",
              "cpu_logprobs", "cpu_update", "cpu_step_s"):
        out[f"{k}_total"] = round(sum(r.get(k, 0.0) for r in history), 2)
    out["step_s_mean"] = round(out["step_s_total"] / len(history), 3)
    if any("tool_programs" in r for r in history):  # pot / tir rollouts: the sandbox's part
        for k in ("tool_programs", "tool_failed", "tool_wait_s", "tool_exec_s", "tool_generate_s", "tool_wall_s"):
            out[f"{k}_total"] = round(sum(r.get(k, 0.0) for r in history), 2)
        out["tool_programs_per_s"] = round(out["tool_programs_total"] / out["tool_wall_s_total"], 2) \
            if out["tool_wall_s_total"] else 0.0
        out["tool_wait_share_of_step"] = round(out["tool_wait_s_total"] / out["step_s_total"], 4) \
            if out["step_s_total"] else 0.0
    out["n_reward_failures"] = sum(r.get("n_reward_failures", 0) for r in history)
    out["skipped_nonfinite"] = sum(r.get("skipped_nonfinite", 0) for r in history)
    out["mismatch_abs_mean"] = mean_finite([r.get("mismatch_abs_mean") for r in history])
    return out


def run(p: GrpoParams) -> dict[str, Any]:
    """Train the policy with ``p.algorithm`` and the continued-SFT baseline; write models, plots and metrics.

    Under a DeepSpeed launch with several ranks every rank trains; rank 0 alone writes outputs and runs the
    baseline, and the other ranks return an empty dict."""
    t_start = time.perf_counter()
    if p.compute.num_threads:
        torch.set_num_threads(p.compute.num_threads)
    prompts_path = p.prompts_file or paths.RL_PROMPTS
    rows = load_prompts(prompts_path)
    algo = get_algorithm(p.algorithm)
    algo.reward_functions(p)  # a bad custom reward path fails here, before any work
    if p.baseline.enabled and any("cot" not in r for r in rows):
        raise PipelineError("grpo.baseline.enabled: the prompt rows have no 'cot' solutions; set it to false or add them")
    if not algo.samples and any("cot" not in r for r in rows):  # sft: continued SFT on the gold solutions
        raise PipelineError(f"grpo.algorithm {p.algorithm} trains on the prompt rows' 'cot' solutions, and some rows "
                            "have none")
    init = START_MODELS[p.start]
    tokenizer = load_tokenizer(init)
    model = load_policy(init, p)
    check_compatible(model, tokenizer, str(init))
    torch.manual_seed(p.seed)
    heldout = HeldoutEval.from_params(p.heldout, p.template)
    rm_dir = paths.REWARD_MODEL if p.reward.source in ("outcome_rm", "process_rm") else None
    ckpt_dir = run_dir(paths.CHECKPOINTS / "grpo", p.tracked_dump(), [init, prompts_path] + ([rm_dir] if rm_dir else []))
    if not algo.samples:
        history, samples, info = train_sft(model, tokenizer, rows, p, heldout=heldout)
    else:
        # Algorithm 1 (stages.rl.iterative): iterative.iterations x steps steps; iterations = 1 is plain GRPO
        train_fn = functools.partial(train_grpo, heldout=heldout, rft_steps=p.steps * p.iterative.iterations)
        history, samples, info = run_iterations(model, tokenizer, rows, p, train_fn=train_fn, ckpt_dir=ckpt_dir,
                                                rm_dir=rm_dir, out_dir=paths.GRPO_ITERS, cache={}, heldout=heldout)
    main = is_main_process()
    t_grpo = time.perf_counter() - t_start
    ds = use_deepspeed(p.deepspeed.enabled)  # bf16: DeepSpeed's bf16 mode, or plain autocast when asked (not auto)
    hw = {**hardware.record(train_device(), p.precision, (ds and use_bf16(p.precision, train_device())) or
                            (not ds and p.precision == "bf16")), "generation_backend": resolve_backend(p.backend)}
    info["memory"] = peak_memory()  # of the RL part (before the baseline)
    summary = summarize(history)
    if main:
        with atomic_path(paths.GRPO_MODEL) as tmp:
            model.to("cpu").save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            # the held-out curve and the training signals also travel with the (DVC-cached) model:
            # benchmarks/paradigm.py reads them from there when an experiment's commit lacks the metrics file; no
            # timings or memory peaks here (a cached output is the same bytes for the same inputs): they are in the
            # metrics
            (tmp / "pipeline.json").write_text(json.dumps({
                "stage": "grpo", "algorithm": p.algorithm, "init": str(init), "params": p.tracked_dump(), "hardware": hw,
                "heldout": heldout.metrics() if heldout else None,
                "run": {"trained_parameters": info.get("trained_parameters")},
                "summary": untimed(summary), "iterations": untimed(info.get("iterations"))}, indent=2) + "\n")
            with open(tmp / "samples.jsonl", "w", encoding="utf-8") as f:
                for s in samples:
                    f.write(json.dumps(s, ensure_ascii=False) + "\n")
        write_plots(paths.plots_dir("grpo"), history, PLOT_METRICS + ("sft_loss", "nll"))
    metrics: dict[str, Any] = {"algorithm": p.algorithm, "grpo": summary, "grpo_wall_s": round(t_grpo, 2),
                               **info, "hardware": hw}
    if heldout is not None and main:
        write_plots(paths.plots_dir("grpo"), heldout.records, ("heldout_accuracy",))
        metrics["heldout"] = heldout.metrics()

    # the continued-SFT baseline: every rank (the same update path as the policy's: DeepSpeed, bf16, accelerator)
    t0 = time.perf_counter()
    del model
    release_memory()
    base_model = load_policy(init, p)
    torch.manual_seed(p.seed)
    if p.baseline.enabled:
        enable_checkpointing(base_model, p.compute.gradient_checkpointing)
        bh = continued_sft(base_model, tokenizer, rows, steps=p.steps * p.iterative.iterations,
                           per_step=p.questions_per_step, seed=p.seed,
                           lr=p.baseline.lr, max_grad_norm=p.optim.max_grad_norm, micro_batch_size=p.optim.micro_batch_size,
                           updater=rl_updater(base_model, p, lr=p.baseline.lr, weight_decay=0.0),
                           chunk_tokens=p.compute.logprob_chunk_tokens)
        if main:
            save_model(base_model.to("cpu"), tokenizer, paths.SFT_CONTINUED,
                       extra={"stage": "grpo", "baseline": "continued_sft", "init": str(init),
                              "params": p.tracked_dump()})
            write_plots(paths.plots_dir("grpo"), bh, ("sft_loss",), prefix="baseline_")
        metrics["baseline"] = {"steps": len(bh), "sft_loss_first": round(bh[0]["sft_loss"], 4),
                               "sft_loss_last": round(bh[-1]["sft_loss"], 4)}
    else:
        if main:
            save_model(base_model.to("cpu"), tokenizer, paths.SFT_CONTINUED,
                       extra={"stage": "grpo", "baseline": "disabled (copy of init)"})
        metrics["baseline"] = {"steps": 0}
    if not main:
        return {}
    metrics["baseline_wall_s"] = round(time.perf_counter() - t0, 2)
    metrics["wall_s"] = round(time.perf_counter() - t_start, 2)
    write_metrics("grpo", metrics, ["algorithm", "world_size", "grpo.reward_mean_*", "grpo.accuracy_*", "grpo.kl_last5",
                                     "grpo.step_s_mean", "grpo_wall_s", "memory", "trained_parameters",
                                     "baseline.sft_loss_last", "heldout", "hardware"])
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # finished: a later run starts afresh
    return metrics


if __name__ == "__main__":  # the DeepSpeed / torchrun entry (docs/real-mode.md); dvc runs python -m flows.grpo
    from stages.train.common import cli

    raise SystemExit(cli(GrpoParams, run))

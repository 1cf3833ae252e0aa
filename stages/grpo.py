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

One GRPO step (``grpo_step``):
1. take ``questions_per_step`` questions (stages.rl.data.step_questions) and sample G outputs each
   from pi_old through stages.core.generation (temperature, top_p, max_new_tokens);
2. score every output with the reward functions (stages.rl.rewards); a failed reward excludes the
   output (counted);
3. group-normalised advantages (stages.rl.advantages.outcome_advantages);
4. log-probs: pi_old from a teacher-forced pass of the training model (logits / temperature); with
   mu = 1 and one minibatch that pass *is* the first forward of the update (old = logp.detach(), so
   the ratio is exactly 1), otherwise a separate no-grad pass before any update; pi_ref from the
   frozen start model when beta > 0 (none is loaded when beta = 0);
5. mu passes over the batch, each split into ``minibatches`` optimizer steps, each accumulated over
   micro-batches of ``micro_batch_size`` with batch-wide loss normalisers (stages.rl.losses); a step
   whose loss or gradient norm is not finite is skipped (no optimizer update) and counted.

Real mode (stages/rl/update.py): the update can run under DeepSpeed ZeRO 0-2 (``deepspeed``; one process, or
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
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.generation import SamplingParams, make_generator, model_max_length, resolve_backend
from stages.core.io import atomic_path, write_metrics
from stages.core.modeling import check_compatible, load_model, load_tokenizer, save_model
from stages.core.problems import load_problem_file
from stages.core.prompts import chat_prompt
from stages.rl.advantages import outcome_advantages
from stages.rl.baseline import continued_sft
from stages.rl.checkpoint import load_latest, run_dir, save_checkpoint
from stages.rl.data import load_prompts, step_questions
from stages.rl.iterative import run_iterations
from stages.rl.losses import LossNormalizer, grpo_loss
from stages.rl.paradigm import RftPool, build_rft_pool, rft_coefficients, run_questions, weighted_nll_loss
from stages.rl.rewards import RewardSet, accuracy_reward
from stages.rl.rollout import Rollout, build_rollout, mismatch_metrics, token_logprobs
from stages.rl.update import PolicyUpdater, all_reduce, on_device, train_device
from stages.schema.grpo import GrpoParams
from stages.train.loop import use_bf16

log = logging.getLogger(__name__)

PLOT_METRICS = (
    "reward_mean", "reward_std", "accuracy", "zero_std_frac", "kl", "clip_frac_low", "clip_frac_high", "entropy",
    "completion_len", "grad_norm", "mismatch_abs_mean", "t_generation", "t_scoring", "t_logprobs", "t_update",
)


def _micro_slices(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    return list(rows.split(size)) if rows.numel() else []


def _trim(ro: Rollout, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """input_ids / attention_mask of rows ``idx`` with the completion trimmed to their longest; returns T'."""
    t = int(ro.completion_mask[idx].sum(-1).max().clamp(min=1))
    P = ro.prompt_len
    return ro.input_ids[idx, : P + t], ro.attention_mask[idx, : P + t], t


def score_rollout(ro: Rollout, reward_set: RewardSet) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """(Q, G) rewards (NaN where a reward function failed) and the per-function values."""
    N, G = len(ro.texts), ro.group_size
    totals, parts = [], {}
    for n in range(N):
        row = ro.rows[n]
        tot, comp = reward_set.score(question=row["question"], completion=ro.texts[n], answer=row["answer"],
                                     finish_reason=ro.finish_reasons[n], row=row)
        totals.append(tot)
        for k, v in comp.items():
            parts.setdefault(k, []).append(v)
    return torch.tensor(totals, dtype=torch.float64).view(N // G, G), parts


def _as_updater(model: Any, optimizer: Any, p: GrpoParams) -> PolicyUpdater:
    """``optimizer`` as a :class:`PolicyUpdater` (callers may still pass a plain torch optimizer)."""
    if isinstance(optimizer, PolicyUpdater):
        return optimizer
    return PolicyUpdater(model, lr=p.lr, weight_decay=p.weight_decay, max_grad_norm=p.max_grad_norm, optimizer=optimizer)


def _sleep(generator: Any) -> None:
    fn = getattr(generator, "sleep", None)
    if callable(fn):
        fn()


def _wake(generator: Any) -> None:
    fn = getattr(generator, "wake_up", None)
    if callable(fn):
        fn()


def rule_reward_set() -> RewardSet:
    """The paper's "Rule" reward of RFT / online RFT: answer correctness alone (accuracy_reward, weight 1)."""
    return RewardSet.from_params(1.0, 0.0, [], [])


def grpo_step(step: int, p: GrpoParams, model: Any, tokenizer: Any, ref_model: Any | None, generator: Any,
              optimizer: Any, rows: list[dict[str, Any]], reward_set: RewardSet,
              scorer: Any = None, *, pool: RftPool | None = None, offload: bool = False
              ) -> tuple[dict[str, Any], Rollout | None, torch.Tensor]:
    """One step of ``p.algorithm`` (module docstring; sft has no step here): returns (metrics row, rollout,
    rewards: (Q, G), or (N, 1) for rft's kept samples; the rollout is None when rft kept nothing for the step).

    ``optimizer``: a :class:`stages.rl.update.PolicyUpdater` (plain or DeepSpeed) or a torch optimizer.
    ``scorer`` (stages.rl.reward_model.RewardModelScorer): with ``p.reward_source`` outcome_rm / process_rm the
    rewards and advantages come from the reward model (process: per-token advantages, paper 4.1.3); the rule
    reward functions are still scored for the accuracy metric. ``pool``: rft's offline samples (required for rft).
    ``offload``: keep the reference / reward model in CPU memory except while they score (GPU only)."""
    upd = _as_updater(model, optimizer, p)
    dev = upd.device
    algo = p.algorithm
    m: dict[str, Any] = {"step": step}
    G = p.group_size
    # 1. rollouts (rft: this step's share of the offline pool)
    t0, c0 = time.perf_counter(), time.process_time()
    qs = step_questions(len(rows), step, p.questions_per_step, p.seed)[upd.rank::upd.world]
    ro: Rollout | None
    if algo == "rft":
        if pool is None:
            raise ValueError("grpo_step: algorithm rft needs the RFT pool")
        kept = pool.step_samples(qs)
        ro = build_rollout([rows[q] for q, _ in kept], [chat_prompt(rows[q]["question"], "cot") for q, _ in kept],
                           [[c] for _, c in kept], tokenizer, mask_truncated=p.mask_truncated) if kept else None
    else:
        batch = [rows[i] for i in qs]
        prompts = [chat_prompt(r["question"], "cot") for r in batch]
        model.eval()
        sp = SamplingParams(temperature=p.temperature, top_p=p.top_p, n=G, max_new_tokens=p.max_new_tokens,
                            seed=p.seed * 1_000_003 + step)
        completions = generator.generate(prompts, sp)
        _sleep(generator)  # vllm sleep mode: the engine's memory goes to the update
        ro = build_rollout(batch, prompts, completions, tokenizer, mask_truncated=p.mask_truncated)
    m["t_generation"], m["cpu_generation"] = time.perf_counter() - t0, time.process_time() - c0

    # 2. rewards, 3. advantages (grpo) or gradient coefficients (rft, online_rft: paper eq. 10)
    t0, c0 = time.perf_counter(), time.process_time()
    N = 0 if ro is None else len(ro.texts)
    T = 1 if ro is None else ro.completion_mask.shape[1]
    lmask = torch.zeros(N, T) if ro is None else ro.loss_mask.clone()
    coef: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    n_fail = 0
    if algo == "rft":
        rewards = torch.ones(N, 1, dtype=torch.float64)
        coef = rft_coefficients(torch.ones(N, dtype=torch.bool))
        acc_sum = sum(pool.n_correct.get(q, 0) for q in qs)  # type: ignore[union-attr]
        acc_n = sum(pool.n_sampled.get(q, 0) for q in qs)  # type: ignore[union-attr]
        rew_sum, rew_n, n_zero, n_groups, std_sum = float(acc_sum), float(acc_n), 0.0, float(len(qs)), 0.0
        m["n_kept"] = N
    else:
        assert ro is not None
        rewards, parts = score_rollout(ro, reward_set)
        if algo == "online_rft":
            correct = torch.nan_to_num(rewards.view(-1), nan=0.0) == 1.0
            coef = rft_coefficients(correct)
            lmask[~correct] = 0
            adv = outcome_advantages(rewards, scale_rewards="group", eps=p.adv_eps)  # group statistics for the metrics
        elif scorer is None:
            adv = outcome_advantages(rewards, scale_rewards=p.scale_rewards, eps=p.adv_eps)
        else:  # reward model: (Q, G) outcome or (Q, G, T) process advantages
            with on_device(scorer.rm, dev, offload):
                adv = scorer.advantages(ro, p.reward_source, scale_rewards=p.scale_rewards, eps=p.adv_eps)
            rewards = torch.where(adv.valid, adv.rewards, torch.full_like(adv.rewards, math.nan))
            m["rm_steps_mean"] = adv.n_steps_mean
        valid = adv.valid.view(-1)
        lmask[~valid] = 0
        n_fail = int((~valid).sum())
        if algo == "grpo":
            if p.skip_zero_std_groups:
                informative = (adv.advantages != 0).reshape(rewards.shape[0], -1).any(dim=1).repeat_interleave(G)
                lmask[~informative] = 0
            advantages = adv.advantages.float().flatten(0, 1)  # (N,) outcome or (N, T) process supervision
        fin = rewards[torch.isfinite(rewards)]
        acc = [v for v in parts.get("accuracy", []) if math.isfinite(v)]
        acc_sum, acc_n = float(sum(acc)), float(len(acc))
        rew_sum, rew_n = float(fin.sum()), float(fin.numel())
        n_zero, n_groups, std_sum = float(adv.n_zero_std_groups), float(rewards.shape[0]), float(adv.group_std.sum())
    acc_sum, acc_n, rew_sum, rew_n, n_zero, n_groups, std_sum, n_fail_all = all_reduce(
        [acc_sum, acc_n, rew_sum, rew_n, n_zero, n_groups, std_sum, float(n_fail)])
    m["reward_mean"] = rew_sum / rew_n if rew_n else math.nan
    m["reward_std"] = std_sum / n_groups if n_groups else math.nan
    m["accuracy"] = acc_sum / acc_n if acc_n else math.nan
    m["zero_std_frac"] = n_zero / n_groups if n_groups else math.nan
    m["n_reward_failures"] = int(n_fail_all)
    m["completion_len"] = float(ro.completion_lengths.float().mean()) if ro is not None else math.nan
    m["truncated_frac"] = (sum(r == "length" for r in ro.finish_reasons) / N) if ro is not None and N else 0.0
    m["t_scoring"], m["cpu_scoring"] = time.perf_counter() - t0, time.process_time() - c0

    # 4. log-probs (grpo: pi_old unless fused into the update, pi_ref)
    t0, c0 = time.perf_counter(), time.process_time()
    train_rows = torch.nonzero(lmask.sum(-1) > 0).view(-1)
    m["n_train_outputs"] = int(all_reduce([float(train_rows.numel())])[0])
    fused_old = algo != "grpo" or (p.mu == 1 and p.minibatches == 1)
    use_ref = algo == "grpo" and ref_model is not None
    old_lp = torch.zeros_like(lmask)
    ref_lp = torch.zeros_like(lmask) if use_ref else None
    if ro is not None and train_rows.numel() and (use_ref or not fused_old):
        with torch.no_grad(), on_device(ref_model if use_ref else None, dev, offload):
            for sl in _micro_slices(train_rows, p.micro_batch_size):
                ids, att, t = _trim(ro, sl)
                if not fused_old:
                    lp, _ = token_logprobs(model, ids.to(dev), att.to(dev), ro.prompt_len, p.temperature,
                                             share_prompts=p.share_prompt_prefix)
                    old_lp[sl, :t] = lp.cpu()
                if ref_lp is not None:
                    rdev = next(ref_model.parameters()).device  # type: ignore[union-attr]
                    rlp, _ = token_logprobs(ref_model, ids.to(rdev), att.to(rdev), ro.prompt_len, p.temperature,
                                             share_prompts=p.share_prompt_prefix)
                    ref_lp[sl, :t] = rlp.float().cpu()
    m["t_logprobs"], m["cpu_logprobs"] = time.perf_counter() - t0, time.process_time() - c0

    # 5. updates
    t0, c0 = time.perf_counter(), time.process_time()
    model.train()
    fwd = upd.forward_model
    gen = torch.Generator().manual_seed(p.seed * 7919 + step)
    keys = ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "nll")
    sums: dict[str, float] = dict.fromkeys(keys, 0.0) | {"entropy": 0.0}
    n_tok_total = 0
    n_ent_tok = 0
    grad_norms, skipped, n_opt = [], 0, 0
    mismatch_lp = torch.zeros_like(lmask)
    for it in range(p.mu):
        order = train_rows[torch.randperm(train_rows.numel(), generator=gen)] if it or p.minibatches > 1 else train_rows
        for mb in order.tensor_split(p.minibatches):
            slices = _micro_slices(mb, p.micro_batch_size)
            if mb.numel():
                local = LossNormalizer.from_mask(lmask[mb], max_len=p.max_new_tokens)
            else:
                local = LossNormalizer(0, 0, p.max_new_tokens)
            n_micro = len(slices)
            norm = local
            if upd.distributed:  # batch-wide denominators and equal backward counts over the ranks
                n_seq, n_tok = all_reduce([float(local.num_sequences), float(local.num_tokens)])
                n_micro = int(all_reduce([float(len(slices))], "max")[0])
                norm = LossNormalizer(int(n_seq), int(n_tok), p.max_new_tokens)
            if n_micro == 0:
                continue
            upd.zero_grad()
            bad = False
            for j in range(n_micro):
                last = j == n_micro - 1
                if j >= len(slices) or bad:  # DeepSpeed only: this rank has no (more) rows, or a bad loss
                    upd.dummy_backward(last=last)
                    continue
                sl = slices[j]
                assert ro is not None
                ids, att, t = _trim(ro, sl)
                lp, ent = token_logprobs(fwd, ids.to(dev), att.to(dev), ro.prompt_len, p.temperature, entropy=it == 0,
                                         share_prompts=p.share_prompt_prefix)
                lp = lp.float()
                msk = lmask[sl, :t].to(dev)
                old = lp.detach() if fused_old else old_lp[sl, :t].to(dev)
                if it == 0:
                    mismatch_lp[sl, :t] = old.cpu()
                if algo == "grpo":
                    assert advantages is not None
                    adv_sl = advantages[sl] if advantages.dim() == 1 else advantages[sl, :t]
                    loss, lm = grpo_loss(lp, old, None if ref_lp is None else ref_lp[sl, :t].to(dev), adv_sl.to(dev),
                                         msk, clip_eps=p.clip_eps, clip_eps_high=p.clip_eps_high, beta=p.beta,
                                         aggregation=p.aggregation, normalizer=norm)
                else:
                    assert coef is not None
                    loss, lm = weighted_nll_loss(lp, coef[sl].to(dev), msk, aggregation=p.aggregation, normalizer=norm)
                if not torch.isfinite(loss):
                    bad = True
                    if not upd.distributed:
                        break
                    upd.dummy_backward(last=last)
                    continue
                upd.backward(loss, last=last)
                k = lm["n_tokens"]
                n_tok_total += k
                for key in keys:
                    sums[key] += lm.get(key, 0.0) * k
                if ent is not None:
                    mb_mask = msk.bool()
                    sums["entropy"] += float(ent[mb_mask].sum())
                    n_ent_tok += int(mb_mask.sum())
            gn, stepped = upd.step(bad)
            if stepped:
                n_opt += 1
                grad_norms.append(gn)
            else:
                skipped += 1
    model.eval()
    _wake(generator)
    generator.sync_weights(model)
    m["t_update"], m["cpu_update"] = time.perf_counter() - t0, time.process_time() - c0
    for key in ("kl", "clip_frac_low", "clip_frac_high"):  # 0 for the SFT-loss methods: no reference, no clip
        m[key] = sums[key] / n_tok_total if n_tok_total else 0.0
    if algo == "grpo":
        m["ratio_mean"] = sums["ratio_mean"] / n_tok_total if n_tok_total else 0.0
    else:
        m["nll"] = sums["nll"] / n_tok_total if n_tok_total else math.nan
    m["entropy"] = sums["entropy"] / n_ent_tok if n_ent_tok else math.nan
    m["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else math.nan
    m["optimizer_steps"] = n_opt
    m["skipped_nonfinite"] = skipped
    if ro is not None:
        trained = torch.zeros_like(lmask)
        trained[train_rows] = ro.completion_mask[train_rows]
        m.update(mismatch_metrics(ro.sampler_logprobs, mismatch_lp, trained))
    m["step_s"] = m["t_generation"] + m["t_scoring"] + m["t_logprobs"] + m["t_update"]
    m["cpu_step_s"] = m["cpu_generation"] + m["cpu_scoring"] + m["cpu_logprobs"] + m["cpu_update"]
    return m, ro, rewards


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

    def __init__(self, rows: list[dict[str, Any]], every: int, max_new_tokens: int) -> None:
        self.rows = rows
        self.every = every
        self.max_new_tokens = max_new_tokens
        self.records: list[dict[str, Any]] = []

    @classmethod
    def from_params(cls, h: Any) -> HeldoutEval | None:
        """None when ``h.every`` is 0 (off)."""
        if not h.every:
            return None
        problems = load_problem_file(h.problems_file or paths.problems_file("test"), h.limit)
        rows = [{"id": q.id, "question": q.question, "answer": q.gold} for q in problems]
        return cls(rows, h.every, h.max_new_tokens)

    def due(self, done: int, total: int) -> bool:
        """Whether the policy after ``done`` of ``total`` steps is evaluated (and was not yet)."""
        hit = done == 0 or done % self.every == 0 or done == total
        return hit and not any(r["step"] == done for r in self.records)

    def evaluate(self, done: int, generator: Any) -> float:
        """Evaluate now (``generator`` holds the current weights); record and return the accuracy."""
        outs = generator.generate([chat_prompt(r["question"], "cot") for r in self.rows],
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


def max_model_len(tokenizer: Any, model: Any, questions: list[str], max_new_tokens: int) -> int:
    """Longest prompt (CoT chat prompt of ``questions``) plus ``max_new_tokens``, capped by the model's context:
    the vLLM engine's ``max_model_len`` (its KV-cache reservation follows it)."""
    longest = max((len(ids) for ids in tokenizer([chat_prompt(q, "cot") for q in questions])["input_ids"]), default=1)
    cap = model_max_length(model.config) or (longest + max_new_tokens)
    return int(min(cap, longest + max_new_tokens))


def rollout_generator(p: GrpoParams, model: Any, tokenizer: Any, questions: list[str], max_new_tokens: int,
                      bf16: bool = False) -> Any:
    """The rollout generator of ``p.backend``: hf (decodes with the policy object itself) or a vLLM engine sized by
    ``vllm_gpu_memory_utilization`` and ``max_model_len`` (see :func:`max_model_len`), with sleep mode on a GPU
    when ``vllm_enable_sleep_mode``; bfloat16 when the update trains in bf16."""
    if resolve_backend(p.backend) == "hf":
        return make_generator("hf", model, tokenizer, batch_size=p.questions_per_step * p.group_size)
    kw: dict[str, Any] = {"gpu_memory_utilization": p.vllm_gpu_memory_utilization, "seed": p.seed,
                          "max_model_len": max_model_len(tokenizer, model, questions, max_new_tokens)}
    if p.vllm_enable_sleep_mode:
        if torch.cuda.is_available():
            kw["enable_sleep_mode"] = True
        else:
            log.info("grpo.vllm_enable_sleep_mode: ignored on CPU (vLLM sleeps on CUDA only)")
    if bf16:
        kw["dtype"] = "bfloat16"
    return make_generator("vllm", model, tokenizer, **kw)


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def train_grpo(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: GrpoParams, *, ckpt_dir: Path | None,
               on_step: Callable[[dict[str, Any]], None] | None = None, first_step: int = 0, scorer: Any = None,
               heldout: HeldoutEval | None = None, rft_cache: dict[str, Any] | None = None,
               rft_steps: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run ``p.steps`` steps of ``p.algorithm`` (grpo, online_rft or rft) on ``model`` in place, resuming from the
    latest checkpoint in ``ckpt_dir`` (a run directory of stages.rl.checkpoint; None: no checkpoints). Returns
    (metric rows, sample rows, info).

    Steps run from ``first_step`` (iterative RL: global step numbers continue across iterations) to
    ``p.steps - 1``; the reference model is a copy of ``model`` as passed in (Algorithm 1: pi_ref <- pi_theta;
    grpo with beta > 0 only). ``scorer``: a reward model scorer for grpo_step (None: the rule / custom reward
    functions). ``heldout``: evaluated on rank 0 at its due steps. rft: the pool of offline samples is drawn from
    ``model`` as passed in (the SFT model) for every question of steps 0 .. ``rft_steps`` - 1 (default ``p.steps``),
    before any checkpoint is loaded, and kept in ``rft_cache["pool"]`` for later calls (iterations).
    The update runs through :class:`stages.rl.update.PolicyUpdater` (DeepSpeed when ``p.deepspeed.enabled`` or
    launched with several ranks; each rank then samples its share of every step's questions)."""
    algo = p.algorithm
    if algo == "sft":
        raise ValueError("train_grpo: algorithm sft has no sampling loop; see train_sft")
    reward_set = rule_reward_set() if algo != "grpo" else RewardSet.from_params(
        p.reward.accuracy_weight, p.reward.format_weight, p.reward.custom, p.reward.custom_weights)
    ref_model = None
    if algo == "grpo" and p.beta > 0:
        ref_model = copy.deepcopy(model).eval()
        for prm in ref_model.parameters():
            prm.requires_grad_(False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and p.questions_per_step < world:
        raise PipelineError(f"grpo.questions_per_step: {p.questions_per_step} is below the {world} ranks; each rank "
                            "samples its share of a step's questions, so give at least one per rank")
    questions = [r["question"] for r in rows] + ([r["question"] for r in heldout.rows] if heldout else [])
    gen_len = max(p.max_new_tokens, heldout.max_new_tokens if heldout else 0)
    bf16 = (p.deepspeed.enabled or world > 1) and use_bf16(p.precision, train_device())
    generator = rollout_generator(p, model, tokenizer, questions, gen_len, bf16=bf16)
    info: dict[str, Any] = {"resumed_from_step": None, "generation_backend": resolve_backend(p.backend)}
    pool: RftPool | None = None
    if algo == "rft":
        pool = rft_cache.get("pool") if rft_cache is not None else None
        if pool is None:
            t0 = time.perf_counter()
            qidx = run_questions(len(rows), rft_steps or p.steps, p.questions_per_step, p.seed, rank=rank, world=world)
            sp = SamplingParams(temperature=p.temperature, top_p=p.top_p, n=p.group_size,
                                max_new_tokens=p.max_new_tokens, seed=p.seed * 1_000_003 - 1)
            model.eval()
            pool = build_rft_pool(generator, rows, qidx, [chat_prompt(rows[q]["question"], "cot") for q in qidx], sp,
                                  lambda row, c: accuracy_reward(completion=c.text, answer=row["answer"]) == 1.0)
            if rft_cache is not None:
                rft_cache["pool"] = pool
            info["rft_pool_s"] = round(time.perf_counter() - t0, 2)
        info["rft_pool"] = pool.summary()
    history: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    start = first_step
    state = load_latest(ckpt_dir) if ckpt_dir is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        start, history = state["step"], state["history"]
        samples = state["extra"].get("samples", [])
        if heldout is not None:
            heldout.records = list(state["extra"].get("heldout", heldout.records))
        info["resumed_from_step"] = start
    upd = PolicyUpdater(model, lr=p.lr, weight_decay=p.weight_decay, max_grad_norm=p.max_grad_norm,
                        deepspeed=p.deepspeed, micro_batch_size=p.micro_batch_size, precision=p.precision)
    if state is not None and state.get("optimizer") is not None and not upd.distributed:
        upd.optimizer.load_state_dict(state["optimizer"])
    info["deepspeed_zero_stage"] = upd.zero_stage if upd.distributed else None
    info["world_size"] = upd.world
    offload = p.offload_idle_models
    if ref_model is not None:
        if upd.bf16:
            ref_model.to(torch.bfloat16)
        if not offload:
            ref_model.to(upd.device)
    if scorer is not None and not offload:
        scorer.rm.to(upd.device)
    logger = _logger()
    model.eval()
    _wake(generator)
    generator.sync_weights(model)
    if heldout is not None and _is_main() and heldout.due(start, p.steps) and start == first_step == 0:
        logger.info("held-out accuracy before step 1: %.3f", heldout.evaluate(0, generator))
    for step in range(start, p.steps):
        row, ro, rewards = grpo_step(step, p, model, tokenizer, ref_model, generator, upd, rows, reward_set,
                                     scorer=scorer, pool=pool, offload=offload)
        done = step + 1
        if heldout is not None and _is_main() and heldout.due(done, p.steps):
            row["heldout_accuracy"] = heldout.evaluate(done, generator)
        history.append(row)
        logger.info("%s step %d/%d: reward %.3f acc %.3f zero-std %.2f kl %.4f len %.1f | %.1fs (gen %.1f, upd %.1f)%s",
                    algo, done, p.steps, row["reward_mean"], row["accuracy"], row["zero_std_frac"], row["kl"],
                    row["completion_len"], row["step_s"], row["t_generation"], row["t_update"],
                    f" | held-out {row['heldout_accuracy']:.3f}" if "heldout_accuracy" in row else "")
        if ro is not None and p.log_completions_every and step % p.log_completions_every == 0:
            table = sample_table(step, ro, rewards)
            samples.extend(table)
            _publish_samples(step, table)
        if on_step is not None:
            on_step(row)
        if ckpt_dir is not None and p.checkpoint_every and (done % p.checkpoint_every == 0) and done < p.steps \
                and _is_main():
            save_checkpoint(ckpt_dir, model=model, optimizer=None if upd.distributed else upd.optimizer, step=done,
                            history=history, extra={"samples": samples,
                                                    "heldout": heldout.records if heldout is not None else []})
    _wake(generator)
    close = getattr(generator, "close", None)
    if callable(close) and resolve_backend(p.backend) == "vllm":
        close()
    info["reward_failures_by_fn"] = dict(reward_set.failures)
    return history, samples, info


def train_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: GrpoParams, *,
              heldout: HeldoutEval | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """algorithm sft: the continued SFT of stages.rl.baseline on the rows' gold CoT solutions, ``p.steps`` x
    ``iterative.iterations`` steps of ``questions_per_step`` questions (the GRPO question order) at ``p.lr``; one
    plain process (no DeepSpeed). ``heldout`` is evaluated with a generator of ``p.backend`` synced to the model."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
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

    hist = continued_sft(model, tokenizer, rows, steps=total, per_step=p.questions_per_step, seed=p.seed, lr=p.lr,
                         max_grad_norm=p.max_grad_norm, micro_batch_size=p.micro_batch_size, on_step=on_step)
    if heldout is not None:
        for r in heldout.records:
            if r["step"] > 0:
                hist[r["step"] - 1]["heldout_accuracy"] = r["heldout_accuracy"]
    if generator is not None and callable(getattr(generator, "close", None)) and resolve_backend(p.backend) == "vllm":
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


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(f"{sum(xs) / len(xs):.6g}") if xs else None


def summarize(history: list[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """Stage metrics from the per-step rows: first/last-window means and time totals."""
    if not history:
        return {}
    first, last = history[:window], history[-window:]
    out: dict[str, Any] = {"steps": len(history)}
    for k in ("reward_mean", "accuracy", "kl", "entropy", "completion_len", "zero_std_frac"):
        out[f"{k}_first{window}"] = _mean([r.get(k) for r in first])
        out[f"{k}_last{window}"] = _mean([r.get(k) for r in last])
    for k in ("t_generation", "t_scoring", "t_logprobs", "t_update", "step_s", "cpu_generation", "cpu_scoring",
              "cpu_logprobs", "cpu_update", "cpu_step_s"):
        out[f"{k}_total"] = round(sum(r.get(k, 0.0) for r in history), 2)
    out["step_s_mean"] = round(out["step_s_total"] / len(history), 3)
    out["n_reward_failures"] = sum(r.get("n_reward_failures", 0) for r in history)
    out["skipped_nonfinite"] = sum(r.get("skipped_nonfinite", 0) for r in history)
    out["mismatch_abs_mean"] = _mean([r.get("mismatch_abs_mean") for r in history])
    return out


def run(p: GrpoParams) -> dict[str, Any]:
    """Train the policy with ``p.algorithm`` and the continued-SFT baseline; write models, plots and metrics.

    Under a DeepSpeed launch with several ranks every rank trains; rank 0 alone writes outputs and runs the
    baseline, and the other ranks return an empty dict."""
    t_start = time.perf_counter()
    if p.num_threads:
        torch.set_num_threads(p.num_threads)
    prompts_path = p.prompts_file or paths.RL_PROMPTS
    rows = load_prompts(prompts_path)
    RewardSet.from_params(p.reward.accuracy_weight, p.reward.format_weight, p.reward.custom, p.reward.custom_weights)
    if p.baseline.enabled and any("cot" not in r for r in rows):
        raise PipelineError("grpo.baseline.enabled: the prompt rows have no 'cot' solutions; set it to false or add them")
    if p.algorithm == "sft" and any("cot" not in r for r in rows):
        raise PipelineError("grpo.algorithm sft trains on the prompt rows' 'cot' solutions, and some rows have none")
    init = paths.SFT_MODEL
    tokenizer = load_tokenizer(init)
    model = load_model(init)
    check_compatible(model, tokenizer, str(init))
    torch.manual_seed(p.seed)
    heldout = HeldoutEval.from_params(p.heldout)
    rm_dir = paths.REWARD_MODEL if p.reward_source in ("outcome_rm", "process_rm") else None
    ckpt_dir = run_dir(paths.CHECKPOINTS / "grpo", p.tracked_dump(), [init, prompts_path] + ([rm_dir] if rm_dir else []))
    if p.algorithm == "sft":
        history, samples, info = train_sft(model, tokenizer, rows, p, heldout=heldout)
    else:
        # Algorithm 1 (stages.rl.iterative): iterative.iterations x steps steps; iterations = 1 is plain GRPO
        train_fn = functools.partial(train_grpo, heldout=heldout, rft_cache={},
                                     rft_steps=p.steps * p.iterative.iterations)
        history, samples, info = run_iterations(model, tokenizer, rows, p, train_fn=train_fn, ckpt_dir=ckpt_dir,
                                                rm_dir=rm_dir, out_dir=paths.GRPO_ITERS)
    if not _is_main():
        return {}
    t_grpo = time.perf_counter() - t_start
    with atomic_path(paths.GRPO_MODEL) as tmp:
        model.to("cpu").save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # the held-out curve also travels with the (DVC-cached) model: benchmarks/paradigm.py reads it from there
        # when the git-ignored metrics file is not part of an experiment's commit
        (tmp / "pipeline.json").write_text(json.dumps({"stage": "grpo", "algorithm": p.algorithm, "init": str(init),
                                                       "params": p.tracked_dump(),
                                                       "heldout": heldout.metrics() if heldout else None},
                                                      indent=2) + "\n")
        with open(tmp / "samples.jsonl", "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s, ensure_ascii=False) + "\n")
    plot_dir = paths.plots_dir("grpo")
    write_plots(plot_dir, history, PLOT_METRICS + ("sft_loss", "nll"))
    metrics: dict[str, Any] = {"algorithm": p.algorithm, "grpo": summarize(history), "grpo_wall_s": round(t_grpo, 2),
                               **info}
    if heldout is not None:
        write_plots(plot_dir, heldout.records, ("heldout_accuracy",))
        metrics["heldout"] = heldout.metrics()

    t0 = time.perf_counter()
    del model
    base_model = load_model(init)
    torch.manual_seed(p.seed)
    if p.baseline.enabled:
        bh = continued_sft(base_model, tokenizer, rows, steps=p.steps * p.iterative.iterations,
                           per_step=p.questions_per_step, seed=p.seed,
                           lr=p.baseline.lr, max_grad_norm=p.max_grad_norm, micro_batch_size=p.micro_batch_size)
        save_model(base_model, tokenizer, paths.SFT_CONTINUED,
                   extra={"stage": "grpo", "baseline": "continued_sft", "init": str(init), "params": p.tracked_dump()})
        write_plots(plot_dir, bh, ("sft_loss",), prefix="baseline_")
        metrics["baseline"] = {"steps": len(bh), "sft_loss_first": round(bh[0]["sft_loss"], 4),
                               "sft_loss_last": round(bh[-1]["sft_loss"], 4)}
    else:
        save_model(base_model, tokenizer, paths.SFT_CONTINUED, extra={"stage": "grpo", "baseline": "disabled (copy of init)"})
        metrics["baseline"] = {"steps": 0}
    metrics["baseline_wall_s"] = round(time.perf_counter() - t0, 2)
    metrics["wall_s"] = round(time.perf_counter() - t_start, 2)
    write_metrics("grpo", metrics, ["algorithm", "world_size", "grpo.reward_mean_*", "grpo.accuracy_*", "grpo.kl_last5",
                                     "grpo.step_s_mean", "baseline.sft_loss_last", "heldout"])
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # finished: a later run starts afresh
    return metrics


if __name__ == "__main__":  # the DeepSpeed / torchrun entry (docs/real-mode.md); dvc runs python -m flows.grpo
    from stages.train.common import cli

    raise SystemExit(cli(GrpoParams, run))

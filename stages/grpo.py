"""The ``grpo`` stage: Group Relative Policy Optimisation from the SFT model (paper section 4, Algorithm 1 with
``iterative.iterations`` iterations: stages/rl/iterative.py), plus a continued-SFT baseline on the same questions
for the same number of steps. Rewards: rule functions, or a reward model (``reward_source``: outcome_rm /
process_rm, stages/rl/reward_model.py).

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

Outputs: data/models/grpo (policy), data/models/sft_continued (baseline), data/metrics/grpo.json,
data/plots/grpo/<metric>.csv (one curve per metric, x = step), data/models/grpo/samples.jsonl
(sampled completions every ``log_completions_every`` steps, also published as Prefect table artifacts
when run inside a flow), data/models/grpo_iters/ (per-iteration policies iter<k>/ for k < I and reward
models rm_iter<k>/, index iterations.json). Resumable from checkpoints/grpo (see stages.rl.checkpoint; with
several iterations, within the current iteration only: a restart redoes the earlier iterations).
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.generation import SamplingParams, make_generator, resolve_backend
from stages.core.io import atomic_path, write_json
from stages.core.modeling import check_compatible, load_model, load_tokenizer, save_model
from stages.core.prompts import chat_prompt
from stages.params import GrpoParams
from stages.rl.advantages import outcome_advantages
from stages.rl.baseline import continued_sft
from stages.rl.checkpoint import load_latest, run_dir, save_checkpoint
from stages.rl.data import load_prompts, step_questions
from stages.rl.iterative import run_iterations
from stages.rl.losses import LossNormalizer, grpo_loss
from stages.rl.rewards import RewardSet
from stages.rl.rollout import Rollout, build_rollout, mismatch_metrics, token_logprobs

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


def grpo_step(step: int, p: GrpoParams, model: Any, tokenizer: Any, ref_model: Any | None, generator: Any,
              optimizer: torch.optim.Optimizer, rows: list[dict[str, Any]], reward_set: RewardSet,
              scorer: Any = None) -> tuple[dict[str, Any], Rollout, torch.Tensor]:
    """One GRPO step (module docstring); returns (metrics row, rollout, (Q, G) rewards).

    ``scorer`` (stages.rl.reward_model.RewardModelScorer): with ``p.reward_source`` outcome_rm / process_rm the
    rewards and advantages come from the reward model (process: per-token advantages, paper 4.1.3); the rule
    reward functions are still scored for the accuracy metric."""
    m: dict[str, Any] = {"step": step}
    G = p.group_size
    # 1. rollouts
    t0, c0 = time.perf_counter(), time.process_time()
    batch = [rows[i] for i in step_questions(len(rows), step, p.questions_per_step, p.seed)]
    prompts = [chat_prompt(r["question"], "cot") for r in batch]
    model.eval()
    sp = SamplingParams(temperature=p.temperature, top_p=p.top_p, n=G, max_new_tokens=p.max_new_tokens,
                        seed=p.seed * 1_000_003 + step)
    completions = generator.generate(prompts, sp)
    ro = build_rollout(batch, prompts, completions, tokenizer, mask_truncated=p.mask_truncated)
    m["t_generation"], m["cpu_generation"] = time.perf_counter() - t0, time.process_time() - c0

    # 2. rewards, 3. advantages
    t0, c0 = time.perf_counter(), time.process_time()
    rewards, parts = score_rollout(ro, reward_set)
    if scorer is None:
        adv = outcome_advantages(rewards, scale_rewards=p.scale_rewards, eps=p.adv_eps)
    else:  # reward model: (Q, G) outcome or (Q, G, T) process advantages
        adv = scorer.advantages(ro, p.reward_source, scale_rewards=p.scale_rewards, eps=p.adv_eps)
        rewards = torch.where(adv.valid, adv.rewards, torch.full_like(adv.rewards, math.nan))
        m["rm_steps_mean"] = adv.n_steps_mean
    valid = adv.valid.view(-1)
    fin = rewards[torch.isfinite(rewards)]
    m["reward_mean"] = float(fin.mean()) if fin.numel() else math.nan
    m["reward_std"] = float(adv.group_std.mean())
    acc = [v for v in parts.get("accuracy", []) if math.isfinite(v)]
    m["accuracy"] = sum(acc) / len(acc) if acc else math.nan
    m["zero_std_frac"] = adv.n_zero_std_groups / rewards.shape[0]
    m["n_reward_failures"] = int((~valid).sum())
    lmask = ro.loss_mask.clone()
    lmask[~valid] = 0
    if p.skip_zero_std_groups:
        informative = (adv.advantages != 0).reshape(rewards.shape[0], -1).any(dim=1).repeat_interleave(G)
        lmask[~informative] = 0
    advantages = adv.advantages.float().flatten(0, 1)  # (N,) outcome or (N, T) process supervision
    m["completion_len"] = float(ro.completion_lengths.float().mean())
    m["truncated_frac"] = sum(r == "length" for r in ro.finish_reasons) / len(ro.finish_reasons)
    m["t_scoring"], m["cpu_scoring"] = time.perf_counter() - t0, time.process_time() - c0

    # 4. log-probs (pi_old unless fused into the update, pi_ref)
    t0, c0 = time.perf_counter(), time.process_time()
    train_rows = torch.nonzero(lmask.sum(-1) > 0).view(-1)
    m["n_train_outputs"] = int(train_rows.numel())
    fused_old = p.mu == 1 and p.minibatches == 1
    old_lp = torch.zeros_like(lmask)
    ref_lp = torch.zeros_like(lmask) if ref_model is not None else None
    with torch.no_grad():
        for sl in _micro_slices(train_rows, p.micro_batch_size):
            ids, att, t = _trim(ro, sl)
            if not fused_old:
                lp, _ = token_logprobs(model, ids, att, ro.prompt_len, p.temperature)
                old_lp[sl, :t] = lp
            if ref_model is not None:
                rlp, _ = token_logprobs(ref_model, ids, att, ro.prompt_len, p.temperature)
                ref_lp[sl, :t] = rlp
    m["t_logprobs"], m["cpu_logprobs"] = time.perf_counter() - t0, time.process_time() - c0

    # 5. updates
    t0, c0 = time.perf_counter(), time.process_time()
    model.train()
    gen = torch.Generator().manual_seed(p.seed * 7919 + step)
    sums: dict[str, float] = {"kl": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0, "ratio_mean": 0.0, "entropy": 0.0}
    n_tok_total = 0
    n_ent_tok = 0
    grad_norms, skipped, n_opt = [], 0, 0
    mismatch_lp = torch.zeros_like(lmask)
    for it in range(p.mu):
        order = train_rows[torch.randperm(train_rows.numel(), generator=gen)] if it or p.minibatches > 1 else train_rows
        for mb in order.tensor_split(p.minibatches) if order.numel() else []:
            if mb.numel() == 0:
                continue
            norm = LossNormalizer.from_mask(lmask[mb], max_len=p.max_new_tokens)
            optimizer.zero_grad(set_to_none=True)
            finite = True
            for sl in _micro_slices(mb, p.micro_batch_size):
                ids, att, t = _trim(ro, sl)
                lp, ent = token_logprobs(model, ids, att, ro.prompt_len, p.temperature, entropy=it == 0)
                old = lp.detach() if fused_old else old_lp[sl, :t]
                if it == 0:
                    mismatch_lp[sl, :t] = old if fused_old else old_lp[sl, :t]
                adv_sl = advantages[sl] if advantages.dim() == 1 else advantages[sl, :t]
                loss, lm = grpo_loss(lp, old, None if ref_lp is None else ref_lp[sl, :t], adv_sl, lmask[sl, :t],
                                     clip_eps=p.clip_eps, clip_eps_high=p.clip_eps_high, beta=p.beta,
                                     aggregation=p.aggregation, normalizer=norm)
                if not torch.isfinite(loss):
                    finite = False
                    break
                loss.backward()
                k = lm["n_tokens"]
                n_tok_total += k
                for key in ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean"):
                    sums[key] += lm[key] * k
                if ent is not None:
                    msk = lmask[sl, :t].bool()
                    sums["entropy"] += float(ent[msk].sum())
                    n_ent_tok += int(msk.sum())
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm) if finite else torch.tensor(math.nan)
            if finite and torch.isfinite(gn):
                optimizer.step()
                n_opt += 1
                grad_norms.append(float(gn))
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
    model.eval()
    generator.sync_weights(model)
    m["t_update"], m["cpu_update"] = time.perf_counter() - t0, time.process_time() - c0
    for key in ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean"):
        m[key] = sums[key] / n_tok_total if n_tok_total else 0.0
    m["entropy"] = sums["entropy"] / n_ent_tok if n_ent_tok else math.nan
    m["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else math.nan
    m["optimizer_steps"] = n_opt
    m["skipped_nonfinite"] = skipped
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


def train_grpo(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: GrpoParams, *, ckpt_dir: Path | None,
               on_step: Callable[[dict[str, Any]], None] | None = None, first_step: int = 0, scorer: Any = None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run ``p.steps`` GRPO steps on ``model`` in place, resuming from the latest checkpoint in ``ckpt_dir``
    (a run directory of stages.rl.checkpoint; None: no checkpoints). Returns (metric rows, sample rows, info).

    Steps run from ``first_step`` (iterative RL: global step numbers continue across iterations) to
    ``p.steps - 1``; the reference model is a copy of ``model`` as passed in (Algorithm 1: pi_ref <- pi_theta).
    ``scorer``: a reward model scorer for grpo_step (None: the rule / custom reward functions)."""
    reward_set = RewardSet.from_params(p.reward.accuracy_weight, p.reward.format_weight, p.reward.custom,
                                       p.reward.custom_weights)
    ref_model = None
    if p.beta > 0:
        ref_model = copy.deepcopy(model).eval()
        for prm in ref_model.parameters():
            prm.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    history: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    start = first_step
    info: dict[str, Any] = {"resumed_from_step": None}
    if ckpt_dir is not None:
        state = load_latest(ckpt_dir)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start, history = state["step"], state["history"]
            samples = state["extra"].get("samples", [])
            info["resumed_from_step"] = start
    logger = _logger()
    gen_kw = {"batch_size": p.questions_per_step * p.group_size} if resolve_backend(p.backend) == "hf" else {}
    generator = make_generator(p.backend, model, tokenizer, **gen_kw)
    generator.sync_weights(model)
    for step in range(start, p.steps):
        row, ro, rewards = grpo_step(step, p, model, tokenizer, ref_model, generator, optimizer, rows, reward_set,
                                     scorer=scorer)
        history.append(row)
        logger.info("grpo step %d/%d: reward %.3f acc %.3f zero-std %.2f kl %.4f len %.1f | %.1fs (gen %.1f, upd %.1f)",
                 step + 1, p.steps, row["reward_mean"], row["accuracy"], row["zero_std_frac"], row["kl"],
                 row["completion_len"], row["step_s"], row["t_generation"], row["t_update"])
        if p.log_completions_every and step % p.log_completions_every == 0:
            table = sample_table(step, ro, rewards)
            samples.extend(table)
            _publish_samples(step, table)
        if on_step is not None:
            on_step(row)
        done = step + 1
        if ckpt_dir is not None and p.checkpoint_every and (done % p.checkpoint_every == 0) and done < p.steps:
            save_checkpoint(ckpt_dir, model=model, optimizer=optimizer, step=done, history=history,
                            extra={"samples": samples})
    info["reward_failures_by_fn"] = dict(reward_set.failures)
    return history, samples, info


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
    """Train the GRPO policy and the continued-SFT baseline; write models, plots and metrics."""
    t_start = time.perf_counter()
    if p.num_threads:
        torch.set_num_threads(p.num_threads)
    prompts_path = p.prompts_file or paths.RL_PROMPTS
    rows = load_prompts(prompts_path)
    RewardSet.from_params(p.reward.accuracy_weight, p.reward.format_weight, p.reward.custom, p.reward.custom_weights)
    if p.baseline.enabled and any("cot" not in r for r in rows):
        raise PipelineError("grpo.baseline.enabled: the prompt rows have no 'cot' solutions; set it to false or add them")
    init = paths.SFT_MODEL
    tokenizer = load_tokenizer(init)
    model = load_model(init)
    check_compatible(model, tokenizer, str(init))
    torch.manual_seed(p.seed)
    rm_dir = None if p.reward_source == "rule" else paths.REWARD_MODEL
    ckpt_dir = run_dir(paths.CHECKPOINTS / "grpo", p.model_dump(), [init, prompts_path] + ([rm_dir] if rm_dir else []))
    # Algorithm 1 (stages.rl.iterative): iterative.iterations x steps GRPO steps; iterations = 1 is plain GRPO
    history, samples, info = run_iterations(model, tokenizer, rows, p, train_fn=train_grpo, ckpt_dir=ckpt_dir,
                                            rm_dir=rm_dir, out_dir=paths.GRPO_ITERS)
    t_grpo = time.perf_counter() - t_start
    with atomic_path(paths.GRPO_MODEL) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "pipeline.json").write_text(json.dumps({"stage": "grpo", "init": str(init), "params": p.model_dump()}, indent=2) + "\n")
        with open(tmp / "samples.jsonl", "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s, ensure_ascii=False) + "\n")
    plot_dir = paths.plots_dir("grpo")
    write_plots(plot_dir, history, PLOT_METRICS)
    metrics: dict[str, Any] = {"grpo": summarize(history), "grpo_wall_s": round(t_grpo, 2), **info}

    t0 = time.perf_counter()
    del model
    base_model = load_model(init)
    torch.manual_seed(p.seed)
    if p.baseline.enabled:
        bh = continued_sft(base_model, tokenizer, rows, steps=p.steps * p.iterative.iterations,
                           per_step=p.questions_per_step, seed=p.seed,
                           lr=p.baseline.lr, max_grad_norm=p.max_grad_norm, micro_batch_size=p.micro_batch_size)
        save_model(base_model, tokenizer, paths.SFT_CONTINUED,
                   extra={"stage": "grpo", "baseline": "continued_sft", "init": str(init), "params": p.model_dump()})
        write_plots(plot_dir, bh, ("sft_loss",), prefix="baseline_")
        metrics["baseline"] = {"steps": len(bh), "sft_loss_first": round(bh[0]["sft_loss"], 4),
                               "sft_loss_last": round(bh[-1]["sft_loss"], 4)}
    else:
        save_model(base_model, tokenizer, paths.SFT_CONTINUED, extra={"stage": "grpo", "baseline": "disabled (copy of init)"})
        metrics["baseline"] = {"steps": 0}
    metrics["baseline_wall_s"] = round(time.perf_counter() - t0, 2)
    metrics["wall_s"] = round(time.perf_counter() - t_start, 2)
    write_json(paths.metrics_file("grpo"), metrics)
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # finished: a later run starts afresh
    return metrics

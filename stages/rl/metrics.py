"""What an RL run reports: the step's reward, rollout and phase-time metrics, a log line per step (Prefect's run logger
inside a flow run), tables of sampled completions (kept beside the policy; Prefect table artifacts inside a flow run),
the stage summary of the per-step rows, and which rows become dvc plot curves (stages/core/plots.py writes them).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from stages.core.dist import all_reduce
from stages.core.progress import loadavg
from stages.rl.rewards import Rewards
from stages.rl.rollout import Rollout
from stages.rl.types import RewardStats

log = logging.getLogger(__name__)

PLOT_METRICS = (
    "reward_mean", "reward_std", "accuracy", "zero_std_frac", "kl", "clip_frac_low", "clip_frac_high", "entropy",
    "completion_len", "grad_norm", "loss", "mismatch_abs_mean", "t_generation", "t_scoring", "t_logprobs", "t_update",
    "value_loss", "vf_clip_frac", "value_mean", "value_grad_norm", "return_mean", "adv_abs_mean",
    "tool_programs", "tool_programs_per_s", "tool_wait_s", "tool_exec_s", "tool_wait_frac", "tir_rounds_mean",
    "accuracy_cot", "accuracy_pot", "accuracy_tir",
    # the recipes not in the paper (stages/rl/recipes.py, the gspo / cispo losses, the entropy bonus), when on
    "ds_rounds", "ds_generated_groups", "ds_kept_groups", "ds_shortfall", "ds_accuracy_generated",
    "overlong_penalty_mean", "overlong_frac", "entropy_bonus", "seq_ratio_mean", "clip_frac_high_pos",
    "curriculum_sampled_hard", "curriculum_sampled_easy", "curriculum_sampled_unseen", "curriculum_sampled_pass_rate_mean",
    # a reward-model source: its reward before the reshaping guards, the divergence guard's events (stages/rl/guards.py)
    "rm_raw_mean", "rm_divergence",
)
"""The per-step metrics drawn as curves (data/plots/grpo/<metric>.csv), besides the baseline's."""

class PhaseTimer:
    """Wall and CPU seconds per phase: ``with timer("update"): ...`` adds ``t_update`` and ``cpu_update``."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            for key, v in ((f"t_{name}", time.perf_counter() - t0), (f"cpu_{name}", time.process_time() - c0)):
                self.metrics[key] = self.metrics.get(key, 0.0) + v

    def totals(self) -> dict[str, float]:
        """The phase times plus ``step_s`` / ``cpu_step_s``, their sums."""
        m = dict(self.metrics)
        m["step_s"] = sum(v for k, v in m.items() if k.startswith("t_"))
        m["cpu_step_s"] = sum(v for k, v in m.items() if k.startswith("cpu_"))
        return m


def reward_metrics(stats: RewardStats, ro: Rollout | None) -> dict[str, float]:
    """Reward mean / std, accuracy, zero-std share and failures over every rank, completion length and truncation."""
    acc_sum, acc_n, rew_sum, rew_n, n_zero, n_groups, std_sum, n_fail = all_reduce(stats.as_list())
    N = 0 if ro is None else len(ro.texts)
    return {
        "reward_mean": rew_sum / rew_n if rew_n else math.nan,
        "reward_std": std_sum / n_groups if n_groups else math.nan,
        "accuracy": acc_sum / acc_n if acc_n else math.nan,
        "zero_std_frac": n_zero / n_groups if n_groups else math.nan,
        "n_reward_failures": int(n_fail),
        "completion_len": float(ro.completion_lengths.float().mean()) if ro is not None else math.nan,
        "truncated_frac": (sum(r == "length" for r in ro.finish_reasons) / N) if ro is not None and N else 0.0,
    }


def rollout_metrics(ro: Rollout | None, rewards: Rewards) -> dict[str, float]:
    """The sampling's own metrics (programs, sandbox time, TIR rounds: Rollout.metrics) and, when the step mixes
    rollout modes, the answer accuracy of each mode's outputs (``accuracy_<mode>``; this rank's)."""
    if ro is None:
        return {}
    m = dict(ro.metrics)
    acc = rewards.parts.get("accuracy")
    if acc is not None and len(set(ro.modes)) > 1:
        for mode in sorted(set(ro.modes)):
            vals = [a for a, md in zip(acc, ro.modes, strict=True) if md == mode and math.isfinite(a)]
            m[f"accuracy_{mode}"] = sum(vals) / len(vals) if vals else math.nan
    return m


def run_logger() -> Any:
    """Prefect's run logger inside a flow run (shown in the UI), else this module's logger."""
    try:
        from prefect import get_run_logger
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is not None:
            return get_run_logger()
    except ImportError:  # pragma: no cover
        pass
    return log


def log_step(logger: Any, algorithm: str, done: int, total: int, row: dict[str, Any], n_outputs: int = 0) -> None:
    """One line per step: rewards (and a reward model's before its reshaping guards), accuracy, zero-std share, KL,
    length, time and throughput (sampled tokens per second over the step's ``n_outputs`` outputs, the CPU cores the
    step used, the load average: why a step is slow) and the held-out accuracy."""
    n_gen = n_outputs * row["completion_len"]
    tok_s = n_gen / row["t_generation"] if row.get("t_generation") and math.isfinite(n_gen) else 0.0
    cores = row.get("cpu_step_s", 0.0) / row["step_s"] if row.get("step_s") else 0.0
    logger.info("%s step %d/%d: reward %.3f%s acc %.3f zero-std %.2f kl %.4f len %.1f | %.1fs (gen %.1f, upd %.1f; "
                "%.0f tok/s sampled, %.1f cores, load %.1f)%s",
                algorithm, done, total, row["reward_mean"],
                f" (rm {row['rm_raw_mean']:.3f})" if "rm_raw_mean" in row else "", row["accuracy"], row["zero_std_frac"], row["kl"],
                row["completion_len"], row["step_s"], row["t_generation"], row["t_update"], tok_s, cores, loadavg(),
                f" | held-out {row['heldout_accuracy']:.3f}" if "heldout_accuracy" in row else "")


def publish_samples(step: int, table: list[dict[str, Any]]) -> None:
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
    if any("ds_rounds" in r for r in history):  # dynamic sampling: the extra generation it cost
        for k in ("ds_rounds", "ds_generated_groups", "ds_kept_groups", "ds_shortfall"):
            out[f"{k}_total"] = round(sum(r.get(k, 0.0) for r in history), 2)
        out[f"ds_accuracy_generated_first{window}"] = mean_finite([r.get("ds_accuracy_generated") for r in first])
        out[f"ds_accuracy_generated_last{window}"] = mean_finite([r.get("ds_accuracy_generated") for r in last])
    out["n_reward_failures"] = sum(r.get("n_reward_failures", 0) for r in history)
    out["skipped_nonfinite"] = sum(r.get("skipped_nonfinite", 0) for r in history)
    out["mismatch_abs_mean"] = mean_finite([r.get("mismatch_abs_mean") for r in history])
    return out


def mean_finite(xs: list[Any]) -> float | None:
    """The mean of the finite values among ``xs`` (None and NaN skipped), to 6 significant digits; None if none."""
    v = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return float(f"{sum(v) / len(v):.6g}") if v else None

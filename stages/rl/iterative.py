"""Iterative GRPO, the paper's Algorithm 1 (section 4.1.4), around the GRPO training loop of stages.grpo.

::

    pi_theta <- pi_init (data/models/sft); r_phi <- data/models/reward_model (when the reward is a model)
    for iteration k = 1..I:
        pi_ref <- pi_theta                       (train_grpo copies the policy it starts from)
        M = grpo.steps GRPO steps, global step numbers (k-1)M .. kM-1 (question order and seeds continue)
        if r_phi is used: sample the current policy on RL problems, label the samples automatically,
            train r_phi further on them plus a replay of ``rm_replay_fraction`` (paper: 10%) of the
            historical examples; held-out AUCs of r_phi before / after, on the new policy's samples
        write pi_theta (iter<k>) and r_phi (rm_iter<k>)

Outputs (paths.GRPO_ITERS = data/models/grpo_iters/): ``iter<k>/`` the policy after iteration k for
k < I (the last iteration's policy is the stage's final policy, data/models/grpo, not duplicated),
``rm_iter<k>/`` the reward model after iteration k's update (with its ``examples.jsonl`` history), and
``iterations.json`` mapping every iteration to its policy / RM directories and metrics.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stages.core.dist import is_main_process, train_device
from stages.core.io import write_json
from stages.core.modeling import enable_checkpointing, save_model
from stages.rl.checkpoint import load_latest, save_checkpoint
from stages.rl.guards import guarded
from stages.rl.reward_model import (
    RewardModelSource,
    SampleConfig,
    StepLabelSource,
    collect_examples,
    evaluate_reward_model,
    load_examples,
    load_reward_model,
    replay_mix,
    save_reward_model,
    split_by_question,
    train_reward_model,
)
from stages.rl.update import release_memory, rl_updater

INDEX_FILE = "iterations.json"
ITERATIONS_DIR = "iterations"
"""Checkpoints of completed iterations, inside the stage's checkpoint directory."""


def rm_update_rows(rows: list[dict[str, Any]], n: int, seed: int, iteration: int) -> list[dict[str, Any]]:
    """The ``n`` RL problems whose policy samples feed iteration ``iteration``'s RM update (seeded draw)."""
    idx = list(range(len(rows)))
    random.Random(seed * 1_000_003 + 7 * iteration).shuffle(idx)
    return [rows[i] for i in idx[: min(n, len(rows))]]


def update_reward_model(rm: Any, tokenizer: Any, policy: Any, rows: list[dict[str, Any]], history: list[dict[str, Any]],
                        p: Any, iteration: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One RM update of Algorithm 1: new labelled samples of ``policy`` plus a replay of ``history``.

    ``p`` is the grpo params section (fields of ``p.iterative``). The RM trains through the policy's update path
    (stages.rl.update.rl_updater: DeepSpeed when the stage uses it, bf16 per ``grpo.compute.precision``, on the accelerator,
    gradient checkpointing per ``grpo.compute.gradient_checkpointing``) with a fresh AdamW at ``rm_lr`` for this update;
    several ranks sample, score and train on a share each. Afterwards the RM goes back to CPU memory when
    ``offload_idle_models``. Returns (new training examples, metrics)."""
    it = p.iterative
    gen_kw: dict[str, Any] = {"gpu_memory_utilization": p.rollout.vllm.gpu_memory_utilization, "seed": p.seed}
    if p.rollout.vllm.tensor_parallel_size > 1:
        gen_kw["tensor_parallel_size"] = p.rollout.vllm.tensor_parallel_size
    cfg = SampleConfig(samples_per_question=it.rm.samples_per_question, temperature=p.rollout.temperature,
                       max_new_tokens=p.rollout.max_new_tokens, labels=it.rm.labels, rollouts_per_step=it.rm.rollouts_per_step,
                       seed=p.seed * 31 + iteration, backend=p.rollout.backend, generator_kwargs=gen_kw)
    t0 = time.perf_counter()
    was_training = policy.training
    policy.eval()
    new = collect_examples(policy, tokenizer, rm_update_rows(rows, it.rm.questions, p.seed, iteration), cfg,
                           origin=f"iter{iteration}")
    policy.train(was_training)
    train, held = split_by_question(new, it.rm.heldout_fraction, p.seed + iteration)
    mixed, n_replay = replay_mix(train, history, it.rm.replay_fraction, p.seed + iteration)
    dev = train_device()
    rm.to(dev)
    n = it.rm.samples_per_question
    before = evaluate_reward_model(rm, tokenizer, held, it.rm.batch_size, shard=True, best_of=n)
    losses: list[float] = []
    if mixed:
        enable_checkpointing(rm, p.compute.gradient_checkpointing)
        upd = rl_updater(rm, p, lr=it.rm.lr, weight_decay=0.0, max_grad_norm=1.0, micro_batch_size=it.rm.batch_size)
        losses = train_reward_model(rm, tokenizer, mixed, epochs=it.rm.epochs, lr=it.rm.lr,
                                    batch_size=it.rm.batch_size, seed=p.seed + iteration, train_on=it.rm.train_on,
                                    updater=upd)
        del upd  # the optimizer (and a DeepSpeed engine) of this update only
    after = evaluate_reward_model(rm, tokenizer, held, it.rm.batch_size, shard=True, best_of=n)
    if p.compute.offload_idle_models:
        rm.to("cpu")
    release_memory()
    return train, {
        "n_new_examples": len(train), "n_heldout_examples": len(held), "n_history": len(history),
        "n_replayed": n_replay, "n_trained": len(mixed), "heldout_before_update": before, "heldout_after_update": after,
        "loss_per_epoch": [round(x, 5) for x in losses], "rm_update_s": round(time.perf_counter() - t0, 2),
    }


def run_iterations(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: Any, *, train_fn: Callable[..., Any],
                   ckpt_dir: Path | None, rm_dir: Path | None, out_dir: Path,
                   on_iteration: Callable[[int, Any, Any], None] | None = None,
                   cache: dict[str, Any] | None = None, heldout: Any = None,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Algorithm 1 (module docstring) on ``model`` in place; returns (metric rows, sample rows, info).

    ``train_fn`` is stages.grpo.train_grpo: ``train_fn(model, tokenizer, rows, p_k, ckpt_dir=, first_step=,
    scorer=)`` (``scorer``: the reward source of ``p.reward.source``, stages.rl.reward_model) runs the steps
    first_step .. p_k.steps - 1 and copies the model it starts from as pi_ref; it also gets ``cache=`` when
    ``cache`` is given (what later iterations continue with: rft's pool, PPO's value model).
    ``rm_dir``: the reward model to start from (None with the rule reward). ``on_iteration(k, model, rm)``
    is called after each iteration's outputs are written (tests use it). ``heldout``: the held-out evaluation
    whose records travel with the iteration checkpoints.

    Resuming (``ckpt_dir``, with several iterations): after each iteration but the last, the policy, the RM (after
    its update), the RM's replay history, the metric / sample rows, rft's pool and PPO's value model (with its
    optimizer) are checkpointed in ``ckpt_dir/iterations``; a restarted run continues after the last completed
    iteration, and inside an iteration from that iteration's GRPO checkpoints (``ckpt_dir/iter<k>``: policy and
    optimizer; pi_ref is the policy the iteration started from, i.e. the restored one).
    """
    n_iter, M = p.iterative.iterations, p.steps
    out_dir = Path(out_dir)
    main = is_main_process()  # several ranks (DeepSpeed launch): rank 0 writes
    offload = p.compute.offload_idle_models
    resumed = load_latest(Path(ckpt_dir) / ITERATIONS_DIR) if ckpt_dir is not None and n_iter > 1 else None
    if main and resumed is None:
        shutil.rmtree(out_dir, ignore_errors=True)  # no stale iter<k> of an earlier run with more iterations
        out_dir.mkdir(parents=True)
    rm = scorer = None
    history_ex: list[dict[str, Any]] = []
    if p.reward.source in ("outcome_rm", "process_rm"):
        assert rm_dir is not None
        dev = train_device()
        rm = load_reward_model(rm_dir, device="cpu" if offload else dev,
                               attn_implementation=p.compute.attn_implementation)
        history_ex = load_examples(rm_dir)
    history: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    info: dict[str, Any] = {"iterations": []}
    index: dict[str, Any] = {"iterations": []}
    first = 1
    if resumed is not None:
        ex = resumed["extra"]
        first = resumed["step"] + 1
        model.load_state_dict(ex["policy"])
        if rm is not None:
            rm.load_state_dict(ex["rm"])
            history_ex = ex["rm_history"]
        history, samples, info, index = resumed["history"], ex["samples"], ex["info"], ex["index"]
        if heldout is not None:
            heldout.records = list(ex["heldout"])
        if cache is not None:
            cache.update(ex["cache"])
            if "critic" in resumed.get("updaters", []):
                cache["critic_resume"] = resumed  # make_critic loads the value model and its optimizer from it
        info["resumed_from_iteration"] = resumed["step"]
    for k in range(first, n_iter + 1):
        t0 = time.perf_counter()
        if rm is not None:
            kind = "outcome" if p.reward.source == "outcome_rm" else "process"
            scorer = guarded(RewardModelSource(rm, tokenizer, kind, batch_size=p.optim.micro_batch_size), p.reward.rm_guards,
                             history_ex)
        elif p.reward.source == "process_rule":
            scorer = StepLabelSource(tokenizer)
        pk = p.model_copy(update={"steps": k * M})
        ck = None if ckpt_dir is None else (ckpt_dir if n_iter == 1 else Path(ckpt_dir) / f"iter{k}")
        kw = {"cache": cache} if cache is not None else {}
        h, s, inf = train_fn(model, tokenizer, rows, pk, ckpt_dir=ck, first_step=(k - 1) * M, scorer=scorer, **kw)
        for r in h:
            r["iteration"] = k
        history.extend(h)
        samples.extend(s)
        it_info: dict[str, Any] = {"iteration": k, "steps": len(h), "grpo_s": round(time.perf_counter() - t0, 2),
                                   "kl_first_step": h[0]["kl"] if h else None,
                                   "accuracy_mean": mean_finite([r.get("accuracy") for r in h]),
                                   "reward_mean": mean_finite([r.get("reward_mean") for r in h]),
                                   "resumed_from_step": inf.get("resumed_from_step")}
        for key, v in inf.items():
            if key != "resumed_from_step":
                info[key] = v
        entry: dict[str, Any] = {"iteration": k, "policy": None, "reward_model": None}
        if k < n_iter:
            pol_dir = out_dir / f"iter{k}"
            if main:
                save_model(model, tokenizer, pol_dir, extra={"stage": "grpo", "iteration": k, "steps": k * M})
            entry["policy"] = str(pol_dir)
        if rm is not None:
            new, rm_m = update_reward_model(rm, tokenizer, model, rows, history_ex, p, k)
            it_info["rm"] = rm_m
            history_ex = history_ex + new
            rm_out = out_dir / f"rm_iter{k}"
            if main:
                save_reward_model(rm, tokenizer, rm_out, history_ex, None,
                                  {"stage": "grpo", "iteration": k, "reward_source": p.reward.source,
                                   "metrics": untimed(rm_m)})
            entry["reward_model"] = str(rm_out)
        info["iterations"].append(it_info)
        index["iterations"].append(entry)
        if ckpt_dir is not None and k < n_iter:
            _save_iteration(Path(ckpt_dir), k, model, rm, history_ex, history, samples, info, index, heldout, cache)
        if on_iteration is not None:
            on_iteration(k, model, rm)
    if main:
        write_json(out_dir / INDEX_FILE, {**index, "final_policy": "data/models/grpo (the stage's final policy)",
                                          "metrics": untimed(info["iterations"])})
    return history, samples, info


UNTIMED_DROP = ("resumed_from_step", "resumed_from_iteration", "tool_wait_share_of_step")
"""Keys :func:`untimed` drops besides the timings: whether (and where) a run resumed, a share of time."""


def untimed(x: Any) -> Any:
    """``x`` (nested dicts / lists) without its timings, for a DVC-cached output, which must be the same bytes for
    the same inputs: keys ending in ``_s`` or holding ``_s_`` (seconds, ``step_s_mean``, ``tool_wait_s_total``),
    ``t_*`` / ``cpu_*`` (time totals) and :data:`UNTIMED_DROP`. The timings are in the stage's metrics."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items()
                if not (str(k).endswith("_s") or "_s_" in str(k) or str(k).startswith(("t_", "cpu_"))
                        or k in UNTIMED_DROP)}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


def _save_iteration(ckpt_dir: Path, k: int, model: Any, rm: Any, history_ex: list[dict[str, Any]],
                    history: list[dict[str, Any]], samples: list[dict[str, Any]], info: dict[str, Any],
                    index: dict[str, Any], heldout: Any, cache: dict[str, Any] | None) -> None:
    """The state after iteration ``k`` (run_iterations' docstring), as checkpoint ``k`` of ``ckpt_dir/iterations``;
    the iteration's own GRPO checkpoints are removed."""
    critic = (cache or {}).get("critic")
    kept = {key: v for key, v in (cache or {}).items() if key == "pool"}
    extra = {"policy": model.state_dict(), "rm": rm.state_dict() if rm is not None else None, "rm_history": history_ex,
             "samples": samples, "info": info, "index": index, "cache": kept,
             "heldout": list(heldout.records) if heldout is not None else []}
    save_checkpoint(ckpt_dir / ITERATIONS_DIR, updaters={"critic": critic.updater} if critic is not None else {},
                    step=k, history=history, extra=extra)
    if is_main_process():
        shutil.rmtree(ckpt_dir / f"iter{k}", ignore_errors=True)


def mean_finite(xs: list[Any]) -> float | None:
    """The mean of the finite values among ``xs`` (None and NaN skipped), to 6 significant digits; None if none."""
    v = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return float(f"{sum(v) / len(v):.6g}") if v else None


def snapshot(model: Any) -> dict[str, torch.Tensor]:
    """A detached copy of a model's weights (tests compare policies across iterations)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}



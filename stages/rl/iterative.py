"""Iterative GRPO, the paper's Algorithm 1 (section 4.1.4), around the RL loop (stages/rl/loop.py).

::

    pi_theta <- pi_init (data/models/sft); r_phi <- data/models/reward_model (a reward-model source)
    for iteration k = 1..I:                      (I = 1: plain RL)
        pi_ref <- pi_theta                       (loop.begin_iteration copies the policy as it is)
        M = grpo.steps steps, global step numbers (k-1)M .. kM-1 (loop.train; question order and seeds continue)
        if r_phi is used: sample the current policy on RL problems, label the samples automatically,
            train r_phi further on them plus a replay of ``iterative.rm.replay_fraction`` (paper: 10%) of the
            historical examples; held-out AUCs of r_phi before / after, on the new policy's samples
        write pi_theta (iter<k>) and r_phi (rm_iter<k>)

Outputs (paths.GRPO_ITERS = data/models/grpo_iters/): ``iter<k>/`` the policy after iteration k for
k < I (the last iteration's policy is the stage's final policy, data/models/grpo, not duplicated),
``rm_iter<k>/`` the reward model after iteration k's update (with its ``examples.jsonl`` history), and
``iterations.json`` mapping every iteration to its policy / RM directories and metrics.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stages.core.dist import is_main_process, train_device
from stages.core.io import untimed, write_json
from stages.core.modeling import enable_checkpointing, release_memory, save_model
from stages.rl import lora
from stages.rl.checkpoint import load_latest, save_checkpoint
from stages.rl.loop import begin_iteration, train
from stages.rl.metrics import mean_finite
from stages.rl.rm.labels import SampleConfig, collect_examples
from stages.rl.rm.metrics import evaluate_reward_model
from stages.rl.rm.model import save_reward_model
from stages.rl.rm.train import replay_mix, split_by_question, train_reward_model
from stages.rl.types import LoopState, Models, RunSpec
from stages.rl.update import rl_updater

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
    (stages.rl.update.rl_updater: DeepSpeed when the stage uses it, bf16 per ``grpo.compute.precision``, on the
    accelerator, gradient checkpointing per ``grpo.compute.gradient_checkpointing``) with a fresh AdamW at
    ``iterative.rm.lr`` for this update;
    several ranks sample, score and train on a share each. Afterwards the RM goes back to CPU memory when
    ``compute.offload_idle_models``. Returns (new training examples, metrics)."""
    it = p.iterative
    gen_kw: dict[str, Any] = {"gpu_memory_utilization": p.rollout.vllm.gpu_memory_utilization, "seed": p.seed}
    if p.rollout.vllm.tensor_parallel_size > 1:
        gen_kw["tensor_parallel_size"] = p.rollout.vllm.tensor_parallel_size
    cfg = SampleConfig(samples_per_question=it.rm.samples_per_question, temperature=p.rollout.temperature,
                       max_new_tokens=p.rollout.max_new_tokens, labels=it.rm.labels,
                       rollouts_per_step=it.rm.rollouts_per_step, seed=p.seed * 31 + iteration,
                       backend=p.rollout.backend, generator_kwargs=gen_kw)
    t0 = time.perf_counter()
    was_training = policy.training
    policy.eval()
    sampler = lora.plain_copy(policy) if lora.has_lora(policy) else policy  # a LoRA policy: its merged weights
    new = collect_examples(sampler, tokenizer, rm_update_rows(rows, it.rm.questions, p.seed, iteration), cfg,
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
                                    updater=upd, objective=it.rm.objective, pair_weight=it.rm.pair_weight)
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


def run_iterations(run: RunSpec, models: Models, state: LoopState, *, ckpt_dir: Path | None, out_dir: Path,
                   on_iteration: Callable[[int, Any, Any], None] | None = None) -> list[dict[str, Any]]:
    """Algorithm 1 (module docstring) on the policy of ``models`` (stages.rl.loop.setup) in place: for each
    iteration, :func:`stages.rl.loop.begin_iteration` (pi_ref <- pi_theta, the reward source on the current RM) and
    :func:`stages.rl.loop.train` over its ``grpo.steps`` steps, then with a reward-model source the RM update; the
    rows go to ``state.history`` / ``state.samples``, the iterations' facts to ``state.info["iterations"]``. Returns
    the metric rows. ``on_iteration(k, model, rm)`` is called after each iteration's outputs are written (tests).

    Resuming (``ckpt_dir``, with several iterations): after each iteration but the last, the policy, the RM (after
    its update), its replay history, the rows, rft's pool and PPO's value model (with its optimizer) are checkpointed
    in ``ckpt_dir/iterations``; a restarted run continues after the last completed iteration, and inside an iteration
    from that iteration's checkpoints (``ckpt_dir/iter<k>``; pi_ref is the policy the iteration started from)."""
    n_iter, M = run.p.iterative.iterations, run.p.steps
    out_dir, main = Path(out_dir), is_main_process()
    index: dict[str, Any] = {"iterations": []}
    state.info.setdefault("iterations", [])
    first = _resume_iterations(models, state, ckpt_dir, index, run) if ckpt_dir is not None and n_iter > 1 else 1
    if main and first == 1:
        shutil.rmtree(out_dir, ignore_errors=True)  # no stale iter<k> of an earlier run with more iterations
        out_dir.mkdir(parents=True)
    for k in range(first, n_iter + 1):
        t0 = time.perf_counter()
        begin_iteration(run, models, state, k,
                        None if ckpt_dir is None else (ckpt_dir if n_iter == 1 else Path(ckpt_dir) / f"iter{k}"))
        train(run, models, state, (k - 1) * M, k * M)
        h = [r for r in state.history if r.get("iteration") == k]
        it_info: dict[str, Any] = {"iteration": k, "steps": len(h), "grpo_s": round(time.perf_counter() - t0, 2),
                                   "kl_first_step": h[0]["kl"] if h else None,
                                   "accuracy_mean": mean_finite([r.get("accuracy") for r in h]),
                                   "reward_mean": mean_finite([r.get("reward_mean") for r in h]),
                                   "resumed_from_step": state.info.pop("resumed_from_step", None)}
        entry = _finish_iteration(run.p, models, run.rows, k, out_dir, it_info)
        state.info["iterations"].append(it_info)
        index["iterations"].append(entry)
        if ckpt_dir is not None and k < n_iter and not state.stopped:
            _save_iteration(Path(ckpt_dir), k, run, models, state, index)
        if on_iteration is not None:
            on_iteration(k, models.policy, models.reward_model)
        if state.stopped:  # grpo.reward.rm_guards.divergence stopped the run: no iteration after this one
            break
    if main:
        write_json(out_dir / INDEX_FILE, {**index, "final_policy": "data/models/grpo (the stage's final policy)",
                                          "metrics": untimed(state.info["iterations"])})
    return state.history


def _finish_iteration(p: Any, models: Models, rows: list[dict[str, Any]], k: int, out_dir: Path,
                      it_info: dict[str, Any]) -> dict[str, Any]:
    """After iteration ``k``'s steps: its policy (all but the last iteration's) and, with a reward-model source, the
    RM update; returns the iteration's index entry."""
    main = is_main_process()
    entry: dict[str, Any] = {"iteration": k, "policy": None, "reward_model": None}
    if k < p.iterative.iterations:
        pol_dir = out_dir / f"iter{k}"
        if main:
            save_model(lora.exported(models.policy), models.tokenizer, pol_dir,
                       extra={"stage": "grpo", "iteration": k, "steps": k * p.steps})
        entry["policy"] = str(pol_dir)
    rm = models.reward_model
    if rm is not None:
        new, rm_m = update_reward_model(rm, models.tokenizer, models.policy, rows, models.rm_examples, p, k)
        it_info["rm"] = rm_m
        models.rm_examples = models.rm_examples + new
        rm_out = out_dir / f"rm_iter{k}"
        if main:
            save_reward_model(rm, models.tokenizer, rm_out, models.rm_examples, None,
                              {"stage": "grpo", "iteration": k, "reward_source": p.reward.source,
                               "metrics": untimed(rm_m)})
        entry["reward_model"] = str(rm_out)
    return entry


def _resume_iterations(models: Models, state: LoopState, ckpt_dir: Path, index: dict[str, Any], run: RunSpec) -> int:
    """Restore the state after the last completed iteration from ``ckpt_dir/iterations`` (:func:`_save_iteration`);
    returns the iteration to run next (1 when there is none)."""
    resumed = load_latest(Path(ckpt_dir) / ITERATIONS_DIR)
    if resumed is None:
        return 1
    ex = resumed["extra"]
    models.policy.load_state_dict(ex["policy"])
    if models.reward_model is not None:
        models.reward_model.load_state_dict(ex["rm"])
        models.rm_examples = ex["rm_history"]
    state.history, state.samples = resumed["history"], ex["samples"]
    state.info.update(ex["info"])
    index.update(ex["index"])
    if run.heldout is not None:
        run.heldout.records = list(ex["heldout"])
    models.pool = ex.get("pool")
    if "critic" in resumed.get("updaters", []):
        state.resumed = resumed  # the value model and its optimizer load from it when it is built
    state.info["resumed_from_iteration"] = resumed["step"]
    state.step = resumed["step"] * run.p.steps
    return resumed["step"] + 1


def _save_iteration(ckpt_dir: Path, k: int, run: RunSpec, models: Models, state: LoopState,
                    index: dict[str, Any]) -> None:
    """The state after iteration ``k`` (:func:`run_iterations`' docstring), as checkpoint ``k`` of
    ``ckpt_dir/iterations``; the iteration's own RL checkpoints are removed."""
    critic, rm = models.critic, models.reward_model
    extra = {"policy": models.policy.state_dict(), "rm": rm.state_dict() if rm is not None else None,
             "rm_history": models.rm_examples, "samples": state.samples, "info": state.info, "index": index,
             "pool": models.pool, "heldout": list(run.heldout.records) if run.heldout is not None else []}
    save_checkpoint(ckpt_dir / ITERATIONS_DIR, updaters={"critic": critic.updater} if critic is not None else {},
                    step=k, history=state.history, extra=extra)
    if is_main_process():
        shutil.rmtree(ckpt_dir / f"iter{k}", ignore_errors=True)


def snapshot(model: Any) -> dict[str, torch.Tensor]:
    """A detached copy of a model's weights (tests compare policies across iterations)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}



"""The ``reward_model`` stage: a neural reward model for GRPO (paper sections 4.1.3-4.1.4), trained on data
labelled automatically from samples of the SFT policy on RL problems.

1. sample ``samples_per_question`` CoT outputs for ``questions`` RL problems from data/models/sft (one batched
   generation call);
2. label them (stages.rl.rm.labels): outcome = final answer right; step labels from the problems'
   known intermediate values (``labels: values``) or Math-Shepherd completion rollouts (``rollouts``);
3. split by question into train / held-out, initialise the RM from ``init`` (sft, or pretrain: the paper
   initialises it from DeepSeekMath-Base 7B, our pretrain stage's counterpart), train it with binary
   cross-entropy on the step ends (``train_on: process``) or on the last token (``outcome``);
4. report, on the held-out questions, outcome AUC (last-token score vs answer correctness), step AUC (step-end
   scores vs the training labels), step AUC against the exact ``values`` labels (whatever the training labels
   were), and best-of-n reranking of the SFT samples scored by the rule grader, before and after training.

Resumable: the labelled examples are written to ``checkpoints/reward_model/<run hash>/examples.jsonl`` once
sampled, and the training state (the Updater's weights and optimizer, under DeepSpeed the engine's own checkpoint;
position, losses) to ``step-N/`` every ``checkpoint_every`` optimizer steps (stages.rl.checkpoint); an interrupted stage restarts from there with the same batches in the same
order, and the run directory is removed when the stage finishes.

``enabled: false``: nothing is trained; data/models/reward_model/ holds only a ``DISABLED`` note (for GRPO with
the rule reward, which never reads it).
Real mode: the policy and the RM load in the training dtype on the accelerator; the RM trains through the one
update path (stages.train.update.Updater; DeepSpeed ZeRO 0-2 when ``deepspeed.enabled`` or launched with
``deepspeed --module stages.reward_model``, bf16 per ``precision``); several ranks sample, score and train on a
share each (stages.rl.rm) and rank 0 writes the outputs.

Outputs: data/models/reward_model/ (HF directory, ``AutoModelForTokenClassification`` with one label, plus
``examples.jsonl``: the training examples, the replay history of iterative GRPO, and ``heldout.jsonl``),
data/metrics/reward_model.json.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from stages.core import hardware, paths, threads
from stages.core.dist import barrier, is_main_process, train_device, world_size
from stages.core.errors import PipelineError
from stages.core.generation import resolve_backend
from stages.core.io import atomic_path, read_jsonl, write_json, write_jsonl, write_metrics
from stages.core.modeling import check_compatible, enable_checkpointing, load_model, load_tokenizer, release_memory
from stages.rl.checkpoint import load_latest, load_updaters, run_dir, save_checkpoint
from stages.rl.data import load_prompts
from stages.rl.rm.labels import SampleConfig, collect_examples
from stages.rl.rm.metrics import evaluate_reward_model
from stages.rl.rm.model import init_reward_model, save_reward_model
from stages.rl.rm.train import split_by_question, train_reward_model
from stages.schema.reward_model import RewardModelParams
from stages.train.ds_config import build_deepspeed_config
from stages.train.update import Updater, use_bf16, use_deepspeed

INIT_MODELS = {"sft": paths.SFT_MODEL, "pretrain": paths.PRETRAIN_MODEL, "base": paths.BASE_MODEL}
"""``reward_model.init`` -> the model whose backbone the RM starts from."""
EXAMPLES_CKPT = "examples.jsonl"
UPDATER = "reward_model"
"""The RM's name in the stage's training checkpoints (stages.rl.checkpoint)."""


def labelled_examples(p: RewardModelParams, rows: list[dict[str, Any]], ckpt: Path, *, dtype: torch.dtype,
                      device: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The labelled samples of the SFT model: read from the run's checkpoint when a previous attempt got that far,
    else sampled (the SFT model loaded in ``dtype`` onto ``device``; several ranks: a block of the rows each),
    labelled and checkpointed (atomically, by rank 0). Returns (examples, counts; ``resumed`` says which)."""
    done = ckpt / EXAMPLES_CKPT
    if done.is_file():
        info = json.loads((ckpt / "examples.json").read_text()) if (ckpt / "examples.json").is_file() else {}
        return read_jsonl(done), {**info, "resumed": True}
    tokenizer = load_tokenizer(paths.SFT_MODEL)
    policy = load_model(paths.SFT_MODEL, dtype=dtype, device=device, attn_implementation=p.attn_implementation)
    check_compatible(policy, tokenizer, str(paths.SFT_MODEL))
    torch.manual_seed(p.seed)
    cfg = SampleConfig(samples_per_question=p.samples_per_question, temperature=p.temperature,
                       max_new_tokens=p.max_new_tokens, labels=p.labels, rollouts_per_step=p.rollouts_per_step,
                       seed=p.seed, backend=p.backend)
    t0 = time.perf_counter()
    counts: dict[str, Any] = {}
    examples = collect_examples(policy, tokenizer, rows, cfg, origin="sft", stats=counts)  # several ranks: a block each
    del policy
    release_memory()
    counts["sampling_s"] = round(time.perf_counter() - t0, 2)
    if is_main_process():
        ckpt.mkdir(parents=True, exist_ok=True)
        write_json(ckpt / "examples.json", counts)
        write_jsonl(done, examples)  # written last (atomically): its presence marks the labelling done
    barrier()
    return examples, {**counts, "resumed": False}


def _disabled(t_start: float) -> dict[str, Any]:
    """``enabled: false``: data/models/reward_model holds only a note."""
    with atomic_path(paths.REWARD_MODEL) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "DISABLED").write_text("reward_model.enabled: false; no reward model was trained\n")
    off = {"enabled": False, "wall_s": round(time.perf_counter() - t_start, 2)}
    write_metrics("reward_model", off, ["enabled"])
    return off


def _updater(rm: Any, p: RewardModelParams, ds: bool, bf16: bool) -> Updater:
    """The RM's update path: AdamW at ``p.lr``, clipping at 1, DeepSpeed (ZeRO 0-2, a rank's share of each batch)."""
    return Updater(rm, max_grad_norm=1.0, optimizer=torch.optim.AdamW(rm.parameters(), lr=p.lr, weight_decay=0.0),
                   deepspeed=build_deepspeed_config(
                       zero_stage=p.deepspeed.zero_stage, offload_optimizer=p.deepspeed.offload_optimizer,
                       micro_batch_size=max(1, -(-p.batch_size // world_size())), grad_accum=1, max_grad_norm=1.0,
                       bf16=bf16) if ds else None)


def run(p: RewardModelParams) -> dict[str, Any]:
    """Sample, label, train and evaluate the reward model; write it and its metrics."""
    t_start = time.perf_counter()
    if not p.enabled:
        return _disabled(t_start)
    threads.use(p.num_threads)  # at most num_threads, fewer while other work competes (stages/core/threads.py)
    prompts_path = p.prompts_file
    rows = load_prompts(prompts_path)[: p.questions]
    if p.labels == "values" and any("values" not in r for r in rows):
        raise PipelineError(f"reward_model.labels: 'values' needs rows with a 'values' field in {prompts_path}; use 'rollouts'")
    init = INIT_MODELS[p.init]
    if not init.exists():
        raise PipelineError(f"reward_model.init: {p.init} = {init} not found; run the stage that writes it (dvc repro)")
    dev = train_device()
    ds = use_deepspeed(p.deepspeed.enabled)
    bf16 = ds and use_bf16(p.precision, dev)
    dtype = torch.bfloat16 if bf16 else torch.float32
    ckpt = run_dir(paths.CHECKPOINTS / "reward_model", p.tracked_dump(), [paths.SFT_MODEL, init, prompts_path])
    examples, label_info = labelled_examples(p, rows, ckpt, dtype=dtype, device=dev)
    t_sample = time.perf_counter() - t_start
    train, held = split_by_question(examples, p.heldout_fraction, p.seed)
    if not train:
        raise PipelineError("reward_model: no training examples; raise questions or lower heldout_fraction")

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(paths.SFT_MODEL)  # the samples' tokens
    torch.manual_seed(p.seed)
    rm = init_reward_model(init, dtype=dtype, device=dev, attn_implementation=p.attn_implementation)
    check_compatible(rm, tokenizer, str(init))
    enable_checkpointing(rm, p.gradient_checkpointing)
    upd = _updater(rm, p, ds, bf16)
    state = load_latest(ckpt)
    if state is not None:
        load_updaters(state, {UPDATER: upd})  # weights, optimizer (a DeepSpeed engine's own checkpoint)
        before = state["extra"]["heldout_before_training"]
        resume: dict[str, Any] | None = {"step": state["step"], "loss_sums": state["extra"]["loss_sums"]}
    else:
        before = evaluate_reward_model(rm, tokenizer, held, p.batch_size, best_of=p.best_of_n, shard=True)
        resume = None

    def on_step(step: int, u: Updater, sums: list[list[float]]) -> None:
        if p.checkpoint_every and step % p.checkpoint_every == 0:  # every rank (its DeepSpeed partition)
            save_checkpoint(ckpt, updaters={UPDATER: u}, step=step, history=[],
                            extra={"loss_sums": sums, "heldout_before_training": before})

    losses = train_reward_model(rm, tokenizer, train, epochs=p.epochs, lr=p.lr, batch_size=p.batch_size, seed=p.seed,
                                train_on=p.train_on, updater=upd, resume=resume, on_step=on_step,
                                objective=p.objective, pair_weight=p.pair_weight)
    after = evaluate_reward_model(rm, tokenizer, held, p.batch_size, best_of=p.best_of_n, shard=True)
    train_eval = evaluate_reward_model(rm, tokenizer, train, p.batch_size, shard=True)
    t_train = time.perf_counter() - t0
    if not is_main_process():
        return {}
    hw = {**hardware.record(dev, p.precision, bf16), "generation_backend": resolve_backend(p.backend)}
    save_reward_model(rm.to("cpu"), tokenizer, paths.REWARD_MODEL, train, held,
                      {"stage": "reward_model", "init": str(init), "labels": p.labels, "train_on": p.train_on,
                       "params": p.tracked_dump(), "hardware": hw})
    metrics: dict[str, Any] = {
        "heldout": after,
        "heldout_before_training": before,
        "train": train_eval,
        "outcome_auc": after["outcome_auc"],
        "step_auc": after["step_auc"],
        "step_auc_values": after["step_auc_values"],
        "best_of_n": after.get("best_of_n"),
        "init": p.init,
        "hardware": hw,
        "n_questions": len(rows),
        "n_train_examples": len(train),
        "n_heldout_examples": len(held),
        "labelling": label_info,
        "resumed_from_step": None if state is None else state["step"],
        "loss_per_epoch": [round(x, 5) for x in losses],
        "sampling_s": round(t_sample, 2),
        "training_s": round(t_train, 2),
        "wall_s": round(time.perf_counter() - t_start, 2),
    }
    write_metrics("reward_model", metrics, ["outcome_auc", "step_auc", "step_auc_values", "best_of_n.rm_last",
                                            "best_of_n.random", "n_train_examples", "hardware"])
    shutil.rmtree(ckpt, ignore_errors=True)  # finished: a later run starts afresh
    return metrics


if __name__ == "__main__":  # the DeepSpeed / torchrun entry (docs/real-mode.md); dvc runs python -m flows.reward_model
    from stages.core.cli import cli

    raise SystemExit(cli(RewardModelParams, run))

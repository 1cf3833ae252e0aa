"""The ``reward_model`` stage: a neural reward model for GRPO (paper sections 4.1.3-4.1.4), trained on data
labelled automatically from samples of the SFT policy on RL problems.

1. sample ``samples_per_question`` CoT outputs for ``questions`` RL problems from data/models/sft;
2. label them (stages.rl.reward_model): outcome = final answer right; step labels from the problems'
   known intermediate values (``labels: values``) or Math-Shepherd completion rollouts (``rollouts``);
3. split by question into train / held-out, initialise the RM from the SFT model (the paper initialises
   it from DeepSeekMath-Base 7B; here the SFT model, whose backbone knows the answer format), train it
   with binary cross-entropy on the step ends (``train_on: process``) or on the last token (``outcome``);
4. report held-out outcome AUC (last-token score vs answer correctness) and step AUC (step-end scores vs
   step labels), before and after training.

``enabled: false``: nothing is trained; data/models/reward_model/ holds only a ``DISABLED`` note (for GRPO with
the rule reward, which never reads it).
Real mode: the policy and the RM load in the training dtype on the accelerator; the RM trains through the one
update path (stages.train.update.Updater; DeepSpeed ZeRO 0-2 when ``deepspeed.enabled`` or launched with
``deepspeed --module stages.reward_model``, bf16 per ``precision``); several ranks sample, score and train on a
share each (stages.rl.reward_model) and rank 0 writes the outputs.

Outputs: data/models/reward_model/ (HF directory, ``AutoModelForTokenClassification`` with one label, plus
``examples.jsonl``: the training examples, the replay history of iterative GRPO, and ``heldout.jsonl``),
data/metrics/reward_model.json.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from stages.core import paths
from stages.core.dist import is_main_process, train_device, world_size
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, write_metrics
from stages.core.modeling import check_compatible, enable_checkpointing, load_model, load_tokenizer
from stages.rl.data import load_prompts
from stages.rl.reward_model import (
    SampleConfig,
    collect_examples,
    evaluate_reward_model,
    init_reward_model,
    save_reward_model,
    split_by_question,
    train_reward_model,
)
from stages.rl.update import release_memory
from stages.schema.reward_model import RewardModelParams
from stages.train.ds_config import build_deepspeed_config
from stages.train.loop import use_bf16
from stages.train.update import Updater, use_deepspeed


def run(p: RewardModelParams) -> dict[str, Any]:
    """Sample, label, train and evaluate the reward model; write it and its metrics."""
    t_start = time.perf_counter()
    if not p.enabled:
        with atomic_path(paths.REWARD_MODEL) as tmp:
            tmp.mkdir(parents=True)
            (tmp / "DISABLED").write_text("reward_model.enabled: false; no reward model was trained\n")
        off = {"enabled": False, "wall_s": round(time.perf_counter() - t_start, 2)}
        write_metrics("reward_model", off, ["enabled"])
        return off
    if p.num_threads:
        torch.set_num_threads(p.num_threads)
    prompts_path = p.prompts_file
    rows = load_prompts(prompts_path)
    if p.labels == "values" and any("values" not in r for r in rows[: p.questions]):
        raise PipelineError(f"reward_model.labels: 'values' needs rows with a 'values' field in {prompts_path}; use 'rollouts'")
    rows = rows[: p.questions]
    init = paths.SFT_MODEL
    tokenizer = load_tokenizer(init)
    dev = train_device()
    ds = use_deepspeed(p.deepspeed.enabled)
    bf16 = ds and use_bf16(p.precision, dev)
    dtype = torch.bfloat16 if bf16 else torch.float32
    policy = load_model(init, dtype=dtype, device=dev, attn_implementation=p.attn_implementation)
    check_compatible(policy, tokenizer, str(init))
    torch.manual_seed(p.seed)
    cfg = SampleConfig(samples_per_question=p.samples_per_question, temperature=p.temperature,
                       max_new_tokens=p.max_new_tokens, labels=p.labels, rollouts_per_step=p.rollouts_per_step,
                       seed=p.seed, backend=p.backend)
    examples = collect_examples(policy, tokenizer, rows, cfg, origin="sft")  # several ranks: a block each
    del policy
    release_memory()
    t_sample = time.perf_counter() - t_start
    train, held = split_by_question(examples, p.heldout_fraction, p.seed)
    if not train:
        raise PipelineError("reward_model: no training examples; raise questions or lower heldout_fraction")

    t0 = time.perf_counter()
    rm = init_reward_model(init, dtype=dtype, device=dev, attn_implementation=p.attn_implementation)
    enable_checkpointing(rm, p.gradient_checkpointing)
    upd = Updater(rm, max_grad_norm=1.0, optimizer=torch.optim.AdamW(rm.parameters(), lr=p.lr, weight_decay=0.0),
                  deepspeed=build_deepspeed_config(
                      zero_stage=p.deepspeed.zero_stage, offload_optimizer=p.deepspeed.offload_optimizer,
                      micro_batch_size=max(1, -(-p.batch_size // world_size())), grad_accum=1, grad_clip=1.0,
                      bf16=bf16) if ds else None)
    before = evaluate_reward_model(rm, tokenizer, held, p.batch_size, shard=True)
    losses = train_reward_model(rm, tokenizer, train, epochs=p.epochs, lr=p.lr, batch_size=p.batch_size, seed=p.seed,
                                train_on=p.train_on, updater=upd)
    after = evaluate_reward_model(rm, tokenizer, held, p.batch_size, shard=True)
    train_eval = evaluate_reward_model(rm, tokenizer, train, p.batch_size, shard=True)
    t_train = time.perf_counter() - t0
    if not is_main_process():
        return {}
    save_reward_model(rm.to("cpu"), tokenizer, paths.REWARD_MODEL, train, held,
                      {"stage": "reward_model", "init": str(init), "labels": p.labels, "train_on": p.train_on,
                       "params": p.tracked_dump()})
    metrics: dict[str, Any] = {
        "heldout": after,
        "heldout_before_training": before,
        "train": train_eval,
        "outcome_auc": after["outcome_auc"],
        "step_auc": after["step_auc"],
        "n_train_examples": len(train),
        "n_heldout_examples": len(held),
        "loss_per_epoch": [round(x, 5) for x in losses],
        "sampling_s": round(t_sample, 2),
        "training_s": round(t_train, 2),
        "wall_s": round(time.perf_counter() - t_start, 2),
    }
    write_metrics("reward_model", metrics, ["outcome_auc", "step_auc", "n_train_examples"])
    return metrics


if __name__ == "__main__":  # the DeepSpeed / torchrun entry (docs/real-mode.md); dvc runs python -m flows.reward_model
    from stages.train.common import cli

    raise SystemExit(cli(RewardModelParams, run))

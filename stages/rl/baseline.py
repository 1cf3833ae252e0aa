"""The continued-SFT baseline of the grpo stage: the start model trained further with the SFT loss on
the reference CoT solutions of exactly the questions GRPO saw, step by step (same number of steps,
same questions per step). It answers "is RL better than just more SFT on the same data?".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from stages.core import paths, threads
from stages.core.dist import all_reduce, is_main_process, world_size
from stages.core.errors import PipelineError
from stages.core.generation import resolve_backend
from stages.core.modeling import enable_checkpointing, save_model
from stages.core.plots import write_metric_files
from stages.core.prompts import prompt_format
from stages.rl import lora
from stages.rl.data import step_questions
from stages.rl.rollout import rollout_generator
from stages.rl.update import rl_updater, update_adapts
from stages.train.losses import lm_nll_sum
from stages.train.update import Updater, micro_slices


def sft_batch(rows: list[dict[str, Any]], tokenizer: Any) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, labels) right-padded; labels are -100 except on the response + EOS."""
    seqs, labs = [], []
    fmt = prompt_format(tokenizer)
    for r in rows:
        p = tokenizer(fmt.prompt(r["question"], "cot"))["input_ids"]
        a = tokenizer(fmt.response(r["cot"]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        labs.append([-100] * len(p) + a)
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    lab = torch.full((len(seqs), L), -100, dtype=torch.long)
    for i, (s, la) in enumerate(zip(seqs, labs, strict=True)):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = 1
        lab[i, :len(la)] = torch.tensor(la)
    return ids, att, lab


def continued_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], *, steps: int, per_step: int, seed: int,
                  lr: float, max_grad_norm: float, micro_batch_size: int,
                  on_step: Callable[[int], None] | None = None, updater: Updater | None = None,
                  chunk_tokens: int | None = None) -> list[dict[str, float]]:
    """Train ``model`` in place for ``steps`` SFT steps over the GRPO question order; return per-step rows. The
    update is the one update path: ``updater`` (e.g. stages.rl.update.rl_updater: DeepSpeed, bf16, on the
    accelerator) or a plain :class:`stages.train.update.Updater` (AdamW at ``lr``, clipping at ``max_grad_norm``).

    Several ranks (a DeepSpeed updater in a deepspeed / torchrun launch): every rank builds the step's batch, takes
    its rows ``rank::world`` and normalises by the whole batch's response tokens, so the update equals one
    process's on the whole batch; a rank with fewer micro-batches pads with zero-gradient passes. The loss over the
    vocabulary is computed in chunks of ``chunk_tokens`` positions (stages.train.losses.lm_nll_sum).

    ``on_step(done)`` is called after each step with the number of steps done (the grpo stage's held-out
    evaluation of ``algorithm: sft``); the model is in eval mode during the call."""
    if any("cot" not in r for r in rows):
        raise PipelineError("grpo.baseline: the prompt rows have no 'cot' reference solution; disable the baseline or add them")
    upd = updater or Updater(model, max_grad_norm=max_grad_norm,
                             optimizer=torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0))
    rank, world = upd.rank, upd.world
    model.train()
    history = []
    for step in range(steps):
        t0 = time.perf_counter()
        batch = [rows[i] for i in step_questions(len(rows), step, per_step, seed)]
        ids, att, lab = sft_batch(batch, tokenizer)
        n_tok = int((lab[:, 1:] != -100).sum())
        mine = torch.arange(len(batch))[rank::world]
        slices = micro_slices(mine, micro_batch_size)
        n_micro = -(-len(range(0, len(batch), world)) // micro_batch_size)  # rank 0 has the most rows
        upd.zero_grad()
        total = 0.0
        dev = upd.device
        for j in range(n_micro):
            last = j == n_micro - 1
            if j >= len(slices):
                upd.dummy_backward(last=last)
                continue
            sl = slices[j]
            nll, _ = lm_nll_sum(upd.forward_model, lab[sl].to(dev), chunk_tokens=chunk_tokens,
                                input_ids=ids[sl].to(dev), attention_mask=att[sl].to(dev), use_cache=False)
            loss = nll / max(n_tok, 1)
            upd.backward(loss, last=last)
            total += loss.item()
        gn, _ = upd.step(bad=False)  # a non-finite gradient norm skips the update
        total = all_reduce([total])[0] if upd.distributed else total
        history.append({"step": step, "sft_loss": total, "grad_norm": gn, "step_s": time.perf_counter() - t0})
        if on_step is not None:
            model.eval()
            on_step(step + 1)
            model.train()
    model.eval()
    return history


def train_baseline(p: Any, init: Path, tokenizer: Any, rows: list[dict[str, Any]], model: Any) -> dict[str, Any]:
    """The grpo stage's continued-SFT baseline (``p``: GrpoParams) from ``model``, loaded from ``init`` (every rank, on
    the policy's update path: DeepSpeed, bf16, the accelerator), saved to data/models/sft_continued (a copy of
    ``init`` when disabled); returns its metrics."""
    torch.manual_seed(p.seed)
    out: dict[str, Any] = {"steps": 0}
    extra: dict[str, Any] = {"stage": "grpo", "baseline": "disabled (copy of init)"}
    if p.baseline.enabled:
        model = lora.attach(model, p.lora, p.seed)  # the policy's memory budget: LoRA too when it uses LoRA
        enable_checkpointing(model, p.compute.gradient_checkpointing)
        bh = continued_sft(model, tokenizer, rows, steps=p.steps * p.iterative.iterations,
                           per_step=p.questions_per_step, seed=p.seed, lr=p.baseline.lr,
                           max_grad_norm=p.optim.max_grad_norm, micro_batch_size=p.optim.micro_batch_size,
                           updater=(upd := rl_updater(model, p, lr=p.baseline.lr, weight_decay=0.0)),
                           chunk_tokens=p.compute.logprob_chunk_tokens,
                           on_step=lambda _done: threads.step(adapt=update_adapts(upd)))
        out = {"steps": len(bh), "sft_loss_first": round(bh[0]["sft_loss"], 4),
               "sft_loss_last": round(bh[-1]["sft_loss"], 4)}
        extra = {"stage": "grpo", "baseline": "continued_sft", "init": str(init), "params": p.tracked_dump()}
        if is_main_process():
            write_metric_files(paths.plots_dir("grpo"), bh, ("sft_loss",), prefix="baseline_")
    if is_main_process():
        save_model(lora.exported(model.to("cpu")), tokenizer, paths.SFT_CONTINUED, extra=extra)
    return out


def train_sft(model: Any, tokenizer: Any, rows: list[dict[str, Any]], p: Any, *, heldout: Any = None
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """algorithm sft: :func:`continued_sft` on the rows' gold CoT solutions, ``p.steps`` x ``iterative.iterations``
    steps of ``questions_per_step`` questions (the RL question order) at ``p.optim.lr``; one plain process.
    ``heldout`` (stages.rl.heldout.HeldoutEval) is evaluated with a generator of ``p.rollout.backend`` synced to the
    model. Returns (metric rows, completion rows: none, info), as the RL loop's run."""
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
        generator.close()
    return hist, [], {"resumed_from_step": None}

"""The reward model itself (paper 4.1.3-4.1.4): a 1-label token-classification model over the policy's backbone, its
files (an HF directory with its training examples, the replay history) and its scores, one scalar s_t per token.

``LlamaForTokenClassification`` with one label (transformers' ``AutoModelForTokenClassification``), initialised
from a pipeline causal LM (its backbone weights load by name; the head is new), saved as an ordinary HF directory
(config.json, model.safetensors, tokenizer) and loaded again with :func:`load_reward_model`. A reward is
``sigmoid(s)``: the outcome RM's at the last completion token, the process RM's at each step end
(stages/rl/rm/labels.py). The rest of the package: labels.py (training data), train.py, metrics.py (AUCs,
best-of-n), source.py (the RM as a GRPO reward source).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from stages.core.dist import all_gather_list, block
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, read_jsonl
from stages.core.logprobs import select_cache_rows
from stages.core.modeling import load_model, resolve_model
from stages.core.prompts import prompt_format
from stages.rl.rollout import _cache_kwarg, _checkpointing

EXAMPLES_FILE = "examples.jsonl"
HELDOUT_FILE = "heldout.jsonl"


def init_reward_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: Any = None,
                      attn_implementation: str | None = None, ds_config: dict[str, Any] | None = None) -> Any:
    """A 1-label token-classification model whose backbone is loaded from the causal LM at ``path`` (weights read
    in ``dtype`` onto ``device``; stages.core.modeling.load_model). No dropout on the head: its scores are a
    deterministic function of the weights, and a resumed training repeats the same steps."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    src = resolve_model(path)
    cfg = AutoConfig.from_pretrained(src, num_labels=1)
    cfg.classifier_dropout = 0.0  # set as an attribute: from_pretrained drops keys the config class does not declare
    try:
        return load_model(src, dtype=dtype, device=device, attn_implementation=attn_implementation,
                          ds_config=ds_config, auto_class=AutoModelForTokenClassification, config=cfg)
    except PipelineError as e:
        raise PipelineError(f"{path}: cannot build a reward model from it ({str(e).split('(', 1)[-1]}") from None


def load_reward_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: Any = None,
                      attn_implementation: str | None = None) -> Any:
    """Load a reward model saved by the reward_model stage (or by iterative GRPO), in ``dtype`` onto ``device``; its
    head's dropout is 0."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    src = resolve_model(path)
    try:
        cfg = AutoConfig.from_pretrained(src)
    except (OSError, ValueError) as e:
        raise PipelineError(f"{path}: cannot load the reward model ({str(e).splitlines()[0]})") from None
    if getattr(cfg, "classifier_dropout", None) is None:
        cfg.classifier_dropout = 0.0  # an RM saved before the head's dropout was set explicitly (it trained with 0.1)
    try:
        model = load_model(src, dtype=dtype, device=device, attn_implementation=attn_implementation,
                           auto_class=AutoModelForTokenClassification, config=cfg)
    except PipelineError as e:
        raise PipelineError(f"{path}: cannot load the reward model ({str(e).split('(', 1)[-1]}") from None
    if model.config.num_labels != 1:
        raise PipelineError(f"{path}: not a reward model (num_labels={model.config.num_labels}, expected 1)")
    return model.eval()


def save_reward_model(rm: Any, tokenizer: Any, path: str | os.PathLike[str], examples: Sequence[dict[str, Any]],
                      heldout: Sequence[dict[str, Any]] | None, extra: dict[str, Any]) -> None:
    """Write the RM (HF directory), its training examples (the replay history, ``examples.jsonl``) and the
    held-out examples (``heldout.jsonl``, when given) atomically; ``extra`` goes to pipeline.json."""
    with atomic_path(path) as tmp:
        rm.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "pipeline.json").write_text(json.dumps(extra, indent=2) + "\n")
        for name, rows in ((EXAMPLES_FILE, examples), (HELDOUT_FILE, heldout)):
            if rows is None:
                continue
            with open(tmp / name, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")


def load_examples(rm_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The labelled examples stored next to a reward model (its replay history); [] when none."""
    f = Path(rm_dir) / EXAMPLES_FILE
    return read_jsonl(f) if f.is_file() else []


def _batch(examples: Sequence[dict[str, Any]], tokenizer: Any, prompt_cache: dict[str, list[int]]
           ) -> tuple[Tensor, Tensor, list[int]]:
    """Right-padded (input_ids, attention_mask) of prompt + completion, and each row's prompt length."""
    seqs, plens = [], []
    for ex in examples:
        q = ex["question"]
        if q not in prompt_cache:
            prompt_cache[q] = tokenizer(prompt_format(tokenizer).prompt(q, "cot"))["input_ids"]
        p = prompt_cache[q]
        seqs.append(p + list(ex["completion_ids"]))
        plens.append(len(p))
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = 1
    return ids, att, plens


def token_scores(rm: Any, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(B, L) scalar score s_t of every position (right-padded inputs), on the inputs' device (the RM may be on a GPU)."""
    prm = next(iter(rm.parameters()), None) if hasattr(rm, "parameters") else None
    dev = prm.device if prm is not None else input_ids.device
    out = rm(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev), use_cache=False).logits[..., 0].float()
    return out.to(input_ids.device)


def _grouped_batch(examples: Sequence[dict[str, Any]], tokenizer: Any, prompt_cache: dict[str, list[int]]
                   ) -> tuple[Tensor, Tensor, int]:
    """(input_ids, attention_mask, P) in the rollout layout (stages.rl.rollout): each prompt left-padded to P, the
    longest prompt of the batch, then the completion, right-padded."""
    prompts, comps = [], []
    for ex in examples:
        q = ex["question"]
        if q not in prompt_cache:
            prompt_cache[q] = tokenizer(prompt_format(tokenizer).prompt(q, "cot"))["input_ids"]
        prompts.append(prompt_cache[q])
        comps.append(list(ex["completion_ids"]))
    P, T = max(len(x) for x in prompts), max(len(x) for x in comps)
    ids = torch.full((len(comps), P + T), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros(len(comps), P + T, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
        ids[i, P - len(p):P] = torch.tensor(p)
        att[i, P - len(p):P] = 1
        ids[i, P:P + len(c)] = torch.tensor(c)
        att[i, P:P + len(c)] = 1
    return ids, att, P


def completion_scores(rm: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, *,
                      share_prompts: bool = True) -> Tensor:
    """(B, T) score s_t of every completion position, from inputs in the rollout layout (prompt left-padded to
    ``prompt_len``, completion right-padded; position ids follow the mask), on the inputs' device.

    ``share_prompts``: rows with the same prompt (the samples of one question) run it through the backbone once; its
    KV cache is copied to every row (differentiably: gradients flow back into the prompt's pass) and the completions
    attend to it, as stages.rl.rollout.token_logprobs does for the policy. The same scores as one full pass per row
    up to float rounding (tested), with the prompt tokens computed once per distinct prompt. A model training with
    gradient checkpointing takes the plain pass (transformers drops the KV cache of checkpointed layers)."""
    prm = next(iter(rm.parameters()), None) if hasattr(rm, "parameters") else None
    dev = prm.device if prm is not None else input_ids.device
    ids, att, P = input_ids.to(dev), attention_mask.to(dev), prompt_len
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    net = getattr(rm, "module", rm)  # a DeepSpeed engine wraps the model
    base = getattr(net, str(getattr(net, "base_model_prefix", "")), None)
    head = getattr(net, "score", None)
    if share_prompts and isinstance(base, torch.nn.Module) and isinstance(head, torch.nn.Module) \
            and ids.shape[1] > P > 0 and not _checkpointing(rm):
        uniq, inverse = torch.unique(torch.cat([ids[:, :P], att[:, :P]], dim=1), dim=0, return_inverse=True)
        if uniq.shape[0] < ids.shape[0]:
            p_att = uniq[:, P:]
            kw = _cache_kwarg(base)
            out = base(input_ids=uniq[:, :P], attention_mask=p_att, position_ids=(p_att.cumsum(-1) - 1).clamp(min=0),
                       use_cache=True)
            cache = out[kw]
            select_cache_rows(cache, inverse)  # (U, ...) -> (B, ...) rows, differentiable, deterministic
            h = base(input_ids=ids[:, P:], attention_mask=att, position_ids=pos[:, P:], use_cache=True,
                     **{kw: cache}).last_hidden_state
            drop = getattr(net, "dropout", None)
            h = drop(h) if isinstance(drop, torch.nn.Module) else h
            return head(h)[..., 0].float().to(input_ids.device)
    out = rm(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False).logits[..., 0].float()
    return out[:, P:].to(input_ids.device)


@torch.no_grad()
def example_scores(rm: Any, tokenizer: Any, examples: Sequence[dict[str, Any]], batch_size: int = 32, *,
                   shard: bool = False, share_prompts: bool = False) -> list[list[float]]:
    """Per example, the RM scores (logits) at its step ends; the last one is the outcome score.

    ``share_prompts``: score consecutive examples of one question with one pass over their prompt
    (:func:`completion_scores`); else each prompt + completion in its own right-padded row (:func:`token_scores`,
    the GRPO reward source's path). ``shard`` (every rank holds the same ``examples``): each rank scores its
    contiguous block and every rank returns all the scores."""
    rm.eval()
    cache: dict[str, list[int]] = {}
    out: list[list[float]] = []
    start, end = block(len(examples)) if shard else (0, len(examples))
    mine = list(examples)[start:end]
    for b in range(0, len(mine), batch_size):
        batch = mine[b:b + batch_size]
        if share_prompts:
            ids, att, P = _grouped_batch(batch, tokenizer, cache)
            s = completion_scores(rm, ids, att, P)
            out.extend([float(s[i, e]) for e in ex["step_ends"]] for i, ex in enumerate(batch))
            continue
        ids, att, plens = _batch(batch, tokenizer, cache)
        s = token_scores(rm, ids, att)
        for i, (ex, P) in enumerate(zip(batch, plens, strict=True)):
            out.append([float(s[i, P + e]) for e in ex["step_ends"]])
    return all_gather_list(out) if shard else out

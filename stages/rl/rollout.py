"""Rollouts for GRPO: sample G outputs per question, score them, and lay them out as tensors.

Sampling goes through the project's generation interface (stages.core.generation), so the same code
runs on HF (CPU) and vLLM. The log-probs used in the ratio (pi_old) and the KL (pi_ref) come from a
teacher-forced forward pass of the training / reference model over prompt + completion, with
logits / temperature and no top-p / top-k truncation (TRL #6789). The sampler's own log-probs are
only compared with them (``mismatch`` metrics, verl #2996).

Tensor layout of a rollout batch of N = Q * G outputs (row n = q * G + g)::

    input_ids       (N, P + T)  prompt left-padded to P, completion right-padded to T
    attention_mask  (N, P + T)
    completion_mask (N, T)      1 on generated tokens (EOS included)
    loss_mask       (N, T)      completion_mask minus tool-output tokens, excluded outputs, ...
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.core.logprobs import IGNORE, lm_logprobs

_OUTPUT_BLOCK = re.compile(r"```output\n.*?(?:```|$)", re.DOTALL)


@dataclass
class Rollout:
    """One step's samples and their tensors (see the module docstring for shapes)."""

    rows: list[dict[str, Any]]
    texts: list[str]
    finish_reasons: list[str]
    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    loss_mask: Tensor
    sampler_logprobs: Tensor
    prompt_len: int
    group_size: int

    @property
    def completion_lengths(self) -> Tensor:
        return self.completion_mask.sum(-1)


def tool_output_mask(token_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """1 per token, 0 for tokens that overlap a tool-injected ```output ... ``` block.

    The executor, not the policy, wrote those tokens, so they take no part in the loss or the KL
    (TIR rollouts). Cheap when there is no such block (one decode).
    """
    ids = list(token_ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if "```output" not in text:
        return [1] * len(ids)
    # character end offset of every token, by decoding growing prefixes
    ends = [len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) for k in range(len(ids))]
    spans = [(m.start(), m.end()) for m in _OUTPUT_BLOCK.finditer(text)]
    keep = []
    start = 0
    for end in ends:
        overlap = any(s < end and start < e for s, e in spans) and end > start
        keep.append(0 if overlap else 1)
        start = end
    return keep


def build_rollout(rows: list[dict[str, Any]], prompts: list[str], completions: list[list[Any]], tokenizer: Any,
                  *, mask_truncated: bool) -> Rollout:
    """Tokenise prompts (with BOS, as the tokenizer adds it) and concatenate the generated ids.

    ``completions[q][g]`` follows the generation interface (token_ids, logprobs, text, finish_reason).
    """
    G = len(completions[0])
    pad = tokenizer.pad_token_id
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    P = max(len(x) for x in prompt_ids)
    flat = [(q, c) for q, group in enumerate(completions) for c in group]
    T = max(1, max(len(c.token_ids) for _, c in flat))
    N = len(flat)
    input_ids = torch.full((N, P + T), pad, dtype=torch.long)
    attn = torch.zeros(N, P + T, dtype=torch.long)
    cmask = torch.zeros(N, T)
    lmask = torch.zeros(N, T)
    slp = torch.zeros(N, T)
    texts, reasons = [], []
    for n, (q, c) in enumerate(flat):
        p = prompt_ids[q]
        ids = list(c.token_ids)
        input_ids[n, P - len(p):P] = torch.tensor(p)
        attn[n, P - len(p):P] = 1
        if ids:
            input_ids[n, P:P + len(ids)] = torch.tensor(ids)
            attn[n, P:P + len(ids)] = 1
            cmask[n, :len(ids)] = 1
            lmask[n, :len(ids)] = torch.tensor(tool_output_mask(ids, tokenizer), dtype=torch.float)
            if c.logprobs is not None:
                slp[n, :len(ids)] = torch.tensor([float(x) for x in c.logprobs][: len(ids)])
        if mask_truncated and c.finish_reason == "length":
            lmask[n] = 0
        texts.append(c.text)
        reasons.append(c.finish_reason)
    return Rollout(
        rows=[rows[q] for q, _ in flat],
        texts=texts, finish_reasons=reasons, input_ids=input_ids, attention_mask=attn,
        completion_mask=cmask, loss_mask=lmask, sampler_logprobs=slp, prompt_len=P, group_size=G,
    )


def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float,
                   *, entropy: bool = False, share_prompts: bool = False, chunk_tokens: int | None = None
                   ) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced log pi(o_t | q, o_<t) of the completion tokens, from logits / temperature.

    input_ids/attention_mask: (B, P + T), prompt left-padded to P. Returns (B, T) float32 log-probs (with
    gradient if enabled) and, when ``entropy``, the (B, T) entropy of the full-vocabulary
    distribution softmax(logits / T) (detached); both are 0 at padded completion positions (attention mask 0).
    Position ids follow the attention mask, as in generation with left padding. The vocabulary is handled in
    chunks of ``chunk_tokens`` positions (stages.core.logprobs): no (B, T, V) tensor is made.

    ``share_prompts``: rows with the same prompt (a GRPO group's G outputs) run the prompt through the model
    once: one pass over the U distinct prompts fills a KV cache, whose rows are copied to the B outputs
    (differentiably: the gradient of every output flows back into its prompt's pass), then one pass over the
    completions attends to it. The same numbers as the plain pass up to float rounding (tested), with the
    prompt tokens computed U instead of B times. A model training with gradient checkpointing takes the plain
    pass when gradients are on (transformers drops the KV cache of checkpointed layers).
    """
    T = input_ids.shape[1] - prompt_len
    targets = input_ids[:, prompt_len:].masked_fill(attention_mask[:, prompt_len:] == 0, IGNORE)
    kw = {"temperature": temperature, "entropy": entropy, "chunk_tokens": chunk_tokens}
    if share_prompts and T > 1 and prompt_len > 0 and not _checkpointing(model):
        prompts = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], dim=1)
        uniq, inverse = torch.unique(prompts, dim=0, return_inverse=True)
        if uniq.shape[0] < input_ids.shape[0]:
            return _shared_prompt_logprobs(model, uniq, inverse, input_ids, attention_mask, prompt_len, targets, kw)
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    # position P-1+t predicts completion token t; the last position predicts nothing
    tgt = torch.cat([targets, targets.new_full((targets.shape[0], 1), IGNORE)], dim=1)
    _, lp, ent = lm_logprobs(model, tgt, input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                             logits_to_keep=T + 1, use_cache=False, **kw)
    return lp[:, :-1], (ent[:, :-1] if ent is not None else None)


def _checkpointing(model: Any) -> bool:
    net = getattr(model, "module", model)
    on = getattr(net, "is_activation_checkpointing", None)  # transformers >= 5.2x; older: is_gradient_checkpointing
    on = on if on is not None else getattr(net, "is_gradient_checkpointing", False)
    return bool(on) and net.training and torch.is_grad_enabled()


def _shared_prompt_logprobs(model: Any, uniq: Tensor, inverse: Tensor, input_ids: Tensor, attention_mask: Tensor,
                            P: int, targets: Tensor, kw: dict[str, Any]) -> tuple[Tensor, Tensor | None]:
    """(B, T) log-probs (and entropy) of the completion tokens, the prompts run once each (``token_logprobs``)."""
    p_ids, p_att = uniq[:, :P], uniq[:, P:]
    p_pos = (p_att.cumsum(-1) - 1).clamp(min=0)
    # the last prompt position predicts token 0: the head's U rows are re-indexed to the B outputs
    out, lp0, ent0 = lm_logprobs(model, targets[:, :1], rows=inverse, input_ids=p_ids, attention_mask=p_att,
                                 position_ids=p_pos, logits_to_keep=1, use_cache=True, **kw)
    ckw = _cache_kwarg(model)  # transformers >= 5.2x renamed past_key_values to cache
    cache = out[ckw]
    cache.batch_select_indices(inverse)  # (U, ...) -> (B, ...) rows; indexing keeps the autograd graph
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    # positions P..P+T-2 predict tokens 1..T-1
    _, lp, ent = lm_logprobs(model, targets[:, 1:], input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1],
                             position_ids=pos[:, P:-1], use_cache=True, **{ckw: cache}, **kw)
    return torch.cat([lp0, lp], dim=1), (torch.cat([ent0, ent], dim=1) if ent is not None else None)


def _cache_kwarg(model: Any) -> str:
    fwd = getattr(model, "module", model).forward  # a DeepSpeed engine wraps the model
    return "cache" if "cache" in inspect.signature(fwd).parameters else "past_key_values"


def mismatch_metrics(sampler_logprobs: Tensor, train_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Train/rollout log-prob mismatch over ``mask``: mean |delta|, max |delta| and a k3 KL(sampler||train)."""
    m = mask.bool()
    if not m.any():
        return {"mismatch_abs_mean": 0.0, "mismatch_abs_max": 0.0, "mismatch_kl": 0.0}
    d = (train_logprobs - sampler_logprobs)[m].double()
    return {
        "mismatch_abs_mean": float(d.abs().mean()),
        "mismatch_abs_max": float(d.abs().max()),
        "mismatch_kl": float((d.exp() - d - 1).mean()),
    }

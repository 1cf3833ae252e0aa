"""Log-probabilities of target tokens under a causal LM, written once, without a (B, T, V) float32 tensor.

Every pass that needs log pi(y_t | x_<=t) over a real vocabulary goes through here: the RL log-prob and update
passes (stages.rl.rollout.token_logprobs: pi_old, pi_ref, the policy loss and the entropy), the training loss of
pretrain / sft (stages.train.loop.forward_nll) and the continued-SFT baseline (stages.rl.baseline).

How. The model runs as usual, but the forward of its output head (``get_output_embeddings()``, the ``lm_head``)
is replaced for the call: instead of the (B, K, V) logits it returns the (B, K, 1) log-probs of the targets (and
the entropy, (B, K, 2)), computed by :class:`ChunkedLogProbs` over chunks of ``chunk_tokens`` positions. The
head's weight is read inside its own forward, so module hooks (DeepSpeed ZeRO-3 gathering the weight) behave as
for the ordinary head, and the engine's forward is the one called. Per chunk of c positions::

    z = (h W^T + b) / T                       (c, V), float32 (the matmul in the head's dtype, as the model's)
    log p(y) = z[y] - logsumexp(z)            entropy H = -sum_v p_v log p_v  (a gradient only when asked)
    backward: dL/dz = g (onehot(y) - softmax(z)) / T;  dL/dh = dL/dz W;  dL/dW += dL/dz^T h;  dL/db += sum dL/dz
              (with the entropy's gradient g_H: dL/dz += -g_H p (log p + H) / T; an entropy bonus, stages/rl/losses.py)

The backward recomputes z chunk by chunk (only the (N, H) hidden states are kept), so the peak extra memory of
either pass is a few (c, V) float32 tensors instead of several (N, T, V) ones. Positions whose target is
:data:`IGNORE` (-100) are not computed at all (prompt tokens of SFT, padding); their log-prob is 0.

Equal to ``log_softmax(logits.float() / T).gather(...)`` to float rounding (tests/core/test_logprobs.py: 1e-5
on values and gradients).

Truncated distributions (``top_k`` > 0 or ``top_p`` < 1, the rollout's sampling settings): the log-prob is that of
the distribution the sampler drew from, softmax(z) restricted to the tokens :func:`truncation_mask`
keeps (computed from these very logits) and renormalised over them::

    K = truncation_mask(log_softmax(z), top_k, top_p)
    log p_K(y) = z[y] - logsumexp(z[K])        backward: dL/dz = g (onehot(y) - softmax(z) 1_K / sum_K softmax(z)) / T

(a target outside K gets the same finite expression, log(p(y) / p(K)); the set K itself carries no gradient). The
entropy stays that of the full distribution. Heads that are not a plain linear map (logit soft-capping, a logit scale) fall back to
the materialised logits (:func:`plain_head`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from stages.core import flops, threads

IGNORE = -100
"""Target value of positions that get no log-prob (prompt tokens, padding)."""

DEFAULT_CHUNK_TOKENS = 256
"""Positions per chunk when the caller does not say: a (256, V) float32 tensor is 156 MB at V = 152k."""

_NOT_LINEAR = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def truncation_mask(logp: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor | None:
    """The tokens top-k and then top-p keep, as a bool mask of ``logp``'s shape (..., V), or None when neither
    restricts anything (``top_k`` 0 or >= V, ``top_p`` 1).

    ``logp``: log softmax(logits / T) over the last dimension. Top-k keeps every token whose log-prob is at least the
    k-th largest (ties at the k-th value all stay); top-p then keeps, in the top-k-renormalised distribution, the
    smallest set of highest-probability tokens whose mass reaches ``top_p``: a token is dropped when the tokens
    ranked above it already reach it, so the top token always stays (HF's and vLLM's rule). The one definition of
    the truncation: the hf sampler draws from it and the trainer's log-probs (below) renormalise over
    it, so that the importance ratio of the loss uses the distribution the sampler used."""
    V = logp.shape[-1]
    keep = None
    scores = logp
    if 0 < top_k < V:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        keep = scores >= kth
        scores = scores.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        sorted_s, order = scores.sort(dim=-1, descending=True)
        probs = sorted_s.softmax(dim=-1)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        keep = ~drop if keep is None else keep & ~drop
    return keep


class ChunkedLogProbs(torch.autograd.Function):
    """log p(targets) (and the entropy) of ``hidden @ weight^T + bias`` over chunks of positions (module docstring).

    forward(hidden (N, H), weight (V, H), bias (V,) or None, targets (N,) long, temperature, chunk, entropy,
    entropy_grad) -> (logp (N,) float32, entropy (N,) float32, empty when not asked). logp has a gradient; the
    entropy too with ``entropy_grad``."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                chunk: int, entropy: bool, top_k: int = 0, top_p: float = 1.0,
                entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
        dtype = _matmul_dtype(hidden, weight)
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(n if entropy else 0, dtype=torch.float32, device=hidden.device)
        with torch.no_grad(), _no_autocast(hidden.device.type):
            for s in range(0, n, chunk):
                z = _scaled_logits(hidden[s:s + chunk], weight, bias, temperature, dtype)
                lse = torch.logsumexp(z, dim=-1)
                norm = _kept_lse(z, lse, top_k, top_p)
                logp[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1) - norm
                if entropy:
                    z -= lse[:, None]  # log-probs, in place
                    ent[s:s + chunk] = -(z.exp() * z).sum(-1)
                del z
        ent_grad = bool(entropy and entropy_grad)
        ctx.save_for_backward(hidden, weight, bias, targets, ent if ent_grad else None)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.top_k, ctx.top_p = temperature, chunk, dtype, top_k, top_p
        if not ent_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, ent = ctx.saved_tensors
        T, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        if ent is None or g_ent is None:
            g_ent = None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        g_h = torch.empty_like(hidden) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        g_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b and bias is not None else None
        rows = torch.arange(min(chunk, hidden.shape[0]), device=hidden.device)
        with _no_autocast(hidden.device.type):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s:s + chunk]
                z = _scaled_logits(h, weight, bias, T, dtype)
                extra = None
                if g_ent is not None:  # dH/dz = -p (log p + H), the full distribution's entropy
                    logq = z - torch.logsumexp(z, dim=-1, keepdim=True)
                    extra = logq.exp() * (logq + ent[s:s + chunk, None]) * (-g_ent[s:s + chunk].float()[:, None])
                    del logq
                gz = _kept_softmax(z, ctx.top_k, ctx.top_p)
                del z
                g = g_logp[s:s + chunk].float()
                gz.mul_(-g[:, None])
                gz[rows[:h.shape[0]], targets[s:s + chunk]] += g
                if extra is not None:
                    gz.add_(extra)
                    del extra
                gz = (gz / T).to(dtype)  # dL/d(h W^T + b)
                with threads.single(h.device.type == "cpu"):  # reductions over V and the chunk's rows: the same bits
                    if g_h is not None:
                        g_h[s:s + chunk] = (gz @ weight.to(dtype)).to(hidden.dtype)
                    if g_w is not None:  # accumulated in float32 over the chunks
                        if dtype == torch.float32:
                            g_w.addmm_(gz.t(), h.float())
                        else:
                            g_w.add_(gz.t() @ h.to(dtype))
                if g_b is not None:
                    g_b.add_(gz.float().sum(0))
                del gz
        return (g_h, None if g_w is None else g_w.to(weight.dtype), None if g_b is None else g_b.to(bias.dtype),
                None, None, None, None, None, None, None)


def _keep(z: Tensor, top_k: int, top_p: float) -> Tensor | None:
    """The truncation's kept tokens of the logits ``z`` (c, V) (None: no truncation), from torch.log_softmax as the hf
    sampler computes them (stages.core.generation.HFGenerator._pick)."""
    if top_k <= 0 and top_p >= 1.0:
        return None
    return truncation_mask(torch.log_softmax(z, dim=-1), top_k, top_p)


def _kept_lse(z: Tensor, lse: Tensor, top_k: int, top_p: float) -> Tensor:
    """logsumexp of the logits ``z`` (c, V) over the tokens the truncation keeps (``lse`` without truncation)."""
    keep = _keep(z, top_k, top_p)
    return lse if keep is None else torch.logsumexp(z.masked_fill(~keep, float("-inf")), dim=-1)


def _kept_softmax(z: Tensor, top_k: int, top_p: float) -> Tensor:
    """softmax of the logits ``z`` (c, V) over the tokens the truncation keeps, 0 elsewhere (the full softmax
    without truncation)."""
    keep = _keep(z, top_k, top_p)
    return torch.softmax(z if keep is None else z.masked_fill(~keep, float("-inf")), dim=-1)


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the ordinary head would multiply in: autocast's when it is on, else the weight's."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return weight.dtype


@contextlib.contextmanager
def _no_autocast(device_type: str) -> Iterator[None]:
    with torch.autocast(device_type, enabled=False):
        yield


def _scaled_logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, dtype: torch.dtype) -> Tensor:
    z = F.linear(h.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)).float()
    if temperature != 1.0:
        z.div_(temperature)
    return z


def chunked_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *, temperature: float = 1.0,
                     entropy: bool = False, chunk_tokens: int | None = None, top_k: int = 0, top_p: float = 1.0,
                     entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """(..., K) log-probs of ``targets`` (..., K) under ``softmax((hidden @ weight^T + bias) / temperature)`` for
    ``hidden`` (..., K, H), and the (..., K) entropy when ``entropy`` (detached, unless ``entropy_grad``: the entropy
    of the full distribution, whatever the truncation). Positions whose target is :data:`IGNORE` are skipped
    (log-prob and entropy 0). Differentiable in ``hidden``, ``weight`` and ``bias``. ``top_k`` / ``top_p``:
    renormalised over the kept tokens (module docstring)."""
    shape = targets.shape
    flat_t = targets.reshape(-1)
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    keep = (flat_t != IGNORE).nonzero().squeeze(-1)
    all_kept = keep.numel() == flat_t.numel()
    h = flat_h if all_kept else flat_h.index_select(0, keep)
    t = flat_t if all_kept else flat_t.index_select(0, keep)
    chunk = max(1, int(chunk_tokens or DEFAULT_CHUNK_TOKENS))
    flops.add(2.0 * h.shape[0] * weight.shape[0] * weight.shape[1])
    lp, ent = ChunkedLogProbs.apply(h, weight, bias, t, float(temperature), chunk, bool(entropy), int(top_k),
                                    float(top_p), bool(entropy_grad))
    if not all_kept:
        lp = lp.new_zeros(flat_t.numel()).index_copy(0, keep, lp)
        if entropy:
            ent = ent.new_zeros(flat_t.numel()).index_copy(0, keep, ent)
    return lp.view(shape), (ent.view(shape) if entropy else None)


def output_head(model: Any) -> torch.nn.Module | None:
    """The output head (``get_output_embeddings()``) of a causal LM or of a DeepSpeed engine around one, when it is
    a plain linear map that :func:`lm_logprobs` may replace; None otherwise (then the logits are materialised)."""
    net = getattr(model, "module", model)
    get = getattr(net, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear):
        return None
    cfg = getattr(net, "config", None)
    if any(getattr(cfg, k, None) not in (None, 1.0, 0.0) for k in _NOT_LINEAR):
        return None
    return head


@contextlib.contextmanager
def head_forward(head: torch.nn.Module, fn: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """Inside: ``head(x)`` returns ``fn(x)`` (the module's hooks still run around it; its FLOPs are counted by
    :func:`chunked_logprobs`, for the positions it scores)."""
    head.forward = fn  # an instance attribute shadows the class's forward
    head._flops_elsewhere = True
    try:
        yield
    finally:
        del head.forward, head._flops_elsewhere


def select_cache_rows(cache: Any, index: Tensor) -> None:
    """Re-index the batch rows of a transformers KV cache in place (the U distinct prompts' rows to the B outputs that
    share them), differentiably and deterministically: every layer's keys and values go through ``index_select``,
    whose backward (``index_add_``) sums the gradients of repeated rows in index order at any thread count.
    transformers' ``batch_select_indices`` uses advanced indexing, whose CPU backward (``index_put_`` with
    ``accumulate``) sums them in an order that depends on thread timing, so GRPO's update would differ from run to
    run whenever a micro-batch held a single prompt's group (docs/robustness.md)."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # an older cache class: its own method (advanced indexing)
        cache.batch_select_indices(index)
        return
    for layer in layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(keys, Tensor) and keys.numel() and isinstance(values, Tensor):
            layer.keys = keys.index_select(0, index)
            layer.values = values.index_select(0, index)


def lm_logprobs(model: Any, targets: Tensor, *, temperature: float = 1.0, entropy: bool = False,
                chunk_tokens: int | None = None, rows: Tensor | None = None, top_k: int = 0, top_p: float = 1.0,
                entropy_grad: bool = False,
                **forward_kw: Any) -> tuple[Any, Tensor, Tensor | None]:
    """Run ``model(**forward_kw)`` (a causal LM or a DeepSpeed engine) and return (its output, the (B, K) log-probs
    of ``targets`` (B, K), the (B, K) entropy or None).

    ``targets[b, k]`` is the token predicted by the k-th position the forward keeps (the last K positions with
    ``logits_to_keep=K``, all of them without it); :data:`IGNORE` skips a position. ``rows``: the head's input rows
    are first re-indexed by it (a forward over U distinct prompts whose B = len(rows) outputs share them). The
    output's ``logits`` are the (B, K, 1 or 2) log-probs (and entropy), not logits; a cache it returns is as
    usual. Log-probs use ``logits / temperature``; gradients flow as through the ordinary head (into the entropy too
    with ``entropy_grad``: an entropy bonus; else it is detached).
    ``chunk_tokens``: positions per chunk (None: :data:`DEFAULT_CHUNK_TOKENS`); 0 materialises the (B, K, V) logits
    (the plain path: the memory benchmark's "before"). ``top_k`` / ``top_p``: the log-probs of the truncated,
    renormalised distribution the sampler drew from (module docstring)."""
    head = output_head(model)
    if head is None or chunk_tokens == 0:
        return plain_head(model, targets, temperature=temperature, entropy=entropy, rows=rows, top_k=top_k,
                          top_p=top_p, entropy_grad=entropy_grad, **forward_kw)

    def fn(h: Tensor) -> Tensor:
        if rows is not None:
            h = h.index_select(0, rows)
        lp, ent = chunked_logprobs(h, head.weight, head.bias, targets, temperature=temperature, entropy=entropy,
                                   chunk_tokens=chunk_tokens, top_k=top_k, top_p=top_p, entropy_grad=entropy_grad)
        return lp.unsqueeze(-1) if ent is None else torch.stack([lp, ent], dim=-1)

    with head_forward(head, fn):
        out = model(**forward_kw)
    res = out.logits
    ent = res[..., 1] if entropy and entropy_grad else (res[..., 1].detach() if entropy else None)
    return out, res[..., 0], ent


def plain_head(model: Any, targets: Tensor, *, temperature: float = 1.0, entropy: bool = False,
               rows: Tensor | None = None, top_k: int = 0, top_p: float = 1.0, entropy_grad: bool = False,
               **forward_kw: Any
               ) -> tuple[Any, Tensor, Tensor | None]:
    """:func:`lm_logprobs` from the materialised (B, K, V) logits (a head that is not a plain linear map)."""
    out = model(**forward_kw)
    logits = out.logits if rows is None else out.logits.index_select(0, rows)
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    safe = targets.clamp(min=0)
    logp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    if top_k > 0 or top_p < 1.0:  # renormalised over the kept tokens: log(p(y) / p(K)) (module docstring)
        with torch.no_grad():
            keep = truncation_mask(logp_all.detach(), top_k, top_p)
        if keep is not None:
            logp = logp - torch.logsumexp(logp_all.masked_fill(~keep, float("-inf")), dim=-1)
    logp = logp.masked_fill(targets == IGNORE, 0.0)
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = (-(logp_all.exp() * logp_all).sum(-1)).masked_fill(targets == IGNORE, 0.0)
    return out, logp, ent


def completion_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float,
                        *, entropy: bool = False, chunk_tokens: int | None = None, top_k: int = 0, top_p: float = 1.0,
                        entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced (B, T) log-probs (and entropy) of the completion tokens ``input_ids[:, prompt_len:]`` (B, P + T;
    prompt left-padded to P, completion right-padded, ``attention_mask`` 0 on padding) in one full forward: the plain
    pass of stages.rl.rollout.token_logprobs (the trainer's) and of the hf sampler's scoring
    (``HFGenerator.score_ids``), written once so that the two agree bit for bit on the same weights. Position ids
    follow the attention mask; padded completion positions get 0. ``entropy_grad``: the entropy keeps its gradient
    (an entropy bonus)."""
    T = input_ids.shape[1] - prompt_len
    targets = input_ids[:, prompt_len:].masked_fill(attention_mask[:, prompt_len:] == 0, IGNORE)
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    # position P-1+t predicts completion token t; the last position predicts nothing
    tgt = torch.cat([targets, targets.new_full((targets.shape[0], 1), IGNORE)], dim=1)
    _, lp, ent = lm_logprobs(model, tgt, input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                             logits_to_keep=T + 1, use_cache=False, temperature=temperature, entropy=entropy,
                             chunk_tokens=chunk_tokens, top_k=top_k, top_p=top_p, entropy_grad=entropy_grad)
    return lp[:, :-1], (ent[:, :-1] if ent is not None else None)

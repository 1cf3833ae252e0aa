"""Generation, written once: one sampling interface over two backends (``hf`` and ``vllm``).

Used by SFT data checking, evaluation and GRPO rollouts. A caller builds a generator once with
:func:`make_generator` and asks it for ``n`` completions per prompt::

    gen = make_generator("auto", "data/models/sft", None)          # or a model object + tokenizer
    outs = gen.generate(prompts, SamplingParams(temperature=1.0, n=8, max_new_tokens=256, stop=("```output",)))
    outs[i][j].text, outs[i][j].token_ids, outs[i][j].logprobs, outs[i][j].finish_reason
    gen.sync_weights(policy)                                        # after an optimizer step (RL)

Semantics, identical in both backends:

- Prompts are tokenised with the model's tokenizer as plain text (``tokenizer(prompt)``, so BOS is added
  when the tokenizer adds it); the completion's ``token_ids`` are the generated ids only.
- ``logprobs[i] = log softmax(logits / T)[token_ids[i]]`` with ``T = temperature`` (``T = 1`` when greedy),
  computed in float32 from the full distribution: top-p/top-k only restrict what is *sampled*, they do not
  renormalise the reported log-probs (``SamplingParams.logprobs_mode="full"``, the default). With
  ``logprobs_mode="processed"`` they are the log-probs of the distribution the token was drawn from: restricted to
  the top-k / top-p kept tokens (``stages.core.logprobs.truncation_mask``) and renormalised over them (vLLM's ``processed_logprobs``;
  GRPO's rollouts ask for these, and the trainer renormalises its own log-probs the same way).
- Generation of a sequence ends at the first of: an EOS token (kept in ``token_ids``, left out of ``text``),
  a stop string (the token that completes it is the last one generated), ``max_new_tokens`` tokens, or the
  model's maximum length. ``finish_reason`` is ``"stop"`` for the first two and ``"length"`` otherwise.
- ``text = tokenizer.decode(token_ids, skip_special_tokens=True)``, except that when a stop string ended
  the sequence the text is cut right after that stop string (the completing token may carry characters
  past it, e.g. ``"```output\\n"``): the text then *ends with* the stop string, as in vLLM.
- A prompt whose token count already reaches the model's maximum length gets ``n`` empty completions
  with finish_reason ``"length"`` instead of an error (few-shot prompts on the tiny model can be long).

Backends:

- ``hf`` (:class:`HFGenerator`, default on CPU): the transformers model's own forward with a KV cache,
  many sequences per forward (left padding, per-row position ids), a KV cache preallocated per batch (no
  per-token concatenation), finished rows dropped from the batch as they accumulate. Sampling is seeded
  per (prompt index, sample index), so results do not depend on batch size or on the other prompts.
- ``vllm`` (``stages.core.vllm_backend.VLLMGenerator``, default when a CUDA GPU and vllm are present):
  the vLLM offline engine; ``sync_weights`` loads new weights into the running engine.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from stages.core import threads
from stages.core.errors import PipelineError
from stages.core.logprobs import completion_logprobs, truncation_mask
from stages.core.sampling import (  # the interface, re-exported: callers import it from here
    Backend,
    Completion,
    FinishReason,
    Generator,
    SamplingParams,
    cut_at_stop,
    eos_token_ids,
    finish_text,
    model_max_length,
    sample_seed,
    tokenize_prompts,
)

__all__ = ["Backend", "Completion", "FinishReason", "Generator", "HFGenerator", "SamplingParams", "cut_at_stop",
           "eos_token_ids", "finish_text", "make_generator", "model_max_length", "resolve_backend", "sample_seed",
           "tokenize_prompts", "truncation_mask"]


class StopChecker:
    """Finds, cheaply, the step at which a stop string appears in a growing completion.

    Only tokens that can complete a stop string trigger a decode: those whose own text contains the last
    character of some stop string, is empty, or holds a replacement character (an incomplete UTF-8 byte
    sequence whose completion depends on neighbours). Then only a tail window of the completion is decoded:
    a stop string of ``k`` characters spans at most ``4k`` bytes, hence at most ``4k`` tokens.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str], vocab_size: int,
                 device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.window = 4 * max((len(s) for s in self.stop), default=0) + 4
        self.candidates = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if not self.stop:
            return
        last_chars = {s[-1] for s in self.stop}
        if any(c.isspace() for c in last_chars):
            # tokenizers may drop a leading space when decoding a token alone: check every token
            self.candidates[:] = True
            return
        n = min(vocab_size, len(tokenizer))
        pieces = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=True)
        flags = [(not p) or ("\ufffd" in p) or any(c in p for c in last_chars) for p in pieces]
        self.candidates[:n] = torch.tensor(flags, dtype=torch.bool, device=device)
        self.candidates[n:] = True

    def hit(self, ids: Sequence[int]) -> bool:
        """Whether the completion ``ids`` contains a stop string (checked on its tail window)."""
        text = self.tokenizer.decode(list(ids[-self.window:]), skip_special_tokens=True)
        return any(s in text for s in self.stop)


# ----------------------------------------------------------------------------------------------------------
# hf backend


class _PreallocatedLayer(DynamicLayer):
    """A KV-cache layer whose storage is allocated once per batch: ``update`` writes in place and returns
    views, instead of concatenating (which copies the whole cache at every token)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, _, d = key_states.shape
        self.k_buf = key_states.new_empty(b, h, self.capacity, d)
        self.v_buf = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        if self.length + t > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded")
        self.k_buf[:, :, self.length:self.length + t] = key_states
        self.v_buf[:, :, self.length:self.length + t] = value_states
        self.length += t
        self.keys = self.k_buf[:, :, :self.length]
        self.values = self.v_buf[:, :, :self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.k_buf = self.k_buf.index_select(0, indices)
            self.v_buf = self.v_buf.index_select(0, indices)
            self.keys = self.k_buf[:, :, :self.length]
            self.values = self.v_buf[:, :, :self.length]

    def reset(self) -> None:
        self.length = 0
        super().reset()


def _make_cache(model: PreTrainedModel, capacity: int) -> DynamicCache:
    """A DynamicCache whose plain full-attention layers are preallocated to ``capacity`` tokens."""
    cache = DynamicCache(config=model.config)
    if cache.layers:
        cache.layers = [_PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
    return cache


def _left_padded(rows: list[Any], width: int, max_new: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (B, width) left-padded with ``pad_id``, attention mask (B, width + max_new), 1 on every prompt
    token and every generated position)."""
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width + max_new), dtype=torch.long)
    for k, r in enumerate(rows):  # left padding
        input_ids[k, width - len(r.ids):] = torch.tensor(r.ids, dtype=torch.long)
        mask[k, width - len(r.ids):] = 1
    mask[:, width:] = 1
    return input_ids, mask


def _uniforms(rows: list[Any], sp: SamplingParams, max_new: int) -> torch.Tensor:
    """(B, max_new) float64 uniforms, one per row and step, from each row's own generator (seeded by the sample's
    prompt and index): a row's stream is the same whatever rows share its batch."""
    uniforms = torch.empty((len(rows), max_new), dtype=torch.float64)
    for k, r in enumerate(rows):
        g = torch.Generator()
        g.manual_seed(sample_seed(sp.seed, sp.index_offset + r.prompt_index, r.sample_index))
        # always sp.max_new_tokens draws: a row's stream must not depend on its batch's length limit
        uniforms[k] = torch.rand(sp.max_new_tokens, generator=g, dtype=torch.float64)[:max_new]
    return uniforms


def _select_rows(cache: DynamicCache, keep: torch.Tensor) -> None:
    for layer in cache.layers:
        if isinstance(layer, _PreallocatedLayer):
            layer.batch_select_indices(keep)
        elif getattr(layer, "is_initialized", False) and layer.keys is not None:
            layer.keys = layer.keys.index_select(0, keep)
            layer.values = layer.values.index_select(0, keep)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype in ("auto", "model"):
        return None
    if dtype not in _DTYPES:
        raise PipelineError(f"generation dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


@dataclass
class _Row:
    """One sequence being generated: prompt ``prompt_index``, sample ``sample_index``."""

    prompt_index: int
    sample_index: int
    ids: list[int]
    limit: int  # most tokens it may generate


class HFGenerator:
    """The ``hf`` backend: batched KV-cache decoding with the transformers model itself. The ``n`` samples of a
    prompt share one prefill pass (its KV cache rows are copied), as vLLM's prefix caching would.

    Args:
        model: a causal LM (``PreTrainedModel``). It is used as is (not copied) unless ``dtype`` asks for
            another dtype, in which case a converted copy is kept and :meth:`sync_weights` refreshes it.
        tokenizer: its tokenizer.
        batch_size: most sequences decoded together in one forward pass; None: as many as keep the KV cache
            of a batch within ``kv_cache_gib`` (at most 128: on the tiny model more rows ran no faster).
        kv_cache_gib: KV-cache budget of one batch when ``batch_size`` is None.
        dtype: None (the model's own), "float32", "bfloat16" or a torch dtype. bfloat16's speed against float32
            depends on the CPU (benchmarks/results/generation.json), and its log-probs differ from float32 ones.
        compact_at: drop finished rows from the batch once this fraction of its rows has finished.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, batch_size: int | None = None,
                 dtype: torch.dtype | str | None = None, compact_at: float = 0.25, kv_cache_gib: float = 2.0) -> None:
        if batch_size is not None and batch_size < 1:
            raise PipelineError(f"generation batch_size must be >= 1, got {batch_size}")
        want = _as_dtype(dtype)
        self.source = model
        self.model = model if want is None or want == model.dtype else copy.deepcopy(model).to(want)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.kv_cache_gib = kv_cache_gib
        self.compact_at = compact_at
        self.eos_ids = eos_token_ids(tokenizer, model.config, getattr(model, "generation_config", None))
        self.max_length = model_max_length(model.config)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        forward_params = inspect.signature(self.model.forward).parameters
        self._takes_logits_to_keep = "logits_to_keep" in forward_params
        # transformers >= 5.2x renamed past_key_values to cache
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"
        heads = int(getattr(model.config, "num_attention_heads", None) or 1)  # per row of a decode step; under GQA
        self._heads = min(heads, int(getattr(model.config, "num_key_value_heads", None) or heads))  # the KV heads
        self._stop_checkers: dict[tuple[str, ...], StopChecker] = {}

    # -- public API -------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[str], sp: SamplingParams) -> list[list[Completion]]:
        """``sp.n`` completions for each prompt, ``result[prompt_index][sample_index]``."""
        prompt_ids = tokenize_prompts(self.tokenizer, prompts)
        return self.generate_ids(prompt_ids, sp)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sp: SamplingParams) -> list[list[Completion]]:
        """Like :meth:`generate` for prompts given as token ids."""
        results: list[list[Completion | None]] = [[None] * sp.n for _ in prompt_ids]
        rows: list[_Row] = []
        n_rows = 1 if sp.greedy else sp.n  # greedy samples are identical: decode once, copy
        for i, ids in enumerate(prompt_ids):
            limit = sp.max_new_tokens
            if self.max_length is not None:
                limit = min(limit, self.max_length - len(ids))
            if limit <= 0:
                results[i] = [Completion("", [], [], "length") for _ in range(sp.n)]
                continue
            rows.extend(_Row(i, j, list(ids), limit) for j in range(n_rows))
        # similar lengths together: less padding
        rows.sort(key=lambda r: len(r.ids))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                size = self._rows_per_batch(rows)
                for start in range(0, len(rows), size):
                    chunk = rows[start:start + size]
                    for row, comp in zip(chunk, self._decode(chunk, sp), strict=True):
                        results[row.prompt_index][row.sample_index] = comp
        finally:
            self.model.train(was_training)
        if sp.greedy and sp.n > 1:
            for res in results:
                first = res[0]
                if first is not None:
                    res[1:] = [Completion(first.text, list(first.token_ids), list(first.logprobs), first.finish_reason)
                               for _ in range(sp.n - 1)]
        return [list(res) for res in results]  # type: ignore[arg-type]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Use ``model``'s current weights. A no-op when the generator decodes with that very model."""
        if model is self.model:
            return
        with torch.no_grad():
            self.model.load_state_dict(model.state_dict())

    def score_ids(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """The sampler's own teacher-forced log softmax(logits)[token] (T = 1, the full distribution) of each
        completion's tokens after its prompt, one full forward per pair through the model this generator decodes
        with (its bf16 copy, if any), by ``stages.core.logprobs.completion_logprobs``: the trainer's plain pass, so
        that the two agree bit for bit on equal float32 weights (the weight-sync probe, stages/rl/sync.py)."""
        out = []
        with torch.inference_mode():
            for p, c in zip(prompt_ids, completion_ids, strict=True):
                ids = torch.tensor([list(p) + list(c)], dtype=torch.long, device=self.model.device)
                lp, _ = completion_logprobs(self.model, ids, torch.ones_like(ids), len(p), 1.0)
                out.append(lp[0].float().tolist())
        return out

    def close(self) -> None:
        """Nothing to release (kept for symmetry with the vllm backend)."""

    # -- decoding ---------------------------------------------------------------------------------------

    def _rows_per_batch(self, rows: list[_Row]) -> int:
        if self.batch_size is not None:
            return self.batch_size
        if not rows:
            return 1
        cfg = self.model.config
        n_layers = getattr(cfg, "num_hidden_layers", 1)
        n_heads = getattr(cfg, "num_attention_heads", 1)
        n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
        per_token = 2 * n_layers * n_kv * head_dim * self.model.dtype.itemsize
        longest = max(len(r.ids) + r.limit for r in rows)
        return int(max(1, min(128, self.kv_cache_gib * 2**30 // (per_token * longest))))

    def _stop_checker(self, stop: tuple[str, ...], vocab: int, device: torch.device) -> StopChecker:
        key = stop
        if key not in self._stop_checkers:
            self._stop_checkers[key] = StopChecker(self.tokenizer, stop, vocab, device)
        return self._stop_checkers[key]

    def _forward(self, cache: DynamicCache, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor) -> torch.Tensor:
        kw: dict[str, Any] = {"logits_to_keep": 1} if self._takes_logits_to_keep else {}
        kw[self._cache_kw] = cache
        with threads.invariant_attention(input_ids, self._heads):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, **kw)
        return out.logits[:, -1, :].float()

    def _decode(self, rows: list[_Row], sp: SamplingParams) -> list[Completion]:
        device = self.model.device
        b = len(rows)
        width = max(len(r.ids) for r in rows)
        max_new = max(r.limit for r in rows)
        input_ids, mask = _left_padded(rows, width, max_new, self.pad_id)
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
        next_pos = torch.tensor([len(r.ids) for r in rows], dtype=torch.long, device=device)
        limits = torch.tensor([r.limit for r in rows], dtype=torch.long, device=device)
        cache = _make_cache(self.model, width + max_new)
        logits = self._prefill(cache, rows, input_ids, mask[:, :width], positions)
        vocab = logits.shape[-1]
        eos = torch.zeros(vocab, dtype=torch.bool, device=device)
        eos[[i for i in self.eos_ids if i < vocab]] = True
        checker = self._stop_checker(sp.stop, vocab, device) if sp.stop else None
        # one uniform per row and step, drawn up front from the row's own generator: sampling does not
        # depend on which other rows share the batch
        uniforms = None if sp.greedy else _uniforms(rows, sp, max_new).to(device)
        out_tok, out_lp, n_done, by_string = self._steps(cache, logits, sp, uniforms, limits, eos, checker, mask,
                                                         next_pos, width, max_new)
        out_tok_l, out_lp_l = out_tok.tolist(), out_lp.tolist()
        comps = []
        for k in range(b):
            n = n_done[k]
            ids = out_tok_l[k][:n]
            stopped = by_string[k] or (n > 0 and ids[-1] in self.eos_ids)
            text = finish_text(self.tokenizer, ids, sp.stop, by_string[k])
            comps.append(Completion(text, ids, out_lp_l[k][:n], "stop" if stopped else "length"))
        return comps

    def _prefill(self, cache: Any, rows: list[_Row], input_ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        """The prompts' forward pass into ``cache``: the samples of one prompt share its prefill, run once per
        distinct prompt, then the KV cache rows copied; returns each row's next-token logits."""
        device = input_ids.device
        first: dict[int, int] = {}  # prompt index -> its position among the distinct prompts
        uniq_rows: list[int] = []
        for k, r in enumerate(rows):
            if r.prompt_index not in first:
                first[r.prompt_index] = len(uniq_rows)
                uniq_rows.append(k)
        if len(uniq_rows) == len(rows):
            return self._forward(cache, input_ids, mask, positions)
        uniq = torch.tensor(uniq_rows, dtype=torch.long, device=device)
        inverse = torch.tensor([first[r.prompt_index] for r in rows], dtype=torch.long, device=device)
        logits = self._forward(cache, input_ids[uniq], mask[uniq], positions[uniq])
        _select_rows(cache, inverse)
        return logits.index_select(0, inverse)

    def _steps(self, cache: Any, logits: torch.Tensor, sp: SamplingParams, uniforms: torch.Tensor | None,
               limits: torch.Tensor, eos: torch.Tensor, checker: Any, mask: torch.Tensor, next_pos: torch.Tensor,
               width: int, max_new: int) -> tuple[torch.Tensor, torch.Tensor, list[int], list[bool]]:
        """The decode steps: a token per live row per step until EOS, a stop string or its limit, finished rows
        compacted out of the batch (and the cache) once ``compact_at`` of them are done. Returns (tokens, their
        log-probs, tokens per row, whether a row stopped at a stop string)."""
        b, device = logits.shape[0], logits.device
        out_tok = torch.zeros((b, max_new), dtype=torch.long, device=device)
        out_lp = torch.zeros((b, max_new), dtype=torch.float32, device=device)
        n_done = [0] * b  # tokens generated per row, set when it finishes
        by_string = [False] * b
        live = torch.arange(b, device=device)  # original row index of each batch row
        finished = torch.zeros(b, dtype=torch.bool, device=device)  # per batch row
        n_live_rows = b
        for step in range(max_new):
            tok, lp = self._pick(logits, sp, None if uniforms is None else uniforms[live, step])
            out_tok[live, step] = tok
            out_lp[live, step] = lp
            done_now = ~finished & (eos[tok] | (step + 1 >= limits[live]))
            if checker is not None:
                cand = (~finished & ~done_now & checker.candidates[tok]).nonzero().flatten().tolist()
                if cand:
                    rows_tok = out_tok[live[cand], : step + 1].tolist()
                    for k, ids in zip(cand, rows_tok, strict=True):
                        if checker.hit(ids):
                            done_now[k] = True
                            by_string[int(live[k])] = True
            if bool(done_now.any()):
                for k in done_now.nonzero().flatten().tolist():
                    n_done[int(live[k])] = step + 1
                finished |= done_now
                n_fin = int(finished.sum())
                if n_fin == len(live):
                    break
                if n_fin >= max(1, self.compact_at * n_live_rows) and len(live) - n_fin >= 1:
                    keep = (~finished).nonzero().flatten()
                    _select_rows(cache, keep)
                    live, tok, finished = live[keep], tok[keep], finished[keep]
                    mask, next_pos = mask[keep], next_pos[keep]
                    n_live_rows = len(live)
            logits = self._forward(cache, tok[:, None], mask[:, : width + step + 1], next_pos[:, None])
            next_pos = next_pos + 1
        return out_tok, out_lp, n_done, by_string

    @staticmethod
    def _pick(logits: torch.Tensor, sp: SamplingParams, u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token of each row and its log-prob under softmax(logits / T), T = 1 when greedy; with
        ``sp.logprobs_mode == "processed"`` under the top-k / top-p-restricted, renormalised distribution it was
        drawn from.

        Sampling is by inverse CDF: row ``k`` takes the first token whose cumulative probability (over the
        top-k/top-p-restricted, renormalised distribution, in vocabulary order) exceeds ``u[k]``.
        """
        if sp.greedy:
            logp = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(dim=-1)
            return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
        assert u is not None
        logp = torch.log_softmax(logits / sp.temperature, dim=-1)
        keep = truncation_mask(logp, sp.top_k, sp.top_p)
        scores = logp if keep is None else logp.masked_fill(~keep, float("-inf"))
        cdf = scores.exp().cumsum(dim=-1, dtype=torch.float64)
        target = (u * cdf[:, -1]).unsqueeze(-1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=scores.shape[-1] - 1)
        if keep is not None and sp.logprobs_mode == "processed":
            logp = scores - torch.logsumexp(scores, dim=-1, keepdim=True)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


# ----------------------------------------------------------------------------------------------------------
# factory


def cuda_available() -> bool:
    """Whether a CUDA GPU is usable (the condition for the vllm backend being the default)."""
    return torch.cuda.is_available()


def vllm_importable() -> bool:
    """Whether the vllm package can be imported in this environment (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: Backend) -> Literal["hf", "vllm"]:
    """``auto`` -> ``vllm`` when a CUDA GPU and vllm are present, else ``hf`` (the stages that generate record what it
    resolved to: stages/core/hardware.py). No environment variable changes it: a backend other than the machine's
    choice is a params value (``backend: hf`` / ``vllm``), which DVC tracks."""
    if backend == "auto":
        return "vllm" if cuda_available() and vllm_importable() else "hf"
    if backend not in ("hf", "vllm"):
        raise PipelineError(f"generation backend {backend!r} is not one of auto, hf, vllm")
    return backend


def make_generator(backend: Backend, model_or_path: PreTrainedModel | str | os.PathLike[str],
                   tokenizer: PreTrainedTokenizerBase | None = None, **kw: Any) -> HFGenerator | Any:
    """Build a generator.

    Args:
        backend: "hf", "vllm" or "auto" (see :func:`resolve_backend`).
        model_or_path: a loaded causal LM, or a model directory (loaded with stages.core.modeling).
        tokenizer: the model's tokenizer; None loads it from ``model_or_path`` (which must then be a path).
        **kw: backend options: hf -> :class:`HFGenerator` (batch_size, dtype, compact_at); vllm ->
            ``VLLMGenerator`` (dtype, gpu_memory_utilization, max_model_len, enforce_eager, engine options).
    """
    name = resolve_backend(backend)
    if tokenizer is None:
        if isinstance(model_or_path, torch.nn.Module):
            raise PipelineError("make_generator: pass the tokenizer along with a model object")
        from stages.core.modeling import load_tokenizer

        tokenizer = load_tokenizer(model_or_path)
    if name == "vllm":
        from stages.core.vllm_backend import VLLMGenerator

        return VLLMGenerator(model_or_path, tokenizer, **kw)
    if isinstance(model_or_path, torch.nn.Module):
        model = model_or_path
    else:
        from stages.core.modeling import load_model

        dtype = _as_dtype(kw.pop("dtype", None)) or torch.float32
        model = load_model(model_or_path, dtype=dtype)
    return HFGenerator(model, tokenizer, **kw)  # type: ignore[arg-type]

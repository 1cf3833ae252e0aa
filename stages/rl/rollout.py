"""Rollouts for GRPO: sample G outputs per question, score them, and lay them out as tensors.

Sampling goes through the project's generation interface (stages.core.generation), so the same code
runs on HF (CPU) and vLLM. The log-probs used in the ratio (pi_old) and the KL (pi_ref) come from a
teacher-forced forward pass of the training / reference model over prompt + completion, with
logits / temperature; with top-k / top-p the distribution the sampler drew from, renormalised over the kept tokens
(:func:`truncation`), as the sampler reports its own (``logprobs_mode="processed"``). The sampler's log-probs feed the
``mismatch`` metrics (verl #2996) and the optional importance-sampling correction (stages/rl/corrections.py).

Token in, token out: the ids the trainer scores are the ids the sampler saw and produced. The prompts go to the
generator as token ids (:func:`sample_outputs` tokenises them once; :class:`Sample` keeps them), the completion is the
generator's ``token_ids`` (with TIR, the tool loop's token carry: generated ids plus the injected output's ids), and
:func:`build_rollout` lays out exactly those ids; no text is ever re-tokenised (tokenisers whose decode does not
re-encode to the same ids would otherwise change the sequence: TRL #5224, verl #3720).

Tensor layout of a rollout batch of N = Q * G outputs (row n = q * G + g)::

    input_ids       (N, P + T)  prompt left-padded to P, completion right-padded to T
    attention_mask  (N, P + T)
    completion_mask (N, T)      1 on generated tokens (EOS included)
    loss_mask       (N, T)      completion_mask minus injected tool-output tokens, excluded outputs, ...
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stages.core.generation import SamplingParams, make_generator, model_max_length, resolve_backend, sample_seed
from stages.core.logprobs import IGNORE, completion_logprobs, lm_logprobs, select_cache_rows
from stages.core.prompts import chat_prompt, prompt_format, rl_prompt
from stages.core.tool_loop import MODES, LoopStats, Stream, run_loop

log = logging.getLogger(__name__)

_OUTPUT_BLOCK = re.compile(r"```output\n.*?(?:```|$)", re.DOTALL)


@dataclass(frozen=True)
class Sample:
    """One sampled output as :func:`build_rollout` reads it: the generation interface's fields (``text``,
    ``token_ids``, ``logprobs``, ``finish_reason``; stages.core.generation.Completion has them too) plus how it was
    made. ``policy_mask``: 1 per token the policy generated, 0 per injected tool-output token (None: all generated).
    ``mode``: cot / pot / tir. ``program_answer``: pot's ``str(solution())`` (None when the program failed);
    ``exec_status``: its sandbox status. ``rounds`` / ``executions``: tir's generations and program runs."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_mask: list[int] | None = None
    mode: str = "cot"
    program_answer: str | None = None
    exec_status: str | None = None
    rounds: int = 1
    executions: int = 0
    prompt_ids: list[int] | None = None
    """The prompt's ids as the generator got them (token in; None: :func:`build_rollout` tokenises the prompt)."""

    @classmethod
    def from_stream(cls, st: Stream, mode: str) -> Sample:
        """The sample of one stream of the tool loop (token carry)."""
        return cls(st.text, list(st.token_ids), list(st.logprobs), st.finish_reason, list(st.policy_mask), mode,
                   st.program_answer, st.exec_status, st.rounds, st.executions, list(st.prompt_ids) or None)


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
    modes: list[str] = field(default_factory=list)
    """Per output: its rollout mode (cot / pot / tir)."""
    program_answers: list[str | None] = field(default_factory=list)
    """Per output: pot's program answer (None otherwise, or when the program failed)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The sampling's own metrics (programs run, sandbox time, TIR rounds; stages.core.tool_loop.LoopStats)."""

    @property
    def completion_lengths(self) -> Tensor:
        return self.completion_mask.sum(-1)


def written_output_mask(token_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """1 per token, 0 for tokens that overlap a ```output ... ``` block in the decoded text.

    It leaves out the output blocks the policy wrote itself, the ```output header included (no program ran: the
    output is invented). Injected tool output is masked by provenance (``Sample.policy_mask``); this rule is for the
    outputs of the modes that run no loop between the policy's tokens (cot, pot) when
    ``grpo.loss.mask_written_outputs`` asks for it. Cheap when there is no such block (one decode).
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


tool_output_mask = written_output_mask
"""The former name of :func:`written_output_mask`."""


def rollout_prompt(question: str, mode: str, template: str = "deepseekmath", tokenizer: Any = None) -> str:
    """The prompt of ``question`` in rollout ``mode``: cot the RL template's (stages.core.prompts.rl_prompt, in the
    model's prompt format with ``tokenizer``), pot / tir the prompt of the mode in the model's prompt format
    (stages.core.prompts.prompt_format; the deepseekmath chat prompt without ``tokenizer``): the SFT data's and the
    evaluation's."""
    if mode == "cot":
        return rl_prompt(question, template, tokenizer)
    if tokenizer is not None:
        return prompt_format(tokenizer).prompt(question, mode)  # type: ignore[arg-type]
    return chat_prompt(question, mode)  # type: ignore[arg-type]


def question_modes(r: Any, seed: int, step: int, questions: Sequence[int]) -> list[str]:
    """The rollout mode of each question (``grpo.rollout``: ``r.mode``; with ``mixture``, each question's mode drawn
    from ``r.mixture``'s shares by a hash of (seed, step, question index): the same on every rank and on resume)."""
    if r.mode != "mixture":
        return [r.mode] * len(questions)
    shares = [(m, float(getattr(r.mixture, m))) for m in MODES]
    total = sum(w for _, w in shares)
    out = []
    for q in questions:
        u = sample_seed(seed, step, q) / 2.0**63 * total
        acc, pick = 0.0, next(m for m, w in reversed(shares) if w > 0)
        for m, w in shares:
            acc += w
            if w > 0 and u < acc:
                pick = m
                break
        out.append(pick)
    return out


def sample_outputs(generator: Any, tokenizer: Any, questions: Sequence[str], modes: Sequence[str], p: Any, seed: int,
                   pool: Executor | None = None) -> tuple[list[list[Sample]], dict[str, float]]:
    """``p.rollout.group_size`` outputs per question in its mode (``p``: the grpo params: temperature, top_p, max_new_tokens
    per generation, template, rollout), through the tool loop with token carry (stages.core.tool_loop.run_loop, one
    call per mode present, cot first). Returns (samples[q][g], metrics: the sandbox's figures and tir's rounds when a
    program-running mode is present, and each mode's share of the outputs with a mixture).

    Seeds: the cot call is seeded with ``seed`` (one chunk, one round: the plain sampling of before the modes);
    round r of chunk c of mode m with ``seed + 7919 c + 104729 r + 15485863 m``. ``pool``: the sandbox threads (None:
    ``p.rollout.exec_workers`` threads for this call)."""
    r = p.rollout
    out: list[list[Sample]] = [[] for _ in questions]
    stats = LoopStats()
    present = [m for m in MODES if m in modes]
    own = None
    if pool is None and any(m != "cot" for m in present):
        own = pool = ThreadPoolExecutor(max_workers=r.exec_workers, thread_name_prefix="sandbox")
    try:
        for mode in present:
            idx = [k for k, m in enumerate(modes) if m == mode]
            prompts = [rollout_prompt(questions[k], mode, p.template, tokenizer) for k in idx]
            offset = 15_485_863 * MODES.index(mode)

            def sampling(round_: int, chunk: int, offset: int = offset) -> SamplingParams:
                return SamplingParams(temperature=p.rollout.temperature, top_p=p.rollout.top_p, top_k=p.rollout.top_k,
                                      n=p.rollout.group_size, max_new_tokens=p.rollout.max_new_tokens,
                                      seed=seed + offset + 7_919 * chunk + 104_729 * round_, logprobs_mode="processed")

            streams = run_loop(generator, prompts, mode, sampling, pool, max_rounds=r.tir_max_rounds,
                               exec_timeout_s=r.exec_timeout_s, carry="tokens", tokenizer=tokenizer, chunks=r.chunks,
                               stats=stats)
            for k, group in zip(idx, streams, strict=True):
                out[k] = [Sample.from_stream(st, mode) for st in group]
    finally:
        if own is not None:
            own.shutdown(wait=True)
    metrics: dict[str, float] = {}
    flat = [s for group in out for s in group]
    if any(m != "cot" for m in present):
        metrics.update(stats.metrics())
        tir = [s for s in flat if s.mode == "tir"]
        if tir:
            metrics["tir_rounds_mean"] = sum(s.rounds for s in tir) / len(tir)
            metrics["tir_executions_mean"] = sum(s.executions for s in tir) / len(tir)
    if len(present) > 1 and flat:
        for m in present:
            metrics[f"mode_frac_{m}"] = sum(s.mode == m for s in flat) / len(flat)
    return out, metrics


def build_rollout(rows: list[dict[str, Any]], prompts: list[str], completions: list[list[Any]], tokenizer: Any,
                  *, mask_truncated: bool, mask_written: bool = False) -> Rollout:
    """Tokenise prompts (with BOS, as the tokenizer adds it) and concatenate the generated ids.

    ``completions[q][g]`` follows the generation interface (token_ids, logprobs, text, finish_reason); a
    :class:`Sample` also brings its ``policy_mask`` (injected tool-output tokens get loss mask 0), mode, program
    answer and the prompt ids the generator got (used as they are: token in, token out; without them the prompt is
    tokenised here, as the generator does). ``mask_written``: the outputs of the modes without a tool loop (cot, pot) also lose the ```output blocks
    they wrote themselves (:func:`written_output_mask`; ``grpo.loss.mask_written_outputs``).
    """
    G = len(completions[0])
    pad = tokenizer.pad_token_id
    prompt_ids = [list(getattr(group[0], "prompt_ids", None) or tokenizer(p)["input_ids"])
                  for p, group in zip(prompts, completions, strict=True)]
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
            pm = getattr(c, "policy_mask", None)
            if mask_written and getattr(c, "mode", "cot") != "tir":
                pm = written_output_mask(ids, tokenizer)
            lmask[n, :len(ids)] = 1.0 if pm is None else torch.tensor(pm, dtype=torch.float)
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
        modes=[getattr(c, "mode", "cot") for _, c in flat],
        program_answers=[getattr(c, "program_answer", None) for _, c in flat],
    )


def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float,
                   *, entropy: bool = False, share_prompts: bool = False, chunk_tokens: int | None = None,
                   top_k: int = 0, top_p: float = 1.0, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced log pi(o_t | q, o_<t) of the completion tokens, from logits / temperature.

    input_ids/attention_mask: (B, P + T), prompt left-padded to P. Returns (B, T) float32 log-probs (with
    gradient if enabled) and, when ``entropy``, the (B, T) entropy of the full-vocabulary
    distribution softmax(logits / T) (detached, unless ``entropy_grad``: an entropy bonus); both are 0 at padded
    completion positions (attention mask 0).
    Position ids follow the attention mask, as in generation with left padding. The vocabulary is handled in
    chunks of ``chunk_tokens`` positions (stages.core.logprobs): no (B, T, V) tensor is made. ``top_k`` / ``top_p``
    (the rollout's sampling settings): the log-probs of the truncated distribution the sampler drew from,
    renormalised over the kept tokens (stages.core.logprobs; 0 / 1: the full distribution).

    ``share_prompts``: rows with the same prompt (a GRPO group's G outputs) run the prompt through the model
    once: one pass over the U distinct prompts fills a KV cache, whose rows are copied to the B outputs
    (differentiably: the gradient of every output flows back into its prompt's pass), then one pass over the
    completions attends to it. The same numbers as the plain pass up to float rounding (tested), with the
    prompt tokens computed U instead of B times. A model training with gradient checkpointing takes the plain
    pass when gradients are on (transformers drops the KV cache of checkpointed layers).
    """
    T = input_ids.shape[1] - prompt_len
    kw = {"temperature": temperature, "entropy": entropy, "chunk_tokens": chunk_tokens, "top_k": top_k, "top_p": top_p,
          "entropy_grad": entropy_grad}
    # T = 2 would leave the cached pass one query position, whose attention gradients round differently at 1 and 2
    # threads (torch 2.13); the plain pass is the same bits at any thread count (stages/core/threads.py)
    if share_prompts and T > 2 and prompt_len > 0 and not _checkpointing(model):
        prompts = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], dim=1)
        uniq, inverse = torch.unique(prompts, dim=0, return_inverse=True)
        if uniq.shape[0] < input_ids.shape[0]:
            targets = input_ids[:, prompt_len:].masked_fill(attention_mask[:, prompt_len:] == 0, IGNORE)
            return _shared_prompt_logprobs(model, uniq, inverse, input_ids, attention_mask, prompt_len, targets, kw)
    return completion_logprobs(model, input_ids, attention_mask, prompt_len, **kw)


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
    select_cache_rows(cache, inverse)  # (U, ...) -> (B, ...) rows, differentiable, deterministic
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    # positions P..P+T-2 predict tokens 1..T-1
    _, lp, ent = lm_logprobs(model, targets[:, 1:], input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1],
                             position_ids=pos[:, P:-1], use_cache=True, **{ckw: cache}, **kw)
    return torch.cat([lp0, lp], dim=1), (torch.cat([ent0, ent], dim=1) if ent is not None else None)


def _cache_kwarg(model: Any) -> str:
    fwd = getattr(model, "module", model).forward  # a DeepSpeed engine wraps the model
    return "cache" if "cache" in inspect.signature(fwd).parameters else "past_key_values"


def trim(ro: Rollout, idx: Tensor) -> tuple[Tensor, Tensor, int]:
    """input_ids / attention_mask of rows ``idx`` with the completion trimmed to their longest; returns T'."""
    t = int(ro.completion_mask[idx].sum(-1).max().clamp(min=1))
    P = ro.prompt_len
    return ro.input_ids[idx, : P + t], ro.attention_mask[idx, : P + t], t


def truncation(p: Any) -> dict[str, Any]:
    """The grpo params' top-k / top-p as keywords of :func:`token_logprobs`: every log-prob of the loss is that of the
    distribution the sampler drew from (``logprobs_mode="processed"`` on the sampler's side)."""
    return {"top_k": p.rollout.top_k, "top_p": p.rollout.top_p}


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

# ---------------------------------------------------------------------------------------------
# the rollout generator


TIR_INJECT_TOKENS = 128
"""Context reserved per TIR round for the injected output block (the output is cut to 103 characters)."""


def max_model_len(tokenizer: Any, model: Any, questions: list[str], max_new_tokens: int,
                  template: str = "deepseekmath", modes: tuple[str, ...] = ("cot",), tir_rounds: int = 1) -> int:
    """Longest prompt (``questions`` in the RL ``template``, or the PoT / TIR prompt of ``modes``) plus what the
    completion may take (``max_new_tokens``; tir: per round, plus :data:`TIR_INJECT_TOKENS` per injected output),
    capped by the model's context: the vLLM engine's ``max_model_len`` (its KV-cache reservation follows it)."""
    prompts = [rollout_prompt(q, m, template, tokenizer) for q in questions for m in modes]
    longest = max((len(ids) for ids in tokenizer(prompts)["input_ids"]), default=1) if prompts else 1
    gen = max_new_tokens if "tir" not in modes else tir_rounds * (max_new_tokens + TIR_INJECT_TOKENS)
    cap = model_max_length(model.config) or (longest + gen)
    return int(min(cap, longest + gen))


def rollout_modes(p: Any) -> tuple[str, ...]:
    """The rollout modes a run may sample (``grpo.rollout``)."""
    r = p.rollout
    if r.mode != "mixture":
        return (r.mode,)
    return tuple(m for m in ("cot", "pot", "tir") if getattr(r.mixture, m) > 0)


def rollout_generator(p: Any, model: Any, tokenizer: Any, questions: list[str], max_new_tokens: int,
                      bf16: bool = False) -> Any:
    """The rollout generator of ``p.rollout.backend``: hf (decodes with the policy object itself) or a vLLM engine sized by
    ``vllm_gpu_memory_utilization`` and ``max_model_len`` (see :func:`max_model_len`), with sleep mode on a GPU
    when ``vllm_enable_sleep_mode``; bfloat16 when the update trains in bf16. Built after the update path, so
    under a multi-rank launch the engine joins its process group (stages.core.vllm_backend: external launcher,
    this rank's device, ``vllm_tensor_parallel_size`` ranks per engine) and starts from the policy in memory."""
    if resolve_backend(p.rollout.backend) == "hf":  # bf16: a bf16 copy of an fp32 policy (refreshed by sync_weights)
        return make_generator("hf", model, tokenizer, batch_size=p.questions_per_step * p.rollout.group_size,
                              dtype="bfloat16" if bf16 else None)
    modes = tuple(dict.fromkeys(("cot", *rollout_modes(p))))  # cot: the held-out curve's prompts
    kw: dict[str, Any] = {"gpu_memory_utilization": p.rollout.vllm.gpu_memory_utilization, "seed": p.seed,
                          "max_model_len": max_model_len(tokenizer, model, questions, max_new_tokens, p.template,
                                                         modes, p.rollout.tir_max_rounds)}
    if p.rollout.vllm.enable_sleep_mode:
        if torch.cuda.is_available():
            kw["enable_sleep_mode"] = True
        else:
            log.info("grpo.rollout.vllm.enable_sleep_mode: ignored on CPU (vLLM sleeps on CUDA only)")
    if bf16:
        kw["dtype"] = "bfloat16"
    if p.rollout.vllm.tensor_parallel_size > 1:
        kw["tensor_parallel_size"] = p.rollout.vllm.tensor_parallel_size
    return make_generator("vllm", model, tokenizer, **kw)


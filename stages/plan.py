"""The memory planner: will every stage fit, per GPU, and how many GPU-hours will it take?

    python -m stages.plan --params params/deepseekmath-7b.yaml --gpus 8 --gpu-mem 80
    python -m stages.plan --params params.yaml --gpus 1 --gpu-mem 24 --mfu 0.35 --json plan.json

For each stage it prints the estimated peak memory per GPU and its parts (weights, gradients, optimizer states by
ZeRO stage and offload, activations with or without gradient checkpointing, the logits' working set, DeepSpeed's
buckets, the vLLM engine's KV cache), whether it fits in ``--gpu-mem`` (after ``--reserve`` GiB for the CUDA
context and the allocator's slack), the largest micro-batch that fits, and GPU-hours at ``--mfu`` of the GPU's bf16
peak (``--gpu-tflops``, default an H100 SXM's 989 dense).

Every number is counted from first principles, not fitted: the parameter count of the architecture; bytes per
parameter of each state (AdamW: two fp32 moments; DeepSpeed's fp32 master copy and gradient partition, 1/N of
them per rank under ZeRO 1-2); the tensors autograd keeps for the backward pass of a transformers Llama / Qwen2
decoder layer, per token::

    2 RMSNorms:  (4 + d) h each   (the float32 upcast of the input and the normalised output in the model dtype, d
                                   bytes: 4 for float32, 2 for bf16)
    attention:   d (3h + 2 kv')  + 4 n_heads   (rotated q, k', v', the kernel's output and its transposed copy for
                                   o_proj, the float32 log-sum-exp; kv' = h when transformers repeats the key/value
                                   heads for a masked grouped-query sdpa call, else kv)
    MLP:         4 d i            (gate and up outputs, SiLU(gate), their product)

with gradient checkpointing only the d h layer input per layer plus one recomputed layer; the chunked log-probs of
stages/core/logprobs.py (two or three float32 (chunk, vocabulary) tensors forward, two backward plus a float32
head-gradient accumulator); AdamW's step temporaries (two per-tensor temporaries of the largest tensor on CPU, one
copy of the states on CUDA, where torch's AdamW is multi-tensor); DeepSpeed's gradient bucket (ZeRO-2 allocates
``reduce_bucket_size`` elements; on CPU only the pages written are resident) and ZeRO-0's flattened all-reduce
copy. The peak is the largest of the phases of a training step (initialisation, forward, backward, optimizer step).
:func:`train_memory` is what tests/test_plan.py checks against the peak resident memory of fresh CPU processes
(benchmarks/memory.py); docs/results/real-mode.md has the 7B plan.

Model shapes: a local model directory's config.json, the architecture of a known hub id (:data:`KNOWN`), or the tiny
model built from the base_model section.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stages.rl.needs import run_needs

GIB = 2**30
DS_BUCKET = 500_000_000
"""DeepSpeed's default reduce_bucket_size (elements); stages/train/ds_config.py keeps the default."""


@dataclass(frozen=True)
class ModelShape:
    """A Llama / Qwen2-style decoder's architecture."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    out_features: int | None = None
    """Rows of the output head: None = the vocabulary (a causal LM); 1 for a reward model's score head (a token
    classifier with one label: transformers' ``score`` Linear, bias included, beside the embedding table)."""

    @property
    def head_rows(self) -> int:
        return self.vocab if self.out_features is None else self.out_features

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Width of the key (and of the value) projection."""
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv
        attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    def n_params(self) -> int:
        """Parameters: embedding, head (unless tied; a score head has a bias), layers, final norm."""
        emb = self.vocab * self.hidden
        head = 0 if self.tied else self.head_rows * self.hidden + (self.head_rows if self.out_features else 0)
        return emb + head + self.layers * self.layer_params() + self.hidden

    def reward_model(self) -> ModelShape:
        """The reward model built on this backbone (stages/rl/rm/model.py: ``AutoModelForTokenClassification``
        with one label): the same embedding table, which its training trains, and a one-output score head."""
        return ModelShape(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate, self.vocab,
                          tied=False, qkv_bias=self.qkv_bias, out_features=1)

    def largest_tensor(self) -> int:
        return max(self.vocab * self.hidden, self.hidden * self.intermediate)

    def linear_maps(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear map of a decoder layer, by its module name."""
        h, kv, i = self.hidden, self.kv, self.intermediate
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def lora(self, rank: int, targets: list[str]) -> LoraShape:
        """The LoRA adapter of ``rank`` on the maps named ``targets`` (["all-linear"]: all seven) in every layer."""
        maps = self.linear_maps()
        names = list(maps) if list(targets) == ["all-linear"] else [t for t in maps if t in targets]
        per_layer = sum(rank * (maps[n][0] + maps[n][1]) for n in names)
        return LoraShape(rank=rank, params=self.layers * per_layer, maps=len(names),
                         adapted=self.layers * sum(maps[n][0] * maps[n][1] for n in names))

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        return cls(hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), heads=heads,
                   kv_heads=int(cfg.get("num_key_value_heads") or heads), intermediate=int(cfg["intermediate_size"]),
                   vocab=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)),
                   qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)))


@dataclass(frozen=True)
class LoraShape:
    """A LoRA adapter on a :class:`ModelShape` (stages/rl/lora.py): its trained parameters (A and B of every adapted
    map), the adapted maps per layer, and the base weights they adapt (merged for the sampler)."""

    rank: int
    params: int
    maps: int
    adapted: int


KNOWN: dict[str, ModelShape] = {
    # config.json of the hub models real mode names (no download needed to plan)
    "deepseek-ai/deepseek-coder-7b-base-v1.5": ModelShape(4096, 30, 32, 32, 11008, 102400),
    "deepseek-ai/deepseek-math-7b-base": ModelShape(4096, 30, 32, 32, 11008, 102400),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(896, 24, 14, 2, 4864, 151936, tied=True, qkv_bias=True),
    "Qwen/Qwen2.5-1.5B-Instruct": ModelShape(1536, 28, 12, 2, 8960, 151936, tied=True, qkv_bias=True),
}


@dataclass(frozen=True)
class TrainSetup:
    """How one model trains on one rank."""

    micro_batch: int
    seq: int
    world: int = 1
    deepspeed: bool = False
    zero: int = 0
    offload_optimizer: bool = False
    bf16: bool = False
    checkpointing: bool = False
    chunk: int = 256
    device: str = "cuda"
    masked: bool = True
    entropy: bool = False
    """The forward also computes the entropy (GRPO's update)."""
    autocast: bool = False
    """Plain PyTorch under bf16 autocast: float32 weights and states, bf16 matmul outputs."""
    lora: LoraShape | None = None
    """A LoRA adapter trains and the base is frozen: the states (master copy, moments, gradients) are the adapter's,
    the head computes no weight gradient, and each adapted map keeps its rank-r intermediate for the backward."""


@dataclass
class Estimate:
    """Bytes per rank: the parts and the phases of a step; ``peak`` is the largest phase."""

    parts: dict[str, float]
    phases: dict[str, float]

    @property
    def peak(self) -> float:
        return max(self.phases.values())

    def as_dict(self) -> dict[str, Any]:
        return {"peak_gib": round(self.peak / GIB, 3), "phase": max(self.phases, key=self.phases.get),
                "parts_gib": {k: round(v / GIB, 3) for k, v in self.parts.items()},
                "phases_gib": {k: round(v / GIB, 3) for k, v in self.phases.items()}}


def activation_bytes(m: ModelShape, tokens: int, d: int, *, masked: bool, sequences: int, seq: int,
                     wb: int | None = None) -> dict[str, float]:
    """Bytes autograd keeps per decoder layer and for the final norm, over ``tokens`` positions (module docstring):
    ``d`` bytes per element of matmul outputs, ``wb`` of the residual stream / norm outputs (the weights' dtype;
    default ``d``; 4 under autocast)."""
    h, i = m.hidden, m.intermediate
    wb = d if wb is None else wb
    kv_eff = h if masked and m.kv_heads < m.heads else m.kv
    per_token = 2 * (4 + wb) * h + d * (3 * h + 2 * kv_eff + 4 * i) + 4 * m.heads
    return {"layer": tokens * per_token, "final": tokens * (4 + wb) * h,
            "mask": sequences * seq * seq if masked else 0, "layer_input": tokens * d * h,
            "layer_backward": tokens * d * (2 * i + 2 * h)}


def head_bytes(m: ModelShape, tokens: int, chunk: int, wb: int, *, entropy: bool,
               head_grad: bool = True) -> tuple[float, float]:
    """(forward, backward) working set of the log-probs over the vocabulary (stages/core/logprobs.py); chunk 0
    materialises the logits (the logits, their float32 copy / temperature and the log-softmax). ``head_grad``: the
    head's weight trains (its float32 gradient accumulator; not with a frozen head, e.g. under LoRA)."""
    V, h = m.head_rows, m.hidden
    g = 1 if head_grad else 0
    if chunk == 0:
        full = tokens * V
        return full * (wb + 4 + 4 + (8 if entropy else 0)), full * (4 + 4 + 4 + wb) + 4 * V * h * g
    c = min(chunk, tokens) * V * 4
    fwd = (3 if entropy else 2) * c
    bwd = 2 * c + (wb * min(chunk, tokens) * V if wb != 4 else 0) + g * (4 * V * h + (V * h * wb if wb != 4 else 0))
    return fwd, bwd


def model_states(P: float, s: TrainSetup) -> dict[str, float]:
    """Bytes per rank of the model states of training ``P`` parameters with ``s``: ``weights`` (in the training
    dtype; partitioned under ZeRO-3), ``master_fp32`` (DeepSpeed's fp32 copy in bf16 mode), ``optimizer_states``
    (AdamW's two fp32 moments), ``gradients_fp32`` (the fp32 gradients the optimizer steps with) and
    ``gradients_16bit`` (the gradients in the weights' dtype where it is not fp32; ZeRO-1's unpartitioned ones).
    ZeRO 1-3 hold 1/N of the master copy, moments and gradients per rank; ``offload_optimizer`` keeps them in CPU
    memory (only the bucket, counted apart, stays on the GPU).

    ZeRO 1-2 without offload: weights 2P + (4 + 8 + 4 + 2)P/N in bf16, exactly DeepSpeed's
    ``estimate_zero2_model_states_mem_needs`` (2P + 18P/N); with offload 2P, also DeepSpeed's (tests/test_plan.py).
    With LoRA (``s.lora``) the weights are all P, every other state is the adapter's P_a: 2P + 18 P_a / N."""
    N = s.world if s.deepspeed else 1
    wb = 2 if (s.deepspeed and s.bf16) else 4
    out = {"weights": P * wb / (N if s.zero == 3 else 1)}
    if s.lora is not None:  # the frozen base holds weights only; the states below are the adapter's
        out["weights"] += s.lora.params * wb / (N if s.zero == 3 else 1)
        P = s.lora.params
    if not s.deepspeed or s.zero == 0:
        out["master_fp32"] = 4 * P if (s.deepspeed and s.bf16) else 0.0  # BF16_Optimizer's fp32 master copy
        out["optimizer_states"] = 8 * P
        out["gradients_fp32"] = 4 * P
        out["gradients_16bit"] = wb * P if wb != 4 else 0.0
        return out
    on_gpu = 0 if s.offload_optimizer else 1
    part = P / N
    out["master_fp32"] = 4 * part * on_gpu
    out["optimizer_states"] = 8 * part * on_gpu
    out["gradients_fp32"] = 4 * part * on_gpu
    out["gradients_16bit"] = (P * wb if s.zero == 1 else 0) + (wb * part * on_gpu if wb != 4 else 0)
    return out


def train_memory(m: ModelShape, s: TrainSetup) -> Estimate:
    """Peak bytes per rank of training ``m`` with ``s``: steady-state phases (AdamW's moments allocated)."""
    P = m.n_params()
    N = s.world if s.deepspeed else 1
    wb = 2 if (s.deepspeed and s.bf16) else 4
    gpu = s.device == "cuda"
    states = model_states(P, s)
    Pt = s.lora.params if s.lora is not None else P  # the trained parameters
    parts: dict[str, float] = {"weights": states["weights"]}
    if states["master_fp32"]:
        parts["master_fp32"] = states["master_fp32"]
    parts["optimizer_states"] = states["optimizer_states"]
    grads = states["gradients_fp32"] + states["gradients_16bit"]
    largest = m.largest_tensor() if s.lora is None else max(max(io) for io in m.linear_maps().values()) * s.lora.rank
    if not s.deepspeed or s.zero == 0:
        opt_tmp = 4 * Pt if gpu else 2 * 4 * largest
        bucket = min(Pt, DS_BUCKET) * wb if s.deepspeed and N > 1 else 0  # the flattened all-reduce copy
    else:
        on_gpu_states = 0 if s.offload_optimizer else 1
        opt_tmp = (1 if gpu else 2) * 4 * (Pt / N) * on_gpu_states
        bucket = (DS_BUCKET if gpu else min(Pt, DS_BUCKET)) * wb
    parts["gradients"] = grads
    parts["ds_bucket"] = bucket
    if s.deepspeed and s.zero == 3:  # the gathered weights of the layer in use and the next (prefetch), and the head
        parts["zero3_gathered"] = (2 * m.layer_params() + m.vocab * m.hidden) * wb
    T = s.micro_batch * s.seq
    d = 2 if (s.autocast and not s.deepspeed) else wb
    act = activation_bytes(m, T, d, masked=s.masked, sequences=s.micro_batch, seq=s.seq, wb=wb)
    if s.checkpointing:
        A = m.layers * act["layer_input"] + act["layer"] + act["final"] + act["mask"]
    else:
        A = m.layers * act["layer"] + act["final"] + act["mask"]
    if s.lora is not None:  # each adapted map keeps A x (rank values per token) for the backward of B
        A += m.layers * s.lora.maps * T * s.lora.rank * d
    parts["activations"] = A
    f_head, b_head = head_bytes(m, T, s.chunk, wb, entropy=s.entropy, head_grad=s.lora is None)
    if d != wb:  # autocast: the head's bf16 matmul output next to its float32 copy
        f_head += min(s.chunk or T, T) * m.vocab * d
    parts["logits_forward"], parts["logits_backward"] = f_head, b_head
    parts["optimizer_step_temp"] = opt_tmp
    static = parts["weights"] + parts.get("master_fp32", 0) + parts["optimizer_states"] + parts.get("zero3_gathered", 0)
    phases = {
        "forward": static + A + f_head,
        # ZeRO-2's bucket fills while activations are still alive; ZeRO-0 flattens the gradients for its all-reduce
        # after the backward pass, when they are free
        "backward": static + (bucket + max(A + b_head + act["layer_backward"], grads) if s.zero >= 1 else
                              max(A + b_head + act["layer_backward"], grads + bucket)),
        "optimizer_step": static + grads + opt_tmp,
    }
    if s.deepspeed and s.zero in (1, 2):
        phases["initialisation"] = parts["weights"] + Pt * wb  # flattening the trained weights into one buffer
    return Estimate(parts, phases)


def inference_memory(m: ModelShape, tokens: int, *, wb: int, chunk: int = 256) -> float:
    """Bytes of a no-gradient forward (reference model, log-prob pass, reward model): the weights and the working
    set of the largest layer and of the log-probs."""
    h, i = m.hidden, m.intermediate
    return m.n_params() * wb + tokens * wb * (4 * h + 2 * i) + 2 * min(chunk or tokens, tokens) * m.vocab * 4


def hf_generation_memory(m: ModelShape, rows: int, length: int, *, wb: int) -> float:
    """Bytes of the hf backend's batched decoding beyond the weights: the KV cache preallocated for ``rows``
    sequences of ``length`` tokens, and a decode step's float32 logits (with the sampling's sorted copy)."""
    return 2 * m.layers * m.kv * length * rows * wb + 3 * rows * m.vocab * 4


def largest_micro_batch(m: ModelShape, s: TrainSetup, budget: float, limit: int = 1024) -> int:
    """The largest micro-batch whose estimated peak fits ``budget`` bytes (0: not even one)."""
    best, mb = 0, 1
    while mb <= limit and train_memory(m, _with(s, micro_batch=mb)).peak <= budget:
        best, mb = mb, mb * 2
    lo, hi = best, min(mb, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if train_memory(m, _with(s, micro_batch=mid)).peak <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _with(s: TrainSetup, **kw: Any) -> TrainSetup:
    return replace(s, **kw)


# ---------------------------------------------------------------------------------------------
# the pipeline's stages


@dataclass
class StagePlan:
    """One stage's plan: memory per GPU at ``world`` ranks, and the work its GPU-hours count."""

    stage: str
    peak: float
    parts: dict[str, float]
    micro_batch: int
    max_micro_batch: int | None
    flops: float
    notes: list[str] = field(default_factory=list)
    rollout_flops: float = 0.0
    """Model FLOPs of sampling (autoregressive decoding, far from a GPU's peak: its own MFU)."""
    world: int = 1
    """Ranks the memory is planned for (``--gpus``)."""
    file_world: int | None = None
    """The params file's own world size (``launcher.nproc_per_node x nnodes``); None: the section has no launcher."""
    assumes: str = ""
    """What the GPU-hours count, short (``498.1B tokens``, ``16,000 questions``)."""
    work: str = ""
    """The same, spelled out from the params (steps x batch x ranks x length)."""
    warnings: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    """When it does not fit: changes that would make it fit (each alone, unless said)."""

    def gpu_hours(self, mfu: float, tflops: float, rollout_mfu: float) -> float:
        """GPU-hours of the stage's model FLOPs at ``mfu`` (training, log-prob passes) and ``rollout_mfu``
        (sampling) of ``tflops`` per GPU, summed over the GPUs."""
        return (self.flops / mfu + self.rollout_flops / rollout_mfu) / (tflops * 1e12) / 3600


def train_flops(m: ModelShape, tokens: float, seq: int, checkpointing: bool) -> float:
    """Model FLOPs of training on ``tokens`` tokens: 6 per parameter and token (forward 2, backward 4) plus causal
    attention (12 L h s / 2 per token), and one more forward (2 + attention / 3) with checkpointing."""
    per = 6 * m.n_params() + 6 * m.layers * m.hidden * seq
    if checkpointing:
        per += 2 * m.n_params() + 2 * m.layers * m.hidden * seq
    return per * tokens


def model_shape(p: Any, params_file: Path) -> tuple[ModelShape, str]:
    """The base model's shape: a local directory's config.json, a known hub id, or the tiny model of base_model."""
    ref = p.base_model.checkpoint
    if ref is None:
        b = p.base_model
        return ModelShape(b.hidden_size, b.num_layers, b.num_heads, b.num_kv_heads, b.intermediate_size,
                          b.vocab_size, tied=False), "the tiny model of base_model"
    local = Path(ref)
    if not local.is_absolute():
        local = params_file.resolve().parent / ref if not Path(ref).exists() else Path(ref)
    if (local / "config.json").is_file():
        return ModelShape.from_config(json.loads((local / "config.json").read_text())), str(local / "config.json")
    if ref in KNOWN:
        return KNOWN[ref], f"the known architecture of {ref}"
    raise SystemExit(f"plan: base_model.checkpoint {ref!r} is neither a local model directory nor a known hub id "
                     f"({', '.join(KNOWN)}); pass --model-config config.json")


def _count(x: float) -> str:
    """1.23B / 524.3M / 16.0K."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def _world_warning(stage: str, file_world: int, gpus: int, what: str) -> str:
    return (f"{stage}: the params file runs on {file_world} rank(s) (launcher.nproc_per_node x nnodes), not --gpus "
            f"{gpus}: memory is planned per rank for {gpus} rank(s) at the file's micro-batch; the GPU-hours are the "
            f"file's {what}")


def _plan_train(name: str, sec: Any, m: ModelShape, gpus: int, budget: float, device: str) -> StagePlan:
    """pretrain / sft: the shared training loop (stages/train/loop.py) on ``gpus`` ranks."""
    t = sec.train
    world = sec.launcher.world_size
    ds = t.deepspeed.enabled or gpus > 1
    bf16 = t.precision in ("bf16", "auto")
    s = TrainSetup(micro_batch=t.micro_batch_size, seq=t.seq_len, world=gpus, deepspeed=ds,
                   zero=t.deepspeed.zero_stage if ds else 0, offload_optimizer=t.deepspeed.offload_optimizer,
                   bf16=bf16, checkpointing=t.gradient_checkpointing, chunk=t.logprob_chunk_tokens,
                   device=device, masked=True)
    e = train_memory(m, s)
    sequences = t.steps * t.micro_batch_size * t.grad_accum * world
    tokens = sequences * t.seq_len
    work = (f"{_count(tokens)} tokens = {t.steps:,} steps x {t.micro_batch_size} x {t.grad_accum} accumulation x "
            f"{world} rank(s) x {t.seq_len:,}" + (f" ({sequences:,} packed sequences)" if name == "sft" else ""))
    plan = StagePlan(name, e.peak, e.parts, s.micro_batch, largest_micro_batch(m, s, budget),
                     train_flops(m, tokens, t.seq_len, t.gradient_checkpointing),
                     [f"ZeRO-{s.zero}{' + optimizer offload' if s.offload_optimizer and s.zero else ''} on {gpus} "
                      "rank(s)" if ds else "plain PyTorch", "bf16" if bf16 and ds else "fp32 weights",
                      "checkpointing" if s.checkpointing else "no checkpointing"],
                     world=gpus, file_world=world, assumes=f"{_count(tokens)} tokens", work=work)
    if world != gpus:
        per_step = t.micro_batch_size * t.grad_accum * world
        accum = per_step / (t.micro_batch_size * gpus)
        keep = (f"; at {gpus} rank(s) its batch of {per_step:,} sequences per step needs grad_accum "
                f"{accum:g}" if accum == int(accum) else
                f"; its batch of {per_step:,} sequences per step does not divide into {gpus} rank(s) x micro-batch "
                f"{t.micro_batch_size}")
        plan.warnings.append(_world_warning(name, world, gpus, f"{_count(tokens)} tokens") + keep)
    return plan


def _plan_grpo(g: Any, m: ModelShape, gpus: int, budget: float, gpu_mem: float, device: str) -> StagePlan:
    """grpo: rollouts (vLLM or hf), the log-prob passes and the policy update on ``gpus`` ranks."""
    P = m.n_params()
    ds = g.deepspeed.enabled or gpus > 1
    bf16 = ds and g.compute.precision in ("bf16", "auto")
    wb = 2 if bf16 else 4
    seq = 512 + g.rollout.max_new_tokens  # a prompt of up to 512 tokens (GSM8K / MATH CoT prompts are shorter)
    lo = m.lora(g.lora.rank, g.lora.target_modules) if g.lora.enabled else None
    s = TrainSetup(micro_batch=g.optim.micro_batch_size, seq=seq, world=gpus, deepspeed=ds,
                   zero=g.deepspeed.zero_stage if ds else 0, offload_optimizer=g.deepspeed.offload_optimizer,
                   bf16=bf16, checkpointing=g.compute.gradient_checkpointing, chunk=g.compute.logprob_chunk_tokens, device=device,
                   masked=True, entropy=True, lora=lo)
    e = train_memory(m, s)
    parts = dict(e.parts)
    notes = [f"ZeRO-{s.zero} on {gpus} rank(s)" if ds else "plain PyTorch"]
    vllm_on = g.rollout.backend in ("vllm", "auto") and device == "cuda"
    aux = _grpo_auxiliary(g, m, s, e, lo, wb, vllm_on, notes)
    parts["auxiliary_models"] = aux
    # a log-prob pass of an idle model moved in for its pass (policy state stays): the model's weights + working set;
    # LoRA's reference is the policy itself (adapter disabled): the working set only
    ref_weights = 0 if lo is not None else P * wb
    logprob_pass = (e.parts["weights"] + e.parts.get("master_fp32", 0) + e.parts["optimizer_states"]
                    + inference_memory(m, s.micro_batch * seq, wb=wb, chunk=s.chunk) - P * wb + ref_weights) + aux
    vllm = _grpo_vllm(g, m, gpus, gpu_mem, wb, seq, notes) if vllm_on else 0.0
    if vllm_on:
        parts["vllm_engine"] = vllm
    static = e.parts["weights"] + e.parts.get("master_fp32", 0) + e.parts["optimizer_states"]
    generation = static + aux + vllm
    update_extra = 0.0 if g.rollout.vllm.enable_sleep_mode else vllm
    phases = [e.peak + aux + update_extra, logprob_pass, generation]
    if lo is not None and vllm:  # the sync builds the merged adapted maps at once and hands them to the engine
        parts["lora_merged_maps"] = lo.adapted * wb
        phases.append(static + aux + vllm + lo.adapted * wb)
        notes.append(f"LoRA: the weight sync holds the {lo.adapted * wb / GIB:.1f} GiB of merged adapted maps")
    questions, rollout_tokens, flops, work = _grpo_work(g, P, lo is not None)
    world = g.launcher.world_size
    plan = StagePlan("grpo", max(phases), parts, g.optim.micro_batch_size,
                     largest_micro_batch(m, s, budget - aux - update_extra), flops, notes,
                     rollout_flops=rollout_tokens * 2 * P, world=gpus, file_world=world,
                     assumes=f"{questions:,} questions", work=work)
    if world != gpus:
        plan.warnings.append(_world_warning("grpo", world, gpus, f"{questions:,} questions")
                             + (f"; each rank samples {math.ceil(g.questions_per_step / gpus)} question(s) per step "
                                f"at {gpus} rank(s), {math.ceil(g.questions_per_step / world)} at {world}"
                                if gpus <= g.questions_per_step else
                                f"; at {gpus} ranks grpo.questions_per_step ({g.questions_per_step}) is below the "
                                "ranks, which the stage refuses (every rank samples at least one question per step): "
                                f"raise it to {gpus} or more, or use at most {g.questions_per_step} ranks"))
    return plan


def _grpo_auxiliary(g: Any, m: ModelShape, s: TrainSetup, e: Any, lo: Any, wb: int, vllm_on: bool,
                    notes: list[str]) -> float:
    """The bytes of the models resident beside the policy (the reference, the reward model, PPO's value model, a
    LoRA policy's merged hf sampler), each noted in ``notes``."""
    P = m.n_params()
    aux = 0.0
    if lo is not None:
        notes.append(f"LoRA rank {lo.rank} on {lo.maps} maps per layer: {_count(lo.params)} trained parameters "
                     f"({lo.params / P:.2%}); the reference model is the frozen base (no copy)")
    if g.kl.beta > 0 and not g.compute.offload_idle_models and lo is None:
        aux += P * wb
        notes.append("reference model resident")
    needs = run_needs(g)
    if needs.scoring_model and not g.compute.offload_idle_models:  # the reward source scores with the RM
        aux += m.reward_model().n_params() * wb
        notes.append("reward model resident")
    if needs.critic:
        aux += train_memory(m, _with(s, entropy=False)).peak - e.parts["activations"]
        notes.append("PPO value model trained alongside")
    if lo is not None and not vllm_on:  # the hf sampler decodes with a plain copy holding the merged weights
        aux += P * wb
        notes.append("LoRA: the hf sampler's merged copy of the policy resident")
    return aux


def _grpo_vllm(g: Any, m: ModelShape, gpus: int, gpu_mem: float, wb: int, seq: int, notes: list[str]) -> float:
    """The colocated vLLM engine's bytes (its share of the GPU), its KV cache in tokens noted in ``notes``."""
    vllm = g.rollout.vllm.gpu_memory_utilization * gpu_mem
    kv_bytes = vllm - m.n_params() * wb / g.rollout.vllm.tensor_parallel_size
    per_tok = 2 * m.layers * m.kv * wb / g.rollout.vllm.tensor_parallel_size
    need = math.ceil(g.questions_per_step / gpus) * g.rollout.group_size * seq
    cap = max(kv_bytes, 0) / per_tok
    notes.append(f"vLLM KV cache {max(kv_bytes, 0) / GIB:.1f} GiB = {cap:,.0f} tokens; a step's rollouts per rank "
                 f"({need:,} tokens at full length) run in {math.ceil(need / max(cap, 1))} waves")
    return vllm


def _grpo_work(g: Any, P: int, lora: bool) -> tuple[int, int, float, str]:
    """(questions, generated tokens at most, the log-prob passes' and update's FLOPs, the work in words)."""
    iterations = g.iterative.iterations
    questions = g.steps * iterations * g.questions_per_step
    rollout_tokens = questions * g.rollout.group_size * g.rollout.max_new_tokens
    n_passes = 6 + 2 * (g.kl.beta > 0) + 2 * (g.optim.mu > 1) + (2 if g.compute.gradient_checkpointing else 0)
    # the log-prob passes and the update (2 per pass forward, 4 backward); iterative RL's RM updates not counted
    flops = rollout_tokens * n_passes * P
    if lora:  # a frozen base computes no weight gradients: its backward is 2 per parameter, not 4
        flops -= rollout_tokens * 2 * P
    work = (f"{questions:,} questions = {g.steps:,} steps x {g.questions_per_step} x {iterations} iteration(s); "
            f"{questions * g.rollout.group_size:,} outputs (group {g.rollout.group_size}), up to {_count(rollout_tokens)} generated "
            "tokens")
    return questions, rollout_tokens, flops, work


def _plan_reward_model(r: Any, m: ModelShape, gpus: int, gpu_mem: float, device: str) -> StagePlan:
    """reward_model: sampling from the SFT policy, then the RM's training (the backbone with its embedding table
    and a one-output head: :meth:`ModelShape.reward_model`) on ``gpus`` ranks."""
    P = m.n_params()
    rds = r.deepspeed.enabled or gpus > 1
    rs = TrainSetup(micro_batch=max(1, -(-r.batch_size // gpus)), seq=512 + r.max_new_tokens, world=gpus,
                    deepspeed=rds, zero=r.deepspeed.zero_stage if rds else 0,
                    offload_optimizer=r.deepspeed.offload_optimizer, bf16=rds and r.precision in ("bf16", "auto"),
                    checkpointing=r.gradient_checkpointing, chunk=1, device=device, masked=True)
    rm = m.reward_model()
    re = train_memory(rm, rs)
    rparts = dict(re.parts)
    n_samples = r.questions * r.samples_per_question
    rwb = 2 if rs.bf16 else 4
    # sampling: the SFT policy and (on a GPU with vllm) an engine at vLLM's default half of the memory; both are
    # released before the RM trains
    sampling = P * rwb + (0.5 * gpu_mem if r.backend in ("vllm", "auto") and device == "cuda" else
                          hf_generation_memory(m, min(256, n_samples), 512 + r.max_new_tokens, wb=rwb))
    rparts["sampling_phase"] = sampling
    rollouts = n_samples * r.max_new_tokens * (1 + r.rollouts_per_step * (r.labels == "rollouts"))
    work = (f"{r.questions:,} questions x {r.samples_per_question} samples = {n_samples:,} outputs"
            + (f", + {r.rollouts_per_step} Math-Shepherd rollouts per solution" if r.labels == "rollouts" else "")
            + f"; {r.epochs} epoch(s)")
    return StagePlan("reward_model", max(re.peak, sampling), rparts, rs.micro_batch, None,
                     train_flops(rm, n_samples * r.epochs * rs.seq, rs.seq, rs.checkpointing),
                     ["sampling: samples x (1 + rollouts_per_step) full-length outputs (Math-Shepherd rollouts "
                      "counted for one step prefix per solution); then the RM (the backbone, its embedding table "
                      "trained too, and a one-output head) trains",
                      "the reward_model section has no launcher: one process (python -m flows.reward_model)" if gpus == 1
                      else f"the reward_model section has no launcher: its {gpus} ranks are started by hand "
                      f"(deepspeed --num_gpus {gpus} --module stages.reward_model; docs/real-mode.md)"],
                     rollout_flops=rollouts * 2 * P, world=gpus, file_world=None,
                     assumes=f"{n_samples:,} samples", work=work)


def _replace(obj: Any, dotted: str, value: Any) -> Any:
    """A copy of the params section ``obj`` with ``dotted`` (``train.deepspeed.zero_stage``) set to ``value``."""
    head, _, rest = dotted.partition(".")
    if rest:
        value = _replace(getattr(obj, head), rest, value)
    return obj.model_copy(update={head: value})


# (stage, what a user changes) -> (the params paths it sets, the value)
_TRAIN_PREFIX = {"pretrain": "train.", "sft": "train.", "grpo": "", "reward_model": ""}
_CHECKPOINTING = {"pretrain": "train.", "sft": "train.", "grpo": "compute.", "reward_model": ""}
"""Where each stage's gradient_checkpointing switch sits in its section."""


def plan_one(name: str, sec: Any, m: ModelShape, gpus: int, gpu_mem: float, reserve: float,
             device: str = "cuda") -> StagePlan:
    """One stage's plan from its params section (``gpu_mem`` / ``reserve`` in bytes)."""
    budget = gpu_mem - reserve
    if name in ("pretrain", "sft"):
        return _plan_train(name, sec, m, gpus, budget, device)
    if name == "grpo":
        return _plan_grpo(sec, m, gpus, budget, gpu_mem, device)
    return _plan_reward_model(sec, m, gpus, gpu_mem, device)


def fixes(name: str, sec: Any, m: ModelShape, gpus: int, gpu_mem: float, reserve: float, device: str = "cuda",
          max_gpus: int = 4096) -> list[str]:
    """What would make a stage that does not fit fit: each change alone (checkpointing, ZeRO-3, optimizer
    offload, a smaller micro-batch, fewer vLLM memory, idle models offloaded, LoRA for grpo), then more GPUs, then
    all of the switches together; for pretrain / sft, what LoRA would need (they have none: they train every
    weight)."""
    budget = gpu_mem - reserve
    pre, ck = _TRAIN_PREFIX[name], _CHECKPOINTING[name]
    t = getattr(sec, "train", sec)
    ds = t.deepspeed
    changes: list[tuple[str, dict[str, Any]]] = []
    if not (getattr(sec, ck.rstrip("."), sec) if ck else sec).gradient_checkpointing:
        changes.append((f"runtime.{name}.{ck}gradient_checkpointing: true", {f"{ck}gradient_checkpointing": True}))
    if name in ("pretrain", "sft") and ds.zero_stage < 3:
        changes.append((f"{name}.{pre}deepspeed.zero_stage: 3", {f"{pre}deepspeed.zero_stage": 3,
                                                               f"{pre}deepspeed.enabled": True}))
    if not ds.offload_optimizer:
        z = max(ds.zero_stage, 1)
        changes.append((f"{name}.{pre}deepspeed.offload_optimizer: true" + (f" (with zero_stage {z})" if z !=
                                                                              ds.zero_stage else ""),
                        {f"{pre}deepspeed.offload_optimizer": True, f"{pre}deepspeed.zero_stage": z,
                         f"{pre}deepspeed.enabled": True}))
    if name == "grpo":
        changes += _grpo_changes(sec, device)

    def peak(s: Any, n: int) -> float:
        return plan_one(name, s, m, n, gpu_mem, reserve, device).peak

    def apply(s: Any, upd: dict[str, Any]) -> Any:
        for k, v in upd.items():
            s = _replace(s, k, v)
        return s

    out = []
    for what, upd in changes:
        p = peak(apply(sec, upd), gpus)
        if p <= budget:
            out.append(f"{what}: {p / GIB:.1f} GiB")
    base = plan_one(name, sec, m, gpus, gpu_mem, reserve, device)
    if base.max_micro_batch and base.max_micro_batch < base.micro_batch:
        out.append(f"micro_batch_size {base.max_micro_batch} (raise grad_accum to keep the batch)")
    n = gpus * 2
    while n <= max_gpus and peak(sec, n) > budget:
        n *= 2
    if n <= max_gpus:
        out.append(f"{n} GPUs (--gpus {n}; ZeRO partitions the states over more ranks): {peak(sec, n) / GIB:.1f} GiB")
    if len(changes) > 1 and not out:  # no single switch is enough: all of them
        allp = peak(apply(sec, {k: v for _, u in changes for k, v in u.items()}), gpus)
        if allp <= budget:
            out.append(f"all of {', '.join(w.split(':')[0] for w, _ in changes)} together: {allp / GIB:.1f} GiB")
    if name != "grpo":
        e = base.parts
        lora = e["weights"] + e.get("activations", 0) + e.get("logits_forward", 0) + e.get("logits_backward", 0)
        out.append(f"LoRA would hold about {lora / GIB:.1f} GiB (the frozen weights and the activations), but the "
                   f"{name} stage trains every weight: it has no LoRA (the grpo stage has: grpo.lora)")
    return out or ["nothing planned here fits: a GPU with more memory"]


def _grpo_changes(g: Any, device: str) -> list[tuple[str, dict[str, Any]]]:
    """The grpo section's own memory switches (:func:`fixes`): idle models offloaded, a smaller vLLM share, vLLM's
    sleep mode, LoRA (not with a value model: PPO trains it in full)."""
    changes: list[tuple[str, dict[str, Any]]] = []
    needs = run_needs(g)
    if not g.compute.offload_idle_models and (needs.reference or needs.reward_model):
        changes.append(("runtime.grpo.compute.offload_idle_models: true", {"compute.offload_idle_models": True}))
    vllm = g.rollout.vllm
    if g.rollout.backend in ("vllm", "auto") and device == "cuda" and vllm.gpu_memory_utilization > 0.1:
        changes.append(("grpo.rollout.vllm.gpu_memory_utilization: 0.1 (a smaller KV cache: more waves)",
                        {"rollout.vllm.gpu_memory_utilization": 0.1}))
    if not vllm.enable_sleep_mode and device == "cuda":
        changes.append(("runtime.grpo.rollout.vllm.enable_sleep_mode: true", {"rollout.vllm.enable_sleep_mode": True}))
    if not g.lora.enabled and not needs.critic:
        lo = g.lora
        changes.append((f"grpo.lora.enabled: true (rank {lo.rank} on {', '.join(lo.target_modules)}; the "
                        "adapter trains, the frozen base is the reference model)", {"lora.enabled": True}))
    return changes


STAGES = ("pretrain", "sft", "reward_model", "grpo")
"""The stages that hold a model on the GPU, in dvc.yaml order."""


def stage_world(p: Any, name: str) -> int:
    """The ranks a stage runs on per its params: ``launcher.nproc_per_node x nnodes``; the reward_model section has
    no launcher (its ranks are started by hand, as docs/real-mode.md does beside grpo's): grpo's."""
    launcher = getattr(getattr(p, name), "launcher", None)
    return launcher.world_size if launcher is not None else p.grpo.launcher.world_size


def plan_stages(p: Any, m: ModelShape, gpus: int | None, gpu_mem: float, reserve: float, device: str = "cuda"
                ) -> tuple[list[StagePlan], list[str]]:
    """The plan of every enabled stage that holds a model on the GPU (bytes per GPU) on ``gpus`` ranks (None: each
    on its params' world size, :func:`stage_world`), with fixes for those that do not fit; and the stages left out
    (disabled in the params)."""
    out: list[StagePlan] = []
    skipped: list[str] = []
    for name in STAGES:
        sec = getattr(p, name)
        if not getattr(sec, "enabled", True):
            skipped.append(f"{name}: {name}.enabled is false (the stage passes its input through)")
            continue
        n = stage_world(p, name) if gpus is None else gpus
        sp = plan_one(name, sec, m, n, gpu_mem, reserve, device)
        if sp.peak > gpu_mem - reserve:
            sp.fixes = fixes(name, sec, m, n, gpu_mem, reserve, device)
        out.append(sp)
    return out, skipped


def _model_sections(params_file: Path) -> Any:
    """The params file's sections that hold models, validated (the evaluate section names data files that may be
    elsewhere)."""
    from types import SimpleNamespace

    from stages.schema.base import read_params_file, validate_section
    from stages.schema.base_model import BaseModelParams
    from stages.schema.grpo import GrpoParams
    from stages.schema.pretrain import PretrainParams
    from stages.schema.reward_model import RewardModelParams
    from stages.schema.sft import SftParams

    raw = read_params_file(params_file)
    return SimpleNamespace(**{c.SECTION: validate_section(c, raw, str(params_file))
                              for c in (BaseModelParams, PretrainParams, SftParams, GrpoParams, RewardModelParams)})


def _print_details(sp: StagePlan, gpu_mem_gib: float) -> None:
    """A stage's work, memory parts, notes, warnings and (when it does not fit) fixes."""
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in sp.parts.items() if v >= 0.05 * GIB)
    print(f"\n{sp.stage}: {sp.work}\n  parts (GiB): {parts}")
    for n in sp.notes:
        print(f"  {n}")
    for w in sp.warnings:
        print(f"  warning: {w}")
    if sp.fixes:
        print(f"  does not fit in {gpu_mem_gib:g} GiB; what would fit (each alone):")
        for f in sp.fixes:
            print(f"    - {f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs (ranks) to plan for (default: the params file's launcher world size of each stage)")
    ap.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU")
    ap.add_argument("--reserve", type=float, default=2.0, help="GiB per GPU kept for the CUDA context and slack")
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilisation of training and log-prob passes")
    ap.add_argument("--rollout-mfu", type=float, default=0.05,
                    help="model FLOP utilisation of sampling (decoding is memory-bound)")
    ap.add_argument("--gpu-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100 SXM: 989)")
    ap.add_argument("--model-config", default=None, help="a config.json to plan for instead of base_model's")
    ap.add_argument("--json", default=None, help="also write the plan to this file")
    args = ap.parse_args(argv)
    params_file = Path(args.params)
    p = _model_sections(params_file)
    if args.model_config:
        m, src = ModelShape.from_config(json.loads(Path(args.model_config).read_text())), args.model_config
    else:
        m, src = model_shape(p, params_file)
    budget = (args.gpu_mem - args.reserve) * GIB
    plans, skipped = plan_stages(p, m, args.gpus, args.gpu_mem * GIB, args.reserve * GIB)
    gpus_text = "each stage on its params' world size" if args.gpus is None else f"{args.gpus} GPU(s)"
    print(f"model: {_count(m.n_params())} parameters ({src}); {gpus_text} of {args.gpu_mem:g} GiB "
          f"({args.reserve:g} GiB reserved); GPU-hours at {args.mfu:.0%} MFU (sampling {args.rollout_mfu:.0%}) of "
          f"{args.gpu_tflops:g} TFLOP/s")
    print(f"{'stage':<13}{'GPUs':>5}{'peak GiB':>9} {'fits':>5} {'micro-batch':>12} {'largest':>8} {'GPU-h':>9} "
          f"{'wall h':>7}  assumes")
    rows = []
    for sp in plans:
        fits = sp.peak <= budget
        hours = sp.gpu_hours(args.mfu, args.gpu_tflops, args.rollout_mfu)
        print(f"{sp.stage:<13}{sp.world:>5}{sp.peak / GIB:>9.1f} {'yes' if fits else 'NO':>5} {sp.micro_batch:>12} "
              f"{'-' if sp.max_micro_batch is None else sp.max_micro_batch:>8} {hours:>9.1f} {hours / sp.world:>7.1f}  "
              f"{sp.assumes}")
        rows.append({"stage": sp.stage, "gpus": sp.world, "params_world_size": sp.file_world,
                     "peak_gib": round(sp.peak / GIB, 2), "fits": fits, "micro_batch": sp.micro_batch,
                     "largest_micro_batch": sp.max_micro_batch, "gpu_hours": round(hours, 2),
                     "wall_hours": round(hours / sp.world, 2), "assumes": sp.assumes, "work": sp.work,
                     "parts_gib": {k: round(v / GIB, 3) for k, v in sp.parts.items()}, "notes": sp.notes,
                     "warnings": sp.warnings, "fixes": sp.fixes})
    for sp in plans:
        _print_details(sp, args.gpu_mem)
    for s in skipped:
        print(f"\nskipped {s}")
    if args.json:
        Path(args.json).write_text(json.dumps({"n_params": m.n_params(), "gpus": args.gpus, "gpu_mem_gib": args.gpu_mem,
                                               "stages": rows, "skipped": skipped}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

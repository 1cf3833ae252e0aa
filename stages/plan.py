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
(benchmarks/memory.py); docs/real-mode.md has the 7B plan.

Model shapes: a local model directory's config.json, the architecture of a known hub id (:data:`KNOWN`), or the tiny
model built from the base_model section.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
        """Parameters: embedding, head (unless tied), layers, final norm."""
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def largest_tensor(self) -> int:
        return max(self.vocab * self.hidden, self.hidden * self.intermediate)

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        return cls(hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), heads=heads,
                   kv_heads=int(cfg.get("num_key_value_heads") or heads), intermediate=int(cfg["intermediate_size"]),
                   vocab=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)),
                   qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)))


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


def head_bytes(m: ModelShape, tokens: int, chunk: int, wb: int, *, entropy: bool) -> tuple[float, float]:
    """(forward, backward) working set of the log-probs over the vocabulary (stages/core/logprobs.py); chunk 0
    materialises the logits (the logits, their float32 copy / temperature and the log-softmax)."""
    V, h = m.vocab, m.hidden
    if chunk == 0:
        full = tokens * V
        return full * (wb + 4 + 4 + (8 if entropy else 0)), full * (4 + 4 + 4 + wb) + 4 * V * h
    c = min(chunk, tokens) * V * 4
    fwd = (3 if entropy else 2) * c
    bwd = 2 * c + (wb * min(chunk, tokens) * V if wb != 4 else 0) + 4 * V * h + (V * h * wb if wb != 4 else 0)
    return fwd, bwd


def train_memory(m: ModelShape, s: TrainSetup) -> Estimate:
    """Peak bytes per rank of training ``m`` with ``s``: steady-state phases (AdamW's moments allocated)."""
    P = m.n_params()
    N = s.world if s.deepspeed else 1
    wb = 2 if (s.deepspeed and s.bf16) else 4
    gpu = s.device == "cuda"
    parts: dict[str, float] = {}
    parts["weights"] = P * wb / (N if s.zero == 3 else 1)
    if not s.deepspeed or s.zero == 0:
        if s.deepspeed and s.bf16:  # BF16_Optimizer: fp32 master weights and fp32 gradient accumulators
            parts["master_fp32"] = 4 * P
            grads = 4 * P + wb * P
        else:
            grads = 4 * P
        parts["optimizer_states"] = 8 * P
        opt_tmp = 4 * P if gpu else 2 * 4 * m.largest_tensor()
        bucket = min(P, DS_BUCKET) * wb if s.deepspeed and N > 1 else 0  # the flattened all-reduce copy
    else:
        part = P / N
        on_gpu_states = 0 if s.offload_optimizer else 1
        parts["master_fp32"] = 4 * part * on_gpu_states
        parts["optimizer_states"] = 8 * part * on_gpu_states
        grads = (P * wb if s.zero == 1 else 0) + 4 * part + (wb * part if wb != 4 else 0)
        opt_tmp = (1 if gpu else 2) * 4 * part * on_gpu_states
        bucket = (DS_BUCKET if gpu else min(P, DS_BUCKET)) * wb
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
    parts["activations"] = A
    f_head, b_head = head_bytes(m, T, s.chunk, wb, entropy=s.entropy)
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
        phases["initialisation"] = 2 * parts["weights"]  # flattening the weights into one buffer
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
    return TrainSetup(**{**asdict(s), **kw})


# ---------------------------------------------------------------------------------------------
# the pipeline's stages


@dataclass
class StagePlan:
    """One stage's plan."""

    stage: str
    peak: float
    parts: dict[str, float]
    micro_batch: int
    max_micro_batch: int | None
    flops: float
    notes: list[str] = field(default_factory=list)
    rollout_flops: float = 0.0
    """Model FLOPs of sampling (autoregressive decoding, far from a GPU's peak: its own MFU)."""

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


def plan_stages(p: Any, m: ModelShape, gpus: int, gpu_mem: float, reserve: float, device: str = "cuda"
                ) -> list[StagePlan]:
    """The plan of every stage that holds a model on the GPU (bytes per GPU)."""
    budget = gpu_mem - reserve
    out: list[StagePlan] = []
    P = m.n_params()

    def loop_stage(name: str, t: Any, tokens_total: float) -> None:
        ds = t.deepspeed.enabled or gpus > 1
        bf16 = t.precision in ("bf16", "auto")
        s = TrainSetup(micro_batch=t.micro_batch_size, seq=t.seq_len, world=gpus, deepspeed=ds,
                       zero=t.deepspeed.zero_stage if ds else 0, offload_optimizer=t.deepspeed.offload_optimizer,
                       bf16=bf16, checkpointing=t.gradient_checkpointing, chunk=t.logprob_chunk_tokens,
                       device=device, masked=True)
        e = train_memory(m, s)
        out.append(StagePlan(name, e.peak, e.parts, s.micro_batch, largest_micro_batch(m, s, budget),
                             train_flops(m, tokens_total, t.seq_len, t.gradient_checkpointing),
                             [f"ZeRO-{s.zero} on {gpus} ranks" if ds else "plain PyTorch",
                              "bf16" if bf16 and ds else "fp32 weights",
                              "checkpointing" if s.checkpointing else "no checkpointing"]))

    for name in ("pretrain", "sft"):
        t = getattr(p, name).train
        loop_stage(name, t, t.steps * t.micro_batch_size * t.grad_accum * gpus * t.seq_len)

    g = p.grpo
    ds = g.deepspeed.enabled or gpus > 1
    bf16 = ds and g.precision in ("bf16", "auto")
    wb = 2 if bf16 else 4
    seq = 512 + g.max_new_tokens  # a prompt of up to 512 tokens (GSM8K / MATH CoT prompts are shorter)
    s = TrainSetup(micro_batch=g.micro_batch_size, seq=seq, world=gpus, deepspeed=ds,
                   zero=g.deepspeed.zero_stage if ds else 0, offload_optimizer=g.deepspeed.offload_optimizer,
                   bf16=bf16, checkpointing=g.gradient_checkpointing, chunk=g.logprob_chunk_tokens, device=device,
                   masked=True, entropy=True)
    e = train_memory(m, s)
    parts = dict(e.parts)
    aux = 0.0
    notes = [f"ZeRO-{s.zero} on {gpus} ranks" if ds else "plain PyTorch"]
    if g.beta > 0 and not g.offload_idle_models:
        aux += P * wb
        notes.append("reference model resident")
    model_reward = g.reward_source in ("outcome_rm", "process_rm")
    if model_reward and not g.offload_idle_models:
        aux += P * wb
        notes.append("reward model resident")
    if g.algorithm == "ppo":
        aux += train_memory(m, _with(s, entropy=False)).peak - e.parts["activations"]
        notes.append("PPO value model trained alongside")
    parts["auxiliary_models"] = aux
    # a log-prob pass of an idle model moved in for its pass (policy state stays): the model's weights + working set
    logprob_pass = (e.parts["weights"] + e.parts.get("master_fp32", 0) + e.parts["optimizer_states"]
                    + inference_memory(m, s.micro_batch * seq, wb=wb, chunk=s.chunk)) + aux
    vllm = 0.0
    if g.backend in ("vllm", "auto") and device == "cuda":
        vllm = g.vllm_gpu_memory_utilization * gpu_mem
        kv_bytes = vllm - P * wb / g.vllm_tensor_parallel_size
        per_tok = 2 * m.layers * m.kv * wb / g.vllm_tensor_parallel_size
        need = math.ceil(g.questions_per_step / gpus) * g.group_size * seq
        cap = max(kv_bytes, 0) / per_tok
        notes.append(f"vLLM KV cache {max(kv_bytes, 0) / GIB:.1f} GiB = {cap:,.0f} tokens; a step's rollouts per rank "
                     f"({need:,} tokens at full length) run in {math.ceil(need / max(cap, 1))} waves")
        parts["vllm_engine"] = vllm
    generation = e.parts["weights"] + e.parts.get("master_fp32", 0) + e.parts["optimizer_states"] + aux + vllm
    update_extra = 0.0 if g.vllm_enable_sleep_mode else vllm
    peak = max(e.peak + aux + update_extra, logprob_pass, generation)
    rollout_tokens = g.steps * g.iterative.iterations * g.questions_per_step * g.group_size * g.max_new_tokens
    n_passes = 6 + 2 * (g.beta > 0) + 2 * (g.mu > 1) + (2 if g.gradient_checkpointing else 0)
    # the log-prob passes and the update (2 per pass forward, 4 backward); iterative RL's RM updates not counted
    flops = rollout_tokens * n_passes * P
    out.append(StagePlan("grpo", peak, parts, g.micro_batch_size, largest_micro_batch(m, s, budget - aux - update_extra),
                         flops, notes, rollout_flops=rollout_tokens * 2 * P))

    r = p.reward_model
    rds = r.deepspeed.enabled or gpus > 1
    rs = TrainSetup(micro_batch=max(1, -(-r.batch_size // gpus)), seq=512 + r.max_new_tokens, world=gpus,
                    deepspeed=rds, zero=r.deepspeed.zero_stage if rds else 0,
                    offload_optimizer=r.deepspeed.offload_optimizer, bf16=rds and r.precision in ("bf16", "auto"),
                    checkpointing=r.gradient_checkpointing, chunk=1, device=device, masked=True)
    rm_shape = ModelShape(m.hidden, m.layers, m.heads, m.kv_heads, m.intermediate, 1, tied=True, qkv_bias=m.qkv_bias)
    re = train_memory(rm_shape, rs)
    rparts = dict(re.parts)
    rparts["weights"] += m.vocab * m.hidden * (2 if rs.bf16 else 4)  # the embedding table stays
    n_samples = r.questions * r.samples_per_question
    rwb = 2 if rs.bf16 else 4
    # sampling: the SFT policy and (on a GPU with vllm) an engine at vLLM's default half of the memory; both are
    # released before the RM trains
    sampling = P * rwb + (0.5 * gpu_mem if r.backend in ("vllm", "auto") and device == "cuda" else
                          hf_generation_memory(m, min(256, n_samples), 512 + r.max_new_tokens, wb=rwb))
    rparts["sampling_phase"] = sampling
    rollouts = n_samples * r.max_new_tokens * (1 + r.rollouts_per_step * (r.labels == "rollouts"))
    out.append(StagePlan("reward_model", max(re.peak + m.vocab * m.hidden * rwb, sampling), rparts, rs.micro_batch,
                         None, train_flops(m, n_samples * r.epochs * rs.seq, rs.seq, rs.checkpointing),
                         ["sampling: samples x (1 + rollouts_per_step) full-length outputs (Math-Shepherd rollouts "
                          "counted for one step prefix per solution); then the RM (a one-output head) trains"], rollout_flops=rollouts * 2 * P))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs (ranks) of the launch")
    ap.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU")
    ap.add_argument("--reserve", type=float, default=2.0, help="GiB per GPU kept for the CUDA context and slack")
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilisation of training and log-prob passes")
    ap.add_argument("--rollout-mfu", type=float, default=0.05,
                    help="model FLOP utilisation of sampling (decoding is memory-bound)")
    ap.add_argument("--gpu-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100 SXM: 989)")
    ap.add_argument("--model-config", default=None, help="a config.json to plan for instead of base_model's")
    ap.add_argument("--json", default=None, help="also write the plan to this file")
    args = ap.parse_args(argv)
    from types import SimpleNamespace

    from stages.schema.base import read_params_file, validate_section
    from stages.schema.base_model import BaseModelParams
    from stages.schema.grpo import GrpoParams
    from stages.schema.pretrain import PretrainParams
    from stages.schema.reward_model import RewardModelParams
    from stages.schema.sft import SftParams

    params_file = Path(args.params)
    raw = read_params_file(params_file)
    # only the sections that hold models (the evaluate section names data files that may be elsewhere)
    p = SimpleNamespace(**{c.SECTION: validate_section(c, raw, str(params_file))
                           for c in (BaseModelParams, PretrainParams, SftParams, GrpoParams, RewardModelParams)})
    if args.model_config:
        m, src = ModelShape.from_config(json.loads(Path(args.model_config).read_text())), args.model_config
    else:
        m, src = model_shape(p, params_file)
    budget = (args.gpu_mem - args.reserve) * GIB
    plans = plan_stages(p, m, args.gpus, args.gpu_mem * GIB, args.reserve * GIB)
    print(f"model: {m.n_params() / 1e9:.2f}B parameters ({src}); {args.gpus} GPU(s) of {args.gpu_mem:g} GiB "
          f"({args.reserve:g} GiB reserved); GPU-hours at {args.mfu:.0%} MFU (sampling {args.rollout_mfu:.0%}) of "
          f"{args.gpu_tflops:g} TFLOP/s")
    print(f"{'stage':<13}{'peak GiB':>9} {'fits':>5} {'micro-batch':>12} {'largest':>8} {'GPU-h':>9}  parts (GiB)")
    rows = []
    for sp in plans:
        fits = sp.peak <= budget
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in sp.parts.items() if v >= 0.05 * GIB)
        print(f"{sp.stage:<13}{sp.peak / GIB:>9.1f} {'yes' if fits else 'NO':>5} {sp.micro_batch:>12} "
              f"{'-' if sp.max_micro_batch is None else sp.max_micro_batch:>8} "
              f"{sp.gpu_hours(args.mfu, args.gpu_tflops, args.rollout_mfu):>9.1f}  {parts}")
        for n in sp.notes:
            print(f"{'':<13}  {n}")
        rows.append({"stage": sp.stage, "peak_gib": round(sp.peak / GIB, 2), "fits": fits,
                     "micro_batch": sp.micro_batch, "largest_micro_batch": sp.max_micro_batch,
                     "gpu_hours": round(sp.gpu_hours(args.mfu, args.gpu_tflops, args.rollout_mfu), 2),
                     "parts_gib": {k: round(v / GIB, 3) for k, v in sp.parts.items()}, "notes": sp.notes})
    if args.json:
        Path(args.json).write_text(json.dumps({"n_params": m.n_params(), "gpus": args.gpus, "gpu_mem_gib": args.gpu_mem,
                                               "stages": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

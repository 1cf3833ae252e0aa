"""Schemas shared by every stage that trains: the training loop (stages/train/loop.py), DeepSpeed and the launcher."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from stages.schema.base import RUNTIME, DelayS, NonNegInt, PosFloat, PosInt, Section

_ENDPOINT = re.compile(r"^[\w.\-\[\]:]+:\d{1,5}$")


class LauncherParams(Section):
    """How the stage's processes start (flows/_launch.py): in the stage's own process, or as ranks under torchrun or
    the deepspeed launcher, started by the stage command itself, so ``dvc repro`` and ``python -m flows.pipeline`` run
    multi-GPU stages and record their outputs. The world size (nproc_per_node x nnodes) changes what is trained
    (every rank draws its own micro-batches), so DVC tracks it; how the ranks are started is a runtime value."""

    nproc_per_node: PosInt = 1
    """Ranks per node (GPUs per node; CPU ranks with gloo on a CPU-only machine); 1 with kind none (the default: one
    local process; a recipe names its cluster, params/deepseekmath-7b.yaml 8 x 8)."""
    nnodes: PosInt = 1
    """Nodes; 1 with kind none. Several nodes: kind deepspeed with a hostfile (it starts the other nodes' ranks over
    ssh / pdsh), or kind torchrun with rdzv_endpoint (the other nodes run the printed torchrun command)."""
    kind: Annotated[Literal["none", "torchrun", "deepspeed"], RUNTIME] = "none"
    """none: the stage runs in the stage command's process; torchrun / deepspeed: that process starts the ranks
    (``torchrun ... -m stages.<stage>`` / ``deepspeed ... --module stages.<stage>``) and waits for them."""
    rdzv_endpoint: Annotated[str | None, RUNTIME] = None
    """host:port of the rendezvous (torchrun, several nodes) or of rank 0 (deepspeed master_addr:master_port);
    null = this machine on a free port."""
    hostfile: Annotated[str | None, RUNTIME] = None
    """deepspeed: a hostfile (``host slots=N`` lines) naming the nodes; null = this machine only."""
    retries: Annotated[NonNegInt, RUNTIME] = 0
    """Prefect retries of the stage's run when it fails other than by bad input (a rank crash, a lost node):
    each retry starts fresh ranks and training resumes from its last checkpoint; 0 = none."""
    retry_delay_s: Annotated[DelayS, RUNTIME] = 10.0
    """Seconds between retries."""

    @property
    def world_size(self) -> int:
        """Ranks in all: nproc_per_node x nnodes."""
        return self.nproc_per_node * self.nnodes

    @model_validator(mode="after")
    def _check(self) -> LauncherParams:
        if self.kind == "none" and self.world_size != 1:
            raise ValueError(f"kind none runs one process, but nproc_per_node x nnodes = {self.world_size}; set "
                             "runtime.<stage>.launcher.kind to torchrun or deepspeed, or both counts to 1")
        if self.kind == "torchrun" and self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("kind torchrun with nnodes > 1 needs rdzv_endpoint (host:port reachable from every node)")
        if self.hostfile is not None and self.kind != "deepspeed":
            raise ValueError("hostfile is read by the deepspeed launcher only; set kind deepspeed or hostfile null")
        if self.rdzv_endpoint is not None and not _ENDPOINT.match(self.rdzv_endpoint):
            raise ValueError(f"rdzv_endpoint must be host:port, got {self.rdzv_endpoint!r}")
        return self
AttnImplementation = Literal["auto", "sdpa", "eager", "flash_attention_2"]
"""transformers' attention kernels: auto = flash_attention_2 on CUDA where the flash-attn package is installed,
else sdpa (stages.core.modeling.resolve_attn_implementation)."""


class DeepSpeedParams(Section):
    """DeepSpeed scale-out of the training loop (used when enabled, or when launched by deepspeed/torchrun)."""

    enabled: bool = True
    """Run the loop through a DeepSpeed engine (config generated from these params); false = plain PyTorch."""
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 2
    """ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + parameters partitioned across ranks."""
    offload_optimizer: bool = False
    """Keep optimizer states in CPU memory (ZeRO-Offload; stages 1-3)."""


class TrainLoopParams(Section):
    """Settings of the shared training loop (stages/train/loop.py) used by pretrain and sft."""

    seed: NonNegInt = 0
    """Seed of every random draw (data order, mixture sampling, dropout): same seed, same run."""
    steps: PosInt
    """Optimizer steps (the run's length; each step sees micro_batch_size * grad_accum sequences per rank)."""
    micro_batch_size: PosInt
    """Sequences per forward/backward pass."""
    grad_accum: PosInt
    """Micro-batches accumulated per optimizer step (losses are token-weighted over all of them)."""
    seq_len: PosInt
    """Tokens per packed sequence; must not exceed the model's max_position_embeddings."""
    lr: PosFloat
    """Peak learning rate (paper: 4.2e-4 for the 7B base, 5e-5 for SFT: pretrain.train, sft.train)."""
    schedule: Literal["multistep", "constant"]
    """multistep: the paper's (2.2.1: linear warm-up, then 31.6% of peak after 80% of steps, 10% after 90%); constant:
    warm-up then flat (the paper's SFT, 3.2)."""
    warmup_steps: NonNegInt
    """Linear warm-up steps from 0 to the peak (paper 2.2.1 pretraining: 2000)."""
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.1
    """AdamW decoupled weight decay (paper 2.2.1: 0.1); not applied to norms and biases."""
    adam_beta1: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    """AdamW beta1 (paper 2.2.1: 0.9)."""
    adam_beta2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.95
    """AdamW beta2 (paper 2.2.1: 0.95)."""
    adam_eps: PosFloat = 1.0e-8
    """AdamW epsilon (not in the paper: 1e-8, PyTorch's)."""
    max_grad_norm: Annotated[float, Field(ge=0.0)] = 1.0
    """Clip the global gradient norm to this value; 0 = no clipping (the norm is logged either way; not in the paper:
    1.0, DeepSeek LLM's)."""
    precision: Literal["auto", "bf16", "fp32"] = "bf16"
    """bf16: bf16 autocast with fp32 weights and optimizer; fp32: plain; auto: bf16 where the hardware has fast bf16 (AMX, CUDA)."""
    num_threads: NonNegInt = 0
    """The most torch CPU threads (0 = every core); fewer while other work competes for the cores where that keeps
    the same bits (stages/core/threads.py TRAINING)."""
    checkpoint_every: Annotated[NonNegInt, RUNTIME] = 50
    """Save a resumable checkpoint (model, optimizer, scheduler, data position, RNG) every N steps; 0 = only at the end."""
    eval_every: NonNegInt
    """Evaluate the held-out loss every N steps (and at the end); 0 = only at the end."""
    log_every: Annotated[PosInt, RUNTIME] = 5
    """Record loss, LR, grad norm and tokens/s every N steps."""
    attn_implementation: AttnImplementation = "auto"
    """Attention kernel (transformers' attn_implementation): sdpa (PyTorch scaled-dot-product attention), eager,
    flash_attention_2 (a CUDA GPU and the flash-attn package), auto = flash_attention_2 where installed, else sdpa."""
    gradient_checkpointing: Annotated[bool, RUNTIME] = False
    """Gradient (activation) checkpointing: each layer's activations are recomputed in the backward pass instead of
    kept (one layer's activation memory instead of all of them, ~1/3 more compute); the same results."""
    logprob_chunk_tokens: Annotated[NonNegInt, RUNTIME] = 256
    """Positions whose log-probs over the vocabulary are computed at a time (stages/core/logprobs.py): the loss
    never holds more than this many (vocabulary,) float32 rows; 0 = the whole (batch, length, vocabulary) logits
    at once (more memory). Another size computes the same maths but may round the head's products differently in
    the last bits (tests/core/test_threads.py runs 256, 1024 and 0), and as a runtime value DVC does not rerun on it."""
    deepspeed: DeepSpeedParams = DeepSpeedParams()
    """DeepSpeed settings (real mode on GPUs)."""

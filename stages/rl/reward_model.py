"""Neural reward models for GRPO (DeepSeekMath paper sections 4.1.3-4.1.4): outcome and process supervision.

Model: the policy architecture with a scalar head per token, ``LlamaForTokenClassification`` with one
label (transformers' ``AutoModelForTokenClassification``), initialised from a pipeline causal LM (its
backbone weights load by name; the head is new). It is saved as an ordinary HF directory
(config.json, model.safetensors, tokenizer) and loaded again with :func:`load_reward_model`. One
per-token score s_t serves both kinds of supervision:

- outcome RM (ORM): the score at the last completion token (EOS when the output ended by itself);
- process RM (PRM): the scores at the step-end tokens, ``index(j)`` of the paper: the tokens whose text
  holds a newline (the generated CoT writes one step per line) plus the last completion token
  (:func:`stages.rl.advantages.step_end_indices`).

A reward is ``sigmoid(s)``, the RM's probability that the answer (ORM) or the step (PRM) is right. The
last step's label is the outcome label, so one model trained on step labels (``train_on: process``) is
also an ORM; ``train_on: outcome`` labels the last token only.

Training data (``collect_examples``) is labelled automatically from samples of a policy on RL
problems. Outcome label: the extracted final answer equals the gold answer. Step labels, two methods:

- ``values``: the generated problems know the running value after every step (``values`` field);
  step k (k-th equation line "... a op b = c.") is right iff every earlier step was right and its result
  c equals ``values[k]``; a line without an equation keeps the state of the steps before it; the last
  step's label is the outcome label. Cheap and exact for the generated problems.
- ``rollouts`` (Math-Shepherd, Wang et al. 2023, the paper's RM data): from the prefix ending at step j
  the policy samples ``rollouts_per_step`` completions; the step is right iff at least one reaches the
  gold answer ("hard estimation"); the last step's label is the outcome label. Works for any problem
  with a gold answer, costs one generation per step.

Example rows (JSON, also the replay history written next to an RM)::

    {"id", "question", "answer", "completion_ids": [int], "step_ends": [int], "step_labels": [0|1],
     "outcome": 0|1, "origin": "sft" | "iter1" | ...}

Continual training with replay (paper 4.1.4, Algorithm 1): :func:`replay_mix` adds a random
``fraction`` of the historical examples (paper: 10%) to the new ones.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from stages.core.dist import all_gather_list, all_reduce, block, rank
from stages.core.errors import PipelineError
from stages.core.io import atomic_path, read_jsonl
from stages.core.modeling import load_model, resolve_model
from stages.core.prompts import prompt_format
from stages.rl.advantages import step_end_indices
from stages.rl.rewards import Rewards, accuracy_reward
from stages.rl.rollout import _cache_kwarg, _checkpointing
from stages.train.update import Updater

LabelMethod = Literal["values", "rollouts"]
TrainOn = Literal["process", "outcome"]
EXAMPLES_FILE = "examples.jsonl"
HELDOUT_FILE = "heldout.jsonl"

_RESULT = re.compile(r"=\s*(-?\d+(?:\.\d+)?)\s*\.?\s*$")


# ---------------------------------------------------------------------------------------------
# model I/O


def init_reward_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: Any = None,
                      attn_implementation: str | None = None, ds_config: dict[str, Any] | None = None) -> Any:
    """A 1-label token-classification model whose backbone is loaded from the causal LM at ``path`` (weights read
    in ``dtype`` onto ``device``; stages.core.modeling.load_model). No dropout on the head: its scores are a
    deterministic function of the weights, and a resumed training repeats the same steps."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    src = resolve_model(path)
    cfg = AutoConfig.from_pretrained(src, num_labels=1)
    cfg.classifier_dropout = 0.0  # set as an attribute: from_pretrained drops keys the config class does not declare
    try:
        return load_model(src, dtype=dtype, device=device, attn_implementation=attn_implementation,
                          ds_config=ds_config, auto_class=AutoModelForTokenClassification, config=cfg)
    except PipelineError as e:
        raise PipelineError(f"{path}: cannot build a reward model from it ({str(e).split('(', 1)[-1]}") from None


def load_reward_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: Any = None,
                      attn_implementation: str | None = None) -> Any:
    """Load a reward model saved by the reward_model stage (or by iterative GRPO), in ``dtype`` onto ``device``; its
    head's dropout is 0."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    src = resolve_model(path)
    try:
        cfg = AutoConfig.from_pretrained(src)
    except (OSError, ValueError) as e:
        raise PipelineError(f"{path}: cannot load the reward model ({str(e).splitlines()[0]})") from None
    if getattr(cfg, "classifier_dropout", None) is None:
        cfg.classifier_dropout = 0.0  # an RM saved before the head's dropout was set explicitly (it trained with 0.1)
    try:
        model = load_model(src, dtype=dtype, device=device, attn_implementation=attn_implementation,
                           auto_class=AutoModelForTokenClassification, config=cfg)
    except PipelineError as e:
        raise PipelineError(f"{path}: cannot load the reward model ({str(e).split('(', 1)[-1]}") from None
    if model.config.num_labels != 1:
        raise PipelineError(f"{path}: not a reward model (num_labels={model.config.num_labels}, expected 1)")
    return model.eval()


def save_reward_model(rm: Any, tokenizer: Any, path: str | os.PathLike[str], examples: Sequence[dict[str, Any]],
                      heldout: Sequence[dict[str, Any]] | None, extra: dict[str, Any]) -> None:
    """Write the RM (HF directory), its training examples (the replay history, ``examples.jsonl``) and the
    held-out examples (``heldout.jsonl``, when given) atomically; ``extra`` goes to pipeline.json."""
    with atomic_path(path) as tmp:
        rm.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "pipeline.json").write_text(json.dumps(extra, indent=2) + "\n")
        for name, rows in ((EXAMPLES_FILE, examples), (HELDOUT_FILE, heldout)):
            if rows is None:
                continue
            with open(tmp / name, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")


def load_examples(rm_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The labelled examples stored next to a reward model (its replay history); [] when none."""
    f = Path(rm_dir) / EXAMPLES_FILE
    return read_jsonl(f) if f.is_file() else []


# ---------------------------------------------------------------------------------------------
# steps and labels


def completion_steps(token_ids: Sequence[int], tokenizer: Any) -> tuple[list[int], list[str]]:
    """(step-end token indices, step texts) of a completion: steps end at newline tokens and at the last token."""
    ids = list(token_ids)
    ends = step_end_indices([tokenizer.decode([t], skip_special_tokens=True) for t in ids])
    texts, start = [], 0
    for e in ends:
        texts.append(tokenizer.decode(ids[start:e + 1], skip_special_tokens=True))
        start = e + 1
    return ends, texts


def value_step_labels(step_texts: Sequence[str], values: Sequence[Any], outcome: int) -> list[int]:
    """Step labels from the problem's known running values (method ``values``; module docstring)."""
    labels: list[int] = []
    ok, k = True, 0
    for j, text in enumerate(step_texts):
        if j == len(step_texts) - 1:
            labels.append(int(outcome))
            break
        m = _RESULT.search(text.strip())
        if m is not None:
            right = k < len(values) and _num_eq(m.group(1), values[k])
            ok = ok and right
            k += 1
        labels.append(int(ok))
    return labels


def _num_eq(a: str, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class SampleConfig:
    """How to sample and label RM training data from a policy."""

    samples_per_question: int
    temperature: float
    max_new_tokens: int
    labels: LabelMethod
    rollouts_per_step: int
    seed: int
    backend: str = "hf"
    generator_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of the generator built for the sampling (vllm: gpu_memory_utilization, tensor_parallel_size, ...)."""


def collect_examples(policy: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], cfg: SampleConfig, *,
                     origin: str, generator: Any = None, stats: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Sample ``cfg.samples_per_question`` outputs per problem from ``policy`` and label them (module docstring).

    Every example also keeps ``pred`` (its extracted final answer, for majority voting) and, when the row has
    ``values``, ``value_labels`` (the exact labels of :func:`value_step_labels`, the reference the step AUC is also
    measured against whatever ``cfg.labels`` is). Sampling is one batched call of the generator; with ``rollouts``
    the completions of all step prefixes are one more batched call, over the distinct prefixes only (the G samples
    of a question often share their first steps), and a correct output's own continuation counts as one completion
    of each of its prefixes, so its steps are right without rollouts (:func:`shepherd_labels`). ``stats``, when
    given, receives the counts: outputs sampled, examples kept and (rollouts) the prefixes and completions.

    Several ranks: each samples and labels its contiguous block of ``rows`` (seeded by the rows' positions in the
    whole list, ``SamplingParams.index_offset``) and every rank returns all the examples, in row order, and the
    counts summed over the ranks: the same examples as one process (but for Math-Shepherd prefixes shared by rows
    of different ranks, which each rank completes on its own)."""
    from stages.core.answers import extract_answer
    from stages.core.generation import SamplingParams, make_generator, resolve_backend

    if cfg.labels == "values" and any("values" not in r for r in rows):
        raise PipelineError("reward labels 'values' need problem rows with a 'values' field; use 'rollouts'")
    start, end = block(len(rows))
    rows = list(rows)[start:end]
    own = generator is None
    if own:
        kw = {"batch_size": min(256, max(1, len(rows) * cfg.samples_per_question))} if resolve_backend(cfg.backend) == "hf" \
            else dict(cfg.generator_kwargs)
        generator = make_generator(cfg.backend, policy, tokenizer, **kw)
    fmt = prompt_format(tokenizer)
    prompts = [fmt.prompt(r["question"], "cot") for r in rows]
    sp = SamplingParams(temperature=cfg.temperature, n=cfg.samples_per_question, max_new_tokens=cfg.max_new_tokens,
                        seed=cfg.seed, index_offset=start)
    outs = generator.generate(prompts, sp)
    examples: list[dict[str, Any]] = []
    for r, group in zip(rows, outs, strict=True):
        for c in group:
            ids = list(c.token_ids)
            if not ids:
                continue
            ends, texts = completion_steps(ids, tokenizer)
            outcome = int(accuracy_reward(completion=c.text, answer=r["answer"]))
            ex = {"id": r.get("id"), "question": r["question"], "answer": r["answer"], "completion_ids": ids,
                  "step_ends": ends, "step_labels": [outcome] * len(ends), "outcome": outcome,
                  "pred": extract_answer(c.text, "math"), "origin": origin}
            if "values" in r:
                ex["value_labels"] = value_step_labels(texts, r["values"], outcome)
            if cfg.labels == "values":
                ex["step_labels"] = list(ex["value_labels"])
            examples.append(ex)
    counts: dict[str, Any] = {"sampled": sum(len(g) for g in outs), "examples": len(examples)}
    if cfg.labels == "rollouts":  # every rank (a collective inside)
        counts.update(shepherd_labels(generator, tokenizer, examples, cfg))
    if own and resolve_backend(cfg.backend) == "vllm":
        generator.close()  # its memory goes back before the RM trains
    if stats is not None:
        parts = all_gather_list([counts])
        stats.update({k: sum(c[k] for c in parts) for k in counts})
    return all_gather_list(examples)


def shepherd_labels(generator: Any, tokenizer: Any, examples: list[dict[str, Any]], cfg: SampleConfig
                    ) -> dict[str, int]:
    """Math-Shepherd step labels (hard estimation) in place: step j of an output is right iff one completion from
    the prefix ending at step j reaches the gold answer; the last step keeps the outcome label.

    Completions come from one batched ``generator.generate`` over the distinct prefix prompts (chat prompt +
    steps 1..j), ``cfg.rollouts_per_step`` each; a correct output is itself a completion of each of its prefixes,
    so its steps are right without rollouts. Returns counts: prefixes needed, distinct ones sampled, completions.

    Several ranks (each with its own ``examples``): every rank calls it; the completions are seeded by the prefixes'
    positions in the ranks' concatenated list (``SamplingParams.index_offset``)."""
    from stages.core.generation import SamplingParams

    fmt = prompt_format(tokenizer)

    need: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (question, prefix text) -> (example, step) using it
    for ei, ex in enumerate(examples):
        ex["step_labels"] = [int(ex["outcome"])] * len(ex["step_ends"])
        if ex["outcome"]:
            continue
        ids = ex["completion_ids"]
        for j, e in enumerate(ex["step_ends"][:-1]):
            need.setdefault((ex["question"], tokenizer.decode(ids[:e + 1], skip_special_tokens=True)), []).append((ei, j))
    keys = list(need)
    offsets = all_gather_list([len(keys)])  # the completions are seeded by their position in the whole list
    if keys:
        sp = SamplingParams(temperature=cfg.temperature, n=cfg.rollouts_per_step, max_new_tokens=cfg.max_new_tokens,
                            seed=cfg.seed + 1, index_offset=sum(offsets[:rank()]))
        outs = generator.generate([fmt.prompt(q, "cot") + prefix for q, prefix in keys], sp)
        for key, group in zip(keys, outs, strict=True):
            prefix = key[1]
            for ei, j in need[key]:
                ex = examples[ei]
                ex["step_labels"][j] = int(any(
                    accuracy_reward(completion=prefix + c.text, answer=ex["answer"]) == 1.0 for c in group))
    n_prefixes = sum(len(v) for v in need.values())
    return {"prefixes": n_prefixes, "distinct_prefixes": len(keys), "completions": len(keys) * cfg.rollouts_per_step}


# ---------------------------------------------------------------------------------------------
# batches, scores, training


def _batch(examples: Sequence[dict[str, Any]], tokenizer: Any, prompt_cache: dict[str, list[int]]
           ) -> tuple[Tensor, Tensor, list[int]]:
    """Right-padded (input_ids, attention_mask) of prompt + completion, and each row's prompt length."""
    seqs, plens = [], []
    for ex in examples:
        q = ex["question"]
        if q not in prompt_cache:
            prompt_cache[q] = tokenizer(prompt_format(tokenizer).prompt(q, "cot"))["input_ids"]
        p = prompt_cache[q]
        seqs.append(p + list(ex["completion_ids"]))
        plens.append(len(p))
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = 1
    return ids, att, plens


def token_scores(rm: Any, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(B, L) scalar score s_t of every position (right-padded inputs), on the inputs' device (the RM may be on a GPU)."""
    prm = next(iter(rm.parameters()), None) if hasattr(rm, "parameters") else None
    dev = prm.device if prm is not None else input_ids.device
    out = rm(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev), use_cache=False).logits[..., 0].float()
    return out.to(input_ids.device)


def _grouped_batch(examples: Sequence[dict[str, Any]], tokenizer: Any, prompt_cache: dict[str, list[int]]
                   ) -> tuple[Tensor, Tensor, int]:
    """(input_ids, attention_mask, P) in the rollout layout (stages.rl.rollout): each prompt left-padded to P, the
    longest prompt of the batch, then the completion, right-padded."""
    prompts, comps = [], []
    for ex in examples:
        q = ex["question"]
        if q not in prompt_cache:
            prompt_cache[q] = tokenizer(prompt_format(tokenizer).prompt(q, "cot"))["input_ids"]
        prompts.append(prompt_cache[q])
        comps.append(list(ex["completion_ids"]))
    P, T = max(len(x) for x in prompts), max(len(x) for x in comps)
    ids = torch.full((len(comps), P + T), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros(len(comps), P + T, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
        ids[i, P - len(p):P] = torch.tensor(p)
        att[i, P - len(p):P] = 1
        ids[i, P:P + len(c)] = torch.tensor(c)
        att[i, P:P + len(c)] = 1
    return ids, att, P


def completion_scores(rm: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, *,
                      share_prompts: bool = True) -> Tensor:
    """(B, T) score s_t of every completion position, from inputs in the rollout layout (prompt left-padded to
    ``prompt_len``, completion right-padded; position ids follow the mask), on the inputs' device.

    ``share_prompts``: rows with the same prompt (the samples of one question) run it through the backbone once; its
    KV cache is copied to every row (differentiably: gradients flow back into the prompt's pass) and the completions
    attend to it, as stages.rl.rollout.token_logprobs does for the policy. The same scores as one full pass per row
    up to float rounding (tested), with the prompt tokens computed once per distinct prompt. A model training with
    gradient checkpointing takes the plain pass (transformers drops the KV cache of checkpointed layers)."""
    prm = next(iter(rm.parameters()), None) if hasattr(rm, "parameters") else None
    dev = prm.device if prm is not None else input_ids.device
    ids, att, P = input_ids.to(dev), attention_mask.to(dev), prompt_len
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    net = getattr(rm, "module", rm)  # a DeepSpeed engine wraps the model
    base = getattr(net, str(getattr(net, "base_model_prefix", "")), None)
    head = getattr(net, "score", None)
    if share_prompts and isinstance(base, torch.nn.Module) and isinstance(head, torch.nn.Module) \
            and ids.shape[1] > P > 0 and not _checkpointing(rm):
        uniq, inverse = torch.unique(torch.cat([ids[:, :P], att[:, :P]], dim=1), dim=0, return_inverse=True)
        if uniq.shape[0] < ids.shape[0]:
            p_att = uniq[:, P:]
            kw = _cache_kwarg(base)
            out = base(input_ids=uniq[:, :P], attention_mask=p_att, position_ids=(p_att.cumsum(-1) - 1).clamp(min=0),
                       use_cache=True)
            cache = out[kw]
            cache.batch_select_indices(inverse)
            h = base(input_ids=ids[:, P:], attention_mask=att, position_ids=pos[:, P:], use_cache=True,
                     **{kw: cache}).last_hidden_state
            drop = getattr(net, "dropout", None)
            h = drop(h) if isinstance(drop, torch.nn.Module) else h
            return head(h)[..., 0].float().to(input_ids.device)
    out = rm(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False).logits[..., 0].float()
    return out[:, P:].to(input_ids.device)


def _targets(examples: Sequence[dict[str, Any]], train_on: TrainOn) -> tuple[list[tuple[int, int]], list[float]]:
    """(row, completion position) of every labelled step end of the batch, and its label."""
    pos, lab = [], []
    for i, ex in enumerate(examples):
        pairs = list(zip(ex["step_ends"], ex["step_labels"], strict=True))
        if train_on == "outcome":
            pairs = [(ex["step_ends"][-1], ex["outcome"])]
        for e, y in pairs:
            pos.append((i, e))
            lab.append(float(y))
    return pos, lab


def _share(n: int, r: int, w: int) -> tuple[int, int]:
    """Rank ``r``'s contiguous share ``[start, end)`` of ``n`` items among ``w`` ranks (the first ``n % w`` take one
    more)."""
    base, extra = divmod(n, w)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def epoch_order(examples: Sequence[dict[str, Any]], seed: int, epoch: int) -> list[int]:
    """The example order of one training epoch: the questions in a permutation seeded by (seed, epoch), each with
    all its samples together (they share the prompt's forward pass, :func:`completion_scores`), so that a resumed
    run rebuilds the batches it had not trained yet."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(ex["question"], []).append(i)
    keys = list(groups)
    random.Random(seed * 1_000_003 + epoch).shuffle(keys)
    return [i for k in keys for i in groups[k]]


def train_reward_model(rm: Any, tokenizer: Any, examples: Sequence[dict[str, Any]], *, epochs: int, lr: float,
                       batch_size: int, seed: int, train_on: TrainOn, max_grad_norm: float = 1.0,
                       weight_decay: float = 0.0, updater: Updater | None = None,
                       resume: dict[str, Any] | None = None,
                       on_step: Callable[[int, Updater, list[list[float]]], None] | None = None,
                       share_prompts: bool = True) -> list[float]:
    """Train ``rm`` in place with binary cross-entropy on the labelled positions; return the mean loss per epoch.

    ``train_on="process"``: every step end with its step label; ``"outcome"``: the last token with the
    outcome label. Mean BCE over the labelled positions of each batch; AdamW, constant ``lr``, through the one update
    path: ``updater`` (e.g. DeepSpeed on the accelerator, stages.rl.update.rl_updater) or a plain
    :class:`stages.train.update.Updater` (clipping, a non-finite batch skipped). Epoch e visits the examples in
    :func:`epoch_order` (seed, e), ``batch_size`` at a time, scored by :func:`completion_scores` (``share_prompts``).

    Resuming: ``resume`` = ``{"step": optimizer steps done, "loss_sums": [[sum, n] per epoch begun]}`` (the model's
    weights, and the updater's optimizer state, already loaded: stages.rl.checkpoint.load_updaters; or the optimizer
    state dict as ``"optimizer"``) continues with the next batch, so an interrupted and resumed run trains on the
    same batches in the same order as an uninterrupted one. ``on_step(step, updater, loss_sums)`` is called after
    every optimizer step, on every rank (the stage checkpoints there).

    Several ranks (a DeepSpeed updater in a multi-rank launch): each rank scores its contiguous share of every batch
    (the samples of a question stay together), normalised by the whole batch's labelled positions, so a step equals
    one process's on the whole batch; a rank without a share runs a zero-gradient pass. The loss sums are summed
    over the ranks every step (every rank holds the same ``loss_sums``).
    """
    if not examples:
        raise PipelineError("reward model: no training examples (every sampled output was empty)")
    upd = updater or Updater(rm, max_grad_norm=max_grad_norm,
                             optimizer=torch.optim.AdamW(rm.parameters(), lr=lr, weight_decay=weight_decay))
    r, w = upd.rank, upd.world
    per_epoch = math.ceil(len(examples) / batch_size)
    step, sums = 0, [[0.0, 0] for _ in range(epochs)]
    if resume is not None:
        step = int(resume["step"])
        for e, v in enumerate(resume.get("loss_sums", [])[:epochs]):
            sums[e] = [float(v[0]), int(v[1])]
        if resume.get("optimizer") is not None:
            upd.optimizer.load_state_dict(resume["optimizer"])
    cache: dict[str, list[int]] = {}
    rm.train()
    for epoch in range(step // per_epoch, epochs):
        order = epoch_order(examples, seed, epoch)
        for b in range(step - epoch * per_epoch, per_epoch):
            batch = [examples[i] for i in order[b * batch_size:(b + 1) * batch_size]]
            n_lab = sum(len(ex["step_ends"]) if train_on == "process" else 1 for ex in batch)
            lo, hi = _share(len(batch), r, w)
            mine = batch[lo:hi]
            upd.zero_grad()
            bad, tot = False, 0.0
            if mine:
                ids, att, P = _grouped_batch(mine, tokenizer, cache)
                pos, lab = _targets(mine, train_on)
                s = completion_scores(upd.forward_model, ids, att, P, share_prompts=share_prompts)
                rows_, cols = zip(*pos, strict=True)
                logit = s[list(rows_), list(cols)]
                loss_sum = torch.nn.functional.binary_cross_entropy_with_logits(logit, torch.tensor(lab),
                                                                                reduction="sum")
                bad = not bool(torch.isfinite(loss_sum))
                if bad and upd.distributed:
                    upd.dummy_backward(last=True)
                elif not bad:
                    upd.backward(loss_sum / n_lab, last=True)
                    tot = float(loss_sum.detach())
            else:
                upd.dummy_backward(last=True)
            upd.step(bad=bad)
            if w > 1:
                tot, n_bad = all_reduce([tot, float(bad)])
                bad = n_bad > 0
            if not bad:
                sums[epoch][0] += tot
                sums[epoch][1] += n_lab
            step += 1
            if on_step is not None:
                on_step(step, upd, sums)
    rm.eval()
    return [tot / max(n, 1) for tot, n in sums]


@torch.no_grad()
def example_scores(rm: Any, tokenizer: Any, examples: Sequence[dict[str, Any]], batch_size: int = 32, *,
                   shard: bool = False, share_prompts: bool = False) -> list[list[float]]:
    """Per example, the RM scores (logits) at its step ends; the last one is the outcome score.

    ``share_prompts``: score consecutive examples of one question with one pass over their prompt
    (:func:`completion_scores`); else each prompt + completion in its own right-padded row (:func:`token_scores`,
    the GRPO reward source's path). ``shard`` (every rank holds the same ``examples``): each rank scores its
    contiguous block and every rank returns all the scores."""
    rm.eval()
    cache: dict[str, list[int]] = {}
    out: list[list[float]] = []
    start, end = block(len(examples)) if shard else (0, len(examples))
    mine = list(examples)[start:end]
    for b in range(0, len(mine), batch_size):
        batch = mine[b:b + batch_size]
        if share_prompts:
            ids, att, P = _grouped_batch(batch, tokenizer, cache)
            s = completion_scores(rm, ids, att, P)
            out.extend([float(s[i, e]) for e in ex["step_ends"]] for i, ex in enumerate(batch))
            continue
        ids, att, plens = _batch(batch, tokenizer, cache)
        s = token_scores(rm, ids, att)
        for i, (ex, P) in enumerate(zip(batch, plens, strict=True)):
            out.append([float(s[i, P + e]) for e in ex["step_ends"]])
    return all_gather_list(out) if shard else out


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """ROC AUC (Mann-Whitney U with average ranks for ties); NaN when only one class is present."""
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    r_pos = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def evaluate_reward_model(rm: Any, tokenizer: Any, examples: Sequence[dict[str, Any]], batch_size: int = 32,
                          best_of: int = 0, share_prompts: bool = True, *, shard: bool = False) -> dict[str, Any]:
    """Outcome AUC (last-token score vs outcome label), ``outcome_auc_within`` (the same over pairs of samples of one
    question only, :func:`within_question_auc`: what GRPO's group-relative advantages see), step AUC (every step end
    vs its label), and, over the examples with exact labels (``value_labels``), ``step_auc_values``: the step AUC
    against those exact labels whatever the RM was trained on. ``best_of`` > 0 adds ``best_of_n``
    (:func:`best_of_n`). ``shard``: the ranks (holding the same ``examples``) score a block each
    (:func:`example_scores`)."""
    if not examples:
        return {"outcome_auc": None, "step_auc": None, "step_auc_values": None, "n_examples": 0, "n_steps": 0}
    sc = example_scores(rm, tokenizer, examples, batch_size, shard=shard, share_prompts=share_prompts)
    o_s = [s[-1] for s in sc]
    o_y = [int(ex["outcome"]) for ex in examples]
    st_s = [v for s in sc for v in s]
    st_y = [int(y) for ex in examples for y in ex["step_labels"]]
    ex_v = [(s, ex["value_labels"]) for s, ex in zip(sc, examples, strict=True) if "value_labels" in ex]
    v_s = [v for s, _ in ex_v for v in s]
    v_y = [int(y) for _, labels in ex_v for y in labels]
    out: dict[str, Any] = {
        "outcome_auc": _r(auc(o_s, o_y)), "outcome_auc_within": _r(within_question_auc(examples, o_s, o_y)),
        "step_auc": _r(auc(st_s, st_y)),
        "step_auc_values": _r(auc(v_s, v_y)) if v_y else None, "n_examples": len(examples), "n_steps": len(st_y),
        "outcome_pos_frac": _r(sum(o_y) / len(o_y)), "step_pos_frac": _r(sum(st_y) / len(st_y))}
    if best_of:
        out["best_of_n"] = best_of_n(examples, sc, best_of)
    return out


def within_question_auc(examples: Sequence[dict[str, Any]], scores: Sequence[float], labels: Sequence[int]) -> float:
    """AUC over the (right, wrong) pairs of samples of the same question only: the share of such pairs in which the
    right sample scores higher (ties count 1/2); NaN without such a pair. Unlike the pooled AUC it cannot be won by
    telling easy questions from hard ones, which GRPO's per-group normalisation removes anyway."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(str(ex.get("id")) + "\0" + ex["question"], []).append(i)
    won, pairs = 0.0, 0
    for idx in groups.values():
        pos = [scores[i] for i in idx if labels[i]]
        neg = [scores[i] for i in idx if not labels[i]]
        for a in pos:
            for b in neg:
                won += 1.0 if a > b else 0.5 if a == b else 0.0
        pairs += len(pos) * len(neg)
    return won / pairs if pairs else math.nan


def best_of_n(examples: Sequence[dict[str, Any]], scores: Sequence[Sequence[float]], n: int) -> dict[str, Any]:
    """Best-of-n reranking of the examples' outputs, per question (the first ``n`` samples of each question with at
    least ``n``), scored by the rule grader (the outcome label: answer correctness):

    - ``random``: the mean accuracy of one sample (a uniformly random pick);
    - ``rm_last``: the accuracy of the sample with the highest last-step (outcome) score (ties: the first);
    - ``rm_min``: the same with the lowest step score of each sample as its score (a PRM's min aggregation,
      Math-Shepherd's);
    - ``majority``: majority vote over the extracted answers (``pred``; ties: the answer seen first);
    - ``oracle``: a correct sample among the n (pass@n);
    - ``gain``: rm_last - random. ``questions``: how many questions were ranked."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(str(ex.get("id")) + "\0" + ex["question"], []).append(i)
    picks = {"random": 0.0, "rm_last": 0.0, "rm_min": 0.0, "majority": 0.0, "oracle": 0.0}
    k = 0
    for idx in groups.values():
        if len(idx) < n:
            continue
        idx = idx[:n]
        k += 1
        ok = [int(examples[i]["outcome"]) for i in idx]
        last = [scores[i][-1] for i in idx]
        low = [min(scores[i]) for i in idx]
        picks["random"] += sum(ok) / n
        picks["rm_last"] += ok[last.index(max(last))]
        picks["rm_min"] += ok[low.index(max(low))]
        picks["oracle"] += float(any(ok))
        votes: dict[str, int] = {}
        for i in idx:
            pred = examples[i].get("pred")
            if pred is not None:
                votes[str(pred)] = votes.get(str(pred), 0) + 1
        if votes:
            top = max(votes.values())
            winner = next(a for a, c in votes.items() if c == top)
            picks["majority"] += float(any(ok[j] for j, i in enumerate(idx) if str(examples[i].get("pred")) == winner))
    if not k:
        return {"n": n, "questions": 0}
    out: dict[str, Any] = {"n": n, "questions": k, **{key: _r(v / k) for key, v in picks.items()}}
    out["gain"] = _r((picks["rm_last"] - picks["random"]) / k)
    return out


def _r(x: float) -> float | None:
    """Rounded for the metrics JSON; None (JSON null) when undefined (e.g. an AUC with one class)."""
    return round(x, 4) if math.isfinite(x) else None


def split_by_question(examples: Sequence[dict[str, Any]], heldout_fraction: float, seed: int
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) with every sample of a question on the same side."""
    qs = sorted({str(ex["id"]) + "\0" + ex["question"] for ex in examples})
    random.Random(seed).shuffle(qs)
    n_held = round(heldout_fraction * len(qs))
    held = set(qs[:n_held])
    tr = [ex for ex in examples if str(ex["id"]) + "\0" + ex["question"] not in held]
    he = [ex for ex in examples if str(ex["id"]) + "\0" + ex["question"] in held]
    return tr, he


def replay_mix(new: Sequence[dict[str, Any]], history: Sequence[dict[str, Any]], fraction: float, seed: int
               ) -> tuple[list[dict[str, Any]], int]:
    """New examples plus round(fraction * len(history)) historical ones drawn without replacement (paper 4.1.4:
    "a replay mechanism that incorporates 10% of historical data"); returns (mixed, number replayed)."""
    k = round(fraction * len(history))
    replay = random.Random(seed).sample(list(history), k) if k else []
    return list(new) + replay, k


# ---------------------------------------------------------------------------------------------
# rewards for GRPO rollouts


def _pad_steps(rewards: Sequence[Sequence[float]], ends: Sequence[Sequence[int]], group_size: int
               ) -> tuple[Tensor, Tensor]:
    """(Q, G, S) step rewards (NaN-padded) and (Q, G, S) step-end indices from per-output lists (N = Q x G)."""
    N = len(rewards)
    S = max([len(x) for x in rewards] + [1])
    r = torch.full((N, S), math.nan, dtype=torch.float64)
    e = torch.zeros((N, S), dtype=torch.long)
    for i, (rw, en) in enumerate(zip(rewards, ends, strict=True)):
        r[i, :len(rw)] = torch.tensor(rw, dtype=torch.float64)
        e[i, :len(en)] = torch.tensor(en, dtype=torch.long)
    return r.view(N // group_size, group_size, S), e.view(N // group_size, group_size, S)


def rollout_completions(ro: Any) -> list[list[int]]:
    """The completion token ids of every output of a rollout (its generated tokens, EOS included)."""
    P = ro.prompt_len
    return [[int(t) for t in ro.input_ids[n, P:P + int(ro.completion_mask[n].sum())]] for n in range(len(ro.texts))]


def step_rewards_as(steps: Tensor, ends: Tensor, kind: Literal["outcome", "process"], **metrics: float) -> Rewards:
    """:class:`Rewards` from (Q, G, S) step rewards: ``process`` keeps the steps (per-output reward: the mean of its
    step rewards); ``outcome`` keeps only the last step's reward of each output (the outcome score)."""
    valid = torch.isfinite(steps).any(-1)
    n_steps = float(torch.isfinite(steps).sum(-1).float().mean())
    if kind == "process":
        return Rewards(torch.nanmean(steps, dim=-1), steps, ends, metrics={"rm_steps_mean": n_steps, **metrics})
    last = torch.isfinite(steps).sum(-1, keepdim=True).clamp(min=1) - 1
    outcome = steps.gather(-1, last).squeeze(-1)
    return Rewards(torch.where(valid, outcome, torch.full_like(outcome, math.nan)),
                   metrics={"rm_steps_mean": n_steps, **metrics})


class RewardModelSource:
    """Rewards from a reward model (``reward_source`` outcome_rm / process_rm; :class:`stages.rl.rewards.RewardSource`).

    The RM scores every step end of every output (:func:`completion_steps`); a step's reward is the sigmoid of its
    score. ``kind="outcome"``: the reward of an output is its last token's (paper 4.1.2); ``"process"``: the rewards of
    all its steps, with their end tokens (paper 4.1.3). An empty output has no reward (NaN)."""

    def __init__(self, rm: Any, tokenizer: Any, kind: Literal["outcome", "process"], *, batch_size: int = 32) -> None:
        self.rm = rm.eval()
        self.tokenizer = tokenizer
        self.kind = kind
        self.batch_size = batch_size

    def step_rewards(self, ro: Any) -> tuple[Tensor, Tensor]:
        """(Q, G, S) sigmoid step rewards (NaN-padded) and (Q, G, S) step-end indices of a rollout."""
        exs = []
        for n, ids in enumerate(rollout_completions(ro)):
            ends, _ = completion_steps(ids, self.tokenizer) if ids else ([], [])
            exs.append({"question": ro.rows[n]["question"], "completion_ids": ids, "step_ends": ends})
        keep = [i for i, ex in enumerate(exs) if ex["completion_ids"]]
        scores = dict(zip(keep, example_scores(self.rm, self.tokenizer, [exs[i] for i in keep], self.batch_size),
                          strict=True))
        rewards = [torch.sigmoid(torch.tensor(scores[i], dtype=torch.float64)).tolist() if i in scores else []
                   for i in range(len(exs))]
        return _pad_steps(rewards, [ex["step_ends"] if i in scores else [] for i, ex in enumerate(exs)],
                          ro.group_size)

    def rewards(self, ro: Any) -> Rewards:
        """The RM's rewards of every output of ``ro`` (class docstring)."""
        return step_rewards_as(*self.step_rewards(ro), self.kind)


class StepLabelSource:
    """Exact step labels as process rewards (``reward_source: process_rule``; a :class:`RewardSource`).

    Each rollout output's steps (:func:`completion_steps`) get the ``values`` labels of :func:`value_step_labels`
    (step k is right iff its result and every earlier one match the problem's running values; the last step's
    label is answer correctness), and the step rewards are those 0/1 labels, consumed like a process RM's (paper
    4.1.3). This is an oracle PRM: the labeller the reward_model stage trains its PRM on, applied directly. Not in
    the paper (its PRM is a trained model); it separates "process vs outcome supervision" from "how good the PRM is"
    on the generated problems, whose rows carry ``values``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def step_rewards(self, ro: Any) -> tuple[Tensor, Tensor]:
        """(Q, G, S) 0/1 step labels (NaN-padded) and (Q, G, S) step-end indices of a rollout."""
        ends_all: list[list[int]] = []
        labels_all: list[list[float]] = []
        for n, (row, ids) in enumerate(zip(ro.rows, rollout_completions(ro), strict=True)):
            if "values" not in row:
                raise PipelineError("grpo.reward.source process_rule needs problem rows with a 'values' field "
                                    "(the generated problems); use process_rm for other data")
            if not ids:
                ends_all.append([])
                labels_all.append([])
                continue
            ends, texts = completion_steps(ids, self.tokenizer)
            outcome = int(accuracy_reward(completion=ro.texts[n], answer=row["answer"]))
            ends_all.append(ends)
            labels_all.append([float(x) for x in value_step_labels(texts, row["values"], outcome)])
        return _pad_steps(labels_all, ends_all, ro.group_size)

    def rewards(self, ro: Any) -> Rewards:
        """The step labels of every output of ``ro`` as process rewards."""
        return step_rewards_as(*self.step_rewards(ro), "process")

"""The checked weight sync: after every sync of the policy's weights into the rollout generator, the sampler and the
trainer must agree on a probe, or the run stops (``grpo.sync``).

Why: a sync that silently fails leaves the sampler on other weights than the trainer's, and training goes on with
off-policy samples it believes on-policy (TRL #5312: vLLM sleep mode reloaded the base weights and the log-prob gap
jumped from 0.015 to 0.201; SkyRL #1680: MoE rollouts corrupted after the first sync).

The probe: the first prompt row's rollout prompt (cot, the run's template) and ``grpo.sync.probe_tokens`` tokens
sampled greedily by the generator from the start policy right after the first sync, fixed for the run. After each
sync (:func:`sync_policy`, called by the loop before the first step of an iteration and after each update) both sides score the probe teacher-forced at temperature 1 over the full vocabulary:

- the sampler with its own weights and kernels: ``generator.score_ids`` (hf: the model it decodes with, by the
  trainer's own function stages.core.logprobs.completion_logprobs; vLLM: a prompt-log-prob pass of the engine);
- the trainer with the policy (under the update's autocast).

``max_t |log pi_sampler(o_t) - log pi_trainer(o_t)|`` must not exceed ``grpo.sync.tolerance.<backend>_<precision>``
(hf in float32: 0, bit for bit; the precision is bf16 when the update trains in bf16, as the sampler then does);
otherwise :class:`WeightSyncError` names the step, the numbers and the key. A generator without ``score_ids`` (a
test's scripted one) is not checked. The step reports ``sync_probe_max_abs`` (the last check's difference).

:func:`planted_skip` is a test hook: the sync before the given step is skipped, so that the check must catch it.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from stages.core.errors import PipelineError
from stages.core.generation import HFGenerator, SamplingParams, tokenize_prompts
from stages.core.logprobs import completion_logprobs
from stages.rl import lora
from stages.rl.rollout import rollout_prompt

log = logging.getLogger(__name__)

_PLANTED: set[int] = set()


class WeightSyncError(PipelineError):
    """The sampler's log-probs on the probe differ from the trainer's by more than the tolerance after a sync."""


@dataclass(frozen=True)
class Probe:
    """The fixed probe of a run: prompt and completion ids, and the accepted difference for its backend / precision."""

    prompt_ids: list[int]
    completion_ids: list[int]
    backend: str
    precision: str
    tolerance: float

    @property
    def key(self) -> str:
        """The params key of the tolerance."""
        return f"grpo.sync.tolerance.{self.backend}_{self.precision}"


@contextlib.contextmanager
def planted_skip(before_step: int) -> Iterator[None]:
    """Test hook: inside, the weight sync before step ``before_step`` does nothing (the generator keeps its weights),
    as a sync that silently failed would; the check after it must stop the run."""
    _PLANTED.add(before_step)
    try:
        yield
    finally:
        _PLANTED.discard(before_step)


def backend_of(generator: Any) -> str:
    """``hf`` or ``vllm``: the backend of a rollout generator (a LoRA policy's, stages.rl.lora.MergedSampler: its
    inner one)."""
    return "hf" if isinstance(getattr(generator, "inner", generator), HFGenerator) else "vllm"


def precision_of(updater: Any) -> str:
    """``bf16`` when the update trains in bf16 (DeepSpeed's bf16 mode or bf16 autocast; the sampler then runs in
    bf16 too, stages.rl.rollout.rollout_generator), else ``fp32``."""
    return "bf16" if getattr(updater, "bf16", False) or getattr(updater, "autocast_bf16", False) else "fp32"


def make_probe(p: Any, rows: list[dict[str, Any]], models: Any) -> Probe | None:
    """The run's probe (module docstring) from the generator as it is now (just synced to the start policy), or None
    when the check is off, the generator cannot score, or the prompt leaves no room for a completion."""
    gen = models.generator
    n = p.sync.probe_tokens
    if not n or not rows or not callable(getattr(gen, "score_ids", None)):
        return None
    prompt = rollout_prompt(rows[0]["question"], "cot", p.template, models.tokenizer)
    prompt_ids = tokenize_prompts(models.tokenizer, [prompt])[0]
    (c,) = gen.generate_ids([prompt_ids], SamplingParams(temperature=0.0, max_new_tokens=n))[0]
    if not c.token_ids:
        return None
    backend, precision = backend_of(gen), precision_of(models.updater)
    tol = float(getattr(p.sync.tolerance, f"{backend}_{precision}"))
    return Probe(list(prompt_ids), list(c.token_ids), backend, precision, tol)


def probe_logprobs(models: Any, probe: Probe) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampler, trainer) float64 log-probs of the probe's completion tokens (module docstring)."""
    sampler = torch.tensor(models.generator.score_ids([probe.prompt_ids], [probe.completion_ids])[0],
                           dtype=torch.float64)
    model = models.policy
    if probe.backend == "hf" and lora.has_lora(model):
        # a LoRA policy's hf sampler decodes with its merged weights (stages/rl/lora.py): the trainer side scores the
        # same merge of the trainer's current adapter, so hf fp32 stays bit for bit when the sync took effect
        model = lora.merged_model(model)
    was_training = model.training
    model.eval()
    ids = torch.tensor([probe.prompt_ids + probe.completion_ids], dtype=torch.long, device=models.device)
    try:
        with torch.inference_mode(), models.updater.autocast():
            trainer, _ = completion_logprobs(model, ids, torch.ones_like(ids), len(probe.prompt_ids), 1.0)
    finally:
        model.train(was_training)
    return sampler, trainer[0].double().cpu()


def check(models: Any, probe: Probe, before_step: int) -> float:
    """The probe's max |sampler - trainer| log-prob difference; :class:`WeightSyncError` above the tolerance."""
    sampler, trainer = probe_logprobs(models, probe)
    diff = (sampler - trainer).abs()
    worst = float(diff.max()) if not torch.isnan(diff).any() else math.nan
    if not worst <= probe.tolerance:  # NaN fails too
        i = int(torch.nan_to_num(diff, nan=math.inf).argmax())
        raise WeightSyncError(
            f"weight sync before step {before_step}: the sampler's ({probe.backend}, {probe.precision}) log-probs on the "
            f"probe differ from the trainer's by up to {worst:.3g} (mean {float(diff.mean()):.3g} over "
            f"{diff.numel()} tokens; token {i}: sampler {float(sampler[i]):.5f}, trainer {float(trainer[i]):.5f}) "
            f"> {probe.key} = {probe.tolerance:g}: the sampler is not on the trainer's weights (a sync that did not "
            "take effect); fix the sync, or raise the tolerance if this gap is the backend's own"
        )
    return worst


def sync_policy(run: Any, models: Any, before_step: int) -> dict[str, float]:
    """Wake the generator, load the policy's weights into it and check the probe (the run's probe is made at the
    first call and kept in ``models.probe``); returns ``{"sync_probe_max_abs": difference}`` (empty without a
    probe). A generator of None (replay) does nothing."""
    gen = models.generator
    if gen is None:
        return {}
    wake = getattr(gen, "wake_up", None)
    if callable(wake):
        wake()
    if before_step in _PLANTED:
        log.warning("test hook: the weight sync before step %d is skipped", before_step)
    else:
        gen.sync_weights(models.policy)
    if models.probe is None:
        models.probe = make_probe(run.p, run.rows, models) or False  # False: made, and there is none
    if not models.probe:
        return {}
    return {"sync_probe_max_abs": check(models, models.probe, before_step)}

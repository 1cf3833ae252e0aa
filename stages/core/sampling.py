"""The sampling interface every generation backend implements (stages/core/generation.py: the hf backend and
the factory; stages/core/vllm_backend.py: vLLM): what to sample, what comes back, and the helpers both backends
share (per-sample seeds, EOS ids, stop strings, prompt tokenisation). Its semantics are stated in
stages/core/generation.py's docstring. A module of its own so that the backends import it and not each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from transformers import PreTrainedTokenizerBase

from stages.core.errors import PipelineError

Backend = Literal["auto", "hf", "vllm"]
FinishReason = Literal["stop", "length"]
LogprobsMode = Literal["full", "processed"]


@dataclass(frozen=True)
class SamplingParams:
    """What to sample. ``temperature == 0`` is greedy decoding (then ``top_p``/``top_k``/``seed`` are unused,
    and the ``n`` completions of a prompt are identical)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k restriction
    n: int = 1
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0
    index_offset: int = 0
    """Prompt i of a call is seeded as prompt ``index_offset + i`` (a rank sampling its block of a longer prompt
    list draws what one process sampling the whole list would)."""
    logprobs_mode: LogprobsMode = "full"
    """What ``Completion.logprobs`` reports: ``full`` = log softmax(logits / T) over the whole vocabulary (top-k /
    top-p only restrict what is sampled); ``processed`` = the log-prob under the distribution the token was drawn
    from: softmax(logits / T) restricted to the top-k / top-p kept tokens (``stages.core.logprobs.truncation_mask``) and renormalised
    over them (vLLM's ``processed_logprobs``; what an importance ratio against the sampler needs). The two are equal
    without top-k / top-p, and when greedy (T = 1, no truncation)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # a lone string is one stop string, not one per character
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not self.temperature >= 0:
            raise PipelineError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PipelineError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise PipelineError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.n < 1:
            raise PipelineError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise PipelineError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise PipelineError(f"SamplingParams.stop must hold non-empty strings, got {self.stop!r}")
        if self.logprobs_mode not in ("full", "processed"):
            raise PipelineError(f"SamplingParams.logprobs_mode must be 'full' or 'processed', got {self.logprobs_mode!r}")

    @property
    def truncates(self) -> bool:
        """True when top-k or top-p restricts the sampled distribution (and sampling is not greedy)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0)."""
        return self.temperature == 0


@dataclass(frozen=True)
class Completion:
    """One generated continuation of a prompt (see the module docstring for the exact semantics)."""

    text: str
    token_ids: list[int] = field(repr=False)
    logprobs: list[float] = field(repr=False)
    finish_reason: FinishReason


@runtime_checkable
class Generator(Protocol):
    """What every backend provides."""

    def generate(self, prompts: Sequence[str], sp: SamplingParams) -> list[list[Completion]]:
        """``n`` completions for each prompt: ``result[prompt_index][sample_index]``."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make later generations use ``model``'s current weights (same architecture)."""
        ...


# ----------------------------------------------------------------------------------------------------------
# helpers shared by the backends


def sample_seed(seed: int, prompt_index: int, sample_index: int = 0) -> int:
    """The RNG seed of one (prompt, sample) pair: a hash of the three numbers (63-bit, non-negative)."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model_config: Any = None,
                  generation_config: Any = None) -> set[int]:
    """Every id that ends a sequence: the tokenizer's EOS and the model's (generation) config EOS ids."""
    ids: set[int] = set()
    for src in (tokenizer, generation_config, model_config):
        val = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(val, int):
            ids.add(val)
        elif isinstance(val, (list, tuple)):
            ids.update(int(v) for v in val)
    if not ids:
        raise PipelineError("generation: the tokenizer has no EOS token; set tokenizer.eos_token")
    return ids


def model_max_length(config: Any) -> int | None:
    """The longest sequence (prompt + completion) the model takes, from its config; None if unknown."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        val = getattr(config, key, None)
        if isinstance(val, int) and val > 0:
            return val
    return None


def cut_at_stop(text: str, stop: Sequence[str]) -> str | None:
    """``text`` cut right after the stop string occurrence that ends first, or None when none occurs."""
    ends = [i + len(s) for s in stop if (i := text.find(s)) >= 0]
    return text[: min(ends)] if ends else None


def finish_text(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], stop: Sequence[str],
                stopped_by_string: bool) -> str:
    """The completion's text: the decoded ids, cut after the stop string when one ended the sequence."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    if stopped_by_string:
        cut = cut_at_stop(text, stop)
        if cut is not None:
            return cut
    return text


def tokenize_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt as the model sees it (the tokenizer's special tokens, e.g. BOS, included)."""
    if isinstance(prompts, str):
        raise PipelineError("generate() takes a list of prompts, got a single string")
    if not prompts:
        return []
    return [list(ids) for ids in tokenizer(list(prompts), add_special_tokens=True)["input_ids"]]

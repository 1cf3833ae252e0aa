"""The ``grpo`` stage: RL from the SFT model (paper section 4), plus a continued-SFT baseline on the same questions for
the same number of steps. The stage only loads, runs, saves: load the start model and the prompts -> run the RL
loop (stages/rl/loop.py: setup, then Algorithm 1 of stages/rl/iterative.py around its ``train`` loop; continued SFT
for ``algorithm: sft``, stages/rl/baseline.py) -> save the policy, its curves and metrics -> train the baseline.

What runs is chosen in the ``grpo`` params (stages/schema/grpo.py) from four registries (stages/rl/registry.py and
stages/rl/sources/): the algorithm (sft, rft, online_rft, grpo, ppo: the paper's unified paradigm, section 5.2.1, and
PPO, 4.1.1), the advantage estimator, the policy loss and the reward source (rule, outcome_rm, process_rm,
process_rule, ...). Real mode: the update under DeepSpeed ZeRO 0-2 (``deepspeed --module stages.grpo`` on several
GPUs), rollouts on a colocated vLLM engine (docs/real-mode.md).

Outputs: data/models/grpo (policy; pipeline.json with the held-out curve and the training signals; samples.jsonl,
sampled completions every ``log_completions_every`` steps), data/ledger/grpo (the rollout ledger: every step's
rollouts, stages/rl/ledger.py; ``python -m stages.rl.replay``), data/models/sft_continued (baseline),
data/models/grpo_iters/ (per-iteration policies and reward models, stages/rl/iterative.py), data/metrics/grpo.json,
data/plots/grpo/<metric>.csv. Resumable from checkpoints/grpo (stages/rl/checkpoint.py; under DeepSpeed the optimizer
state is in the engine's own checkpoint).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from stages.core import hardware, paths, sandbox, threads
from stages.core.dist import is_main_process, train_device
from stages.core.errors import PipelineError
from stages.core.generation import resolve_backend
from stages.core.io import atomic_path, is_timing_key, untimed, write_metrics
from stages.core.modeling import check_compatible, load_tokenizer, peak_memory, release_memory
from stages.core.plots import write_metric_files
from stages.rl import ledger, lora
from stages.rl.algorithms import get_algorithm
from stages.rl.baseline import train_baseline, train_sft
from stages.rl.checkpoint import run_dir
from stages.rl.data import load_prompts
from stages.rl.heldout import HeldoutEval
from stages.rl.iterative import run_iterations
from stages.rl.loop import close, setup
from stages.rl.metrics import PLOT_METRICS, summarize
from stages.rl.needs import run_needs
from stages.rl.registry import ALGORITHMS
from stages.rl.tracking import StepLog
from stages.rl.update import load_policy
from stages.rl.validation import Validation, prepare
from stages.schema.grpo import GrpoParams
from stages.train.update import use_deepspeed

START_MODELS = {"sft": paths.SFT_MODEL, "pretrain": paths.PRETRAIN_MODEL}
"""``grpo.start`` -> the model RL starts from (and the baseline and the reference model)."""

Rows = list[dict[str, Any]]


def rollout_modes(p: GrpoParams) -> set[str]:
    """The modes the policy's samples are written in (none for an algorithm that does not sample)."""
    if not ALGORITHMS.spec(p.algorithm).samples:
        return set()
    return {p.rollout.mode} if p.rollout.mode != "mixture" else \
        {m for m in ("cot", "pot", "tir") if getattr(p.rollout.mixture, m) > 0}


def check_rows(p: GrpoParams, rows: Rows) -> None:
    """Fail before any work: a bad custom reward path, or rows without the 'cot' solutions SFT-like training needs."""
    get_algorithm(p.algorithm).reward_functions(p)
    if p.baseline.enabled and any("cot" not in r for r in rows):
        raise PipelineError("grpo.baseline.enabled: the prompt rows have no 'cot' solutions; set it to false or add them")
    if not get_algorithm(p.algorithm).samples and any("cot" not in r for r in rows):  # continued SFT on them
        raise PipelineError(f"grpo.algorithm {p.algorithm} trains on the prompt rows' 'cot' solutions, and some rows "
                            "have none")


def train_policy(p: GrpoParams, model: Any, tokenizer: Any, rows: Rows, heldout: HeldoutEval | None,
                 ckpt_dir: Path | None, validation: Validation | None = None,
                 tracker: StepLog | None = None) -> tuple[Rows, Rows, dict[str, Any]]:
    """``p.algorithm`` on ``model`` in place; returns (metric rows, completion rows, info)."""
    if not get_algorithm(p.algorithm).samples:
        return train_sft(model, tokenizer, rows, p, heldout=heldout)
    run, models, state = setup(p, model, tokenizer, rows=rows, rm_dir=paths.REWARD_MODEL, heldout=heldout,
                               validation=validation, tracker=tracker,
                               ledger=ledger.run_writer(p, ckpt_dir, START_MODELS[p.start]))  # data/ledger/grpo
    try:
        run_iterations(run, models, state, ckpt_dir=ckpt_dir, out_dir=paths.GRPO_ITERS)
    finally:
        close(run, models, state)
    return state.history, state.samples, state.info


def save_policy(p: GrpoParams, init: Path, model: Any, tokenizer: Any, history: Rows, samples: Rows,
                info: dict[str, Any], heldout: HeldoutEval | None, validation: Validation | None = None) -> None:
    """data/models/grpo with pipeline.json (the held-out curve and the training signals travel with the DVC-cached
    model; no timings or memory peaks: a cached output is the same bytes for the same inputs) and samples.jsonl; the
    curves in data/plots/grpo. The policy saved is the last step's, or with ``validation.select: best`` the best
    validated checkpoint (``info["validation"]`` says which)."""
    step, best = validation.selected(len(history)) if validation else (len(history), None)
    if validation is not None:
        info["validation"] = validation.metrics(step)
    with atomic_path(paths.GRPO_MODEL) as tmp:
        out = lora.exported(model.to("cpu"))
        if best is not None:
            out.load_state_dict(best["weights"])
        if lora.has_lora(model):  # the adapter (peft's format) beside the merged model
            it = p.iterative.iterations if best is None else best["iteration"]
            lora.save_adapter(model, tmp / lora.ADAPTER_DIR, lora.adapter_base(init, it),
                              state=None if best is None else best["adapter"])
        out.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "pipeline.json").write_text(json.dumps({
            "stage": "grpo", "algorithm": p.algorithm, "init": str(init), "params": p.tracked_dump(),
            "hardware": info.get("hardware"), "heldout": heldout.metrics() if heldout else None,
            "run": {"trained_parameters": info.get("trained_parameters"), "lora": info.get("lora")},
            "validation": info.get("validation"),
            "summary": untimed(summarize(history)), "iterations": untimed(info.get("iterations"))}, indent=2) + "\n")
        with open(tmp / "samples.jsonl", "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s, ensure_ascii=False) + "\n")
    names = PLOT_METRICS + ("sft_loss", "nll")  # the per-step timings go to data/timings/grpo (no DVC output)
    write_metric_files(paths.plots_dir("grpo"), history, tuple(n for n in names if not is_timing_key(n)))
    write_metric_files(paths.TIMINGS / "grpo", history, tuple(n for n in names if is_timing_key(n)))
    if heldout is not None:
        write_metric_files(paths.plots_dir("grpo"), heldout.records, ("heldout_accuracy",))


def run(p: GrpoParams) -> dict[str, Any]:
    """Train the policy with ``p.algorithm`` and the continued-SFT baseline; write models, plots and metrics.

    Under a DeepSpeed launch with several ranks every rank trains; rank 0 alone writes outputs, and the other ranks
    return an empty dict."""
    t_start = time.perf_counter()
    tool_modes = sorted(rollout_modes(p) & {"pot", "tir"})
    reduced = sandbox.require_isolation(f"grpo ({'/'.join(tool_modes)} rollouts)") if tool_modes else None
    threads.use(p.compute.num_threads)  # at most num_threads, fewer while other work competes (stages/core/threads.py)
    prompts_path = p.prompts_file or paths.RL_PROMPTS
    rows = load_prompts(prompts_path)
    inputs = [START_MODELS[p.start], prompts_path] + ([paths.REWARD_MODEL] if run_needs(p).reward_model else [])
    ckpt_dir = run_dir(paths.CHECKPOINTS / "grpo", p.tracked_dump(), inputs)
    rows, validation = prepare(p, rows, ckpt_dir)  # grpo.validation: a split of the prompts, never trained on
    check_rows(p, rows)
    init = START_MODELS[p.start]
    tokenizer, model = load_tokenizer(init), load_policy(init, p)
    check_compatible(model, tokenizer, str(init))
    torch.manual_seed(p.seed)
    heldout = HeldoutEval.from_params(p.heldout, p.template)
    main = is_main_process()
    tracker = StepLog(paths.DVCLIVE / "grpo", live=p.tracking.live) if main else None
    history, samples, info = train_policy(p, model, tokenizer, rows, heldout, ckpt_dir, validation, tracker)
    if tracker is not None:
        tracker.close(history)  # every step's results as dvclive's metrics and plots (data/dvclive/grpo)
    info["memory"] = peak_memory()  # of the RL part (before the baseline)
    info["hardware"] = hardware.rl_record(p.compute.precision, use_deepspeed(p.deepspeed.enabled), train_device(),
                                          resolve_backend(p.rollout.backend))
    metrics: dict[str, Any] = {"algorithm": p.algorithm, "grpo": summarize(history),
                               "grpo_wall_s": round(time.perf_counter() - t_start, 2), **info}
    if reduced:
        metrics["sandbox"] = reduced
    if main:
        save_policy(p, init, model, tokenizer, history, samples, info, heldout, validation)
        metrics["validation"] = info.get("validation")
        metrics["ledger"] = ledger.finish(ckpt_dir / "ledger", paths.GRPO_LEDGER, p.ledger.enabled,
                                          p.steps * p.iterative.iterations)
        if heldout is not None:
            metrics["heldout"] = heldout.metrics()
    t0 = time.perf_counter()
    del model
    release_memory()
    metrics["baseline"] = train_baseline(p, init, tokenizer, rows, load_policy(init, p))
    if not main:
        return {}
    metrics["baseline_wall_s"] = round(time.perf_counter() - t0, 2)
    metrics["threads"] = threads.stats()  # steps at each torch thread count (a timing: data/timings)
    metrics["wall_s"] = round(time.perf_counter() - t_start, 2)
    write_metrics("grpo", metrics, ["algorithm", "world_size", "grpo.reward_mean_*", "grpo.accuracy_*", "grpo.kl_last5",
                                     "trained_parameters", "baseline.sft_loss_last", "heldout", "hardware",
                                     "validation", "sandbox"])
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # finished: a later run starts afresh
    return metrics


if __name__ == "__main__":  # the DeepSpeed / torchrun entry (docs/real-mode.md); dvc runs python -m flows.grpo
    from stages.core.cli import cli

    raise SystemExit(cli(GrpoParams, run))

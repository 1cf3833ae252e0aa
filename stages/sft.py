"""The ``sft`` stage: supervised fine-tuning on chain-of-thought, program-of-thought and tool-integrated solutions.

Paper (arXiv 2402.03300 sections 3.1-3.2; docs/training.md): 776K examples in CoT, PoT and
tool-integrated formats, packed to 4K tokens, 500 steps, batch 256, constant LR 5e-5.

Each example is the model's prompt for (question, mode) (stages/core/prompts.py: the DeepSeekMath
``User: {question}\\n{instruction}\\n\\nAssistant:`` or the tokenizer's chat template, with DeepSeekMath's CoT /
TIR instructions and our PoT instruction) followed by its response text for the solution and EOS; prompt and
response are tokenised separately and concatenated, so the prompt's tokens are exactly those the model sees in RL
and at evaluation. The loss covers the response and EOS only.

Problems: a JSONL file or a directory of them (the ingest stage's data/ingest/sft); each row has ``question``,
``answer`` and at least one solution field among ``cot``, ``pot``, ``tir``. Every training problem gets one of the
formats it has, drawn with the ``formats`` shares renormalised over those (a generated problem has all three; a
GSM8K or MATH row only ``cot``; a row whose formats all have share 0 is not trained on, and counted). PoT
programs and TIR code are run in the sandbox and the example is dropped unless execution reproduces the gold
answer (and, for TIR, the ``output`` block written in the solution). The last ``val_problems`` problems are held
out as examples of their first format among cot, pot, tir; their loss picks the best checkpoint, which is the
exported model.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stages.core import hardware, paths, sandbox
from stages.core.answers import extract_answer, is_equivalent
from stages.core.cli import cli
from stages.core.dist import train_device
from stages.core.errors import PipelineError
from stages.core.io import write_json, write_metrics
from stages.core.problems import SOLUTION_FORMATS, load_sft_rows, row_formats
from stages.core.prompts import prompt_format
from stages.schema.sft import SftParams
from stages.train.checkpoint import run_hash
from stages.train.common import (
    export_model,
    is_main_process,
    load_start_model,
    loop_metrics,
    partitioned,
    pass_through,
    write_curves,
)
from stages.train.data import Example, PackedExamples, eval_batches, make_example
from stages.train.loop import eval_loss, gathered_params, train

FORMATS = SOLUTION_FORMATS
_TIR_BLOCK = re.compile(r"```python\n.*?```", re.S)
_TIR_OUT = re.compile(r"```output\n(.*?)```", re.S)


def assign_formats(n: int, shares: dict[str, float], seed: int, available: list[list[str]] | None = None
                   ) -> list[str | None]:
    """One format per problem, drawn independently with the given shares (seeded), among the formats each problem
    has (``available``, default: all three) with the shares renormalised over them; None where every format the
    problem has has share 0. With every format available this is ``rng.choices`` over the shares, draw for draw."""
    rng = random.Random(seed)
    names = [f for f in FORMATS if shares[f] > 0]
    if available is None:
        return rng.choices(names, weights=[shares[f] for f in names], k=n)  # type: ignore[return-value]
    out: list[str | None] = []
    for have in available:
        opts = [f for f in names if f in have]
        out.append(rng.choices(opts, weights=[shares[f] for f in opts])[0] if opts else None)
    return out


def _tir_ok(solution: str, gold: str) -> bool:
    """Replay a TIR solution as the evaluator would: after each ```python block, run the code so far
    (``extract_tir_code`` + ``run_tir_code``, the reference conventions) and compare with the solution's
    ```output block; then the boxed answer and the last output must equal the gold answer."""
    ends = [m.end() for m in _TIR_BLOCK.finditer(solution)]
    outs = _TIR_OUT.findall(solution)
    if not ends or len(outs) != len(ends):
        return False
    for end, written in zip(ends, outs, strict=True):
        if sandbox.run_tir_code(sandbox.extract_tir_code(solution[:end]), **sandbox.cpu_limit(10.0)).strip() != written.strip():
            return False
    return is_equivalent(extract_answer(solution), gold) and is_equivalent(outs[-1].strip(), gold)


def verify_programs(rows: list[dict[str, Any]], modes: list[str], workers: int | None = None) -> list[bool]:
    """Run every PoT program / TIR code block in the sandbox; True where execution reproduces the gold answer
    (TIR: and every ```output block written in the solution). CoT rows are always kept."""
    keep = [True] * len(rows)
    pot = [i for i, m in enumerate(modes) if m == "pot"]
    pot_runs = sandbox.run_many_pot([rows[i]["pot"] for i in pot], workers=workers, **sandbox.cpu_limit(10.0))
    for i, (_, value) in zip(pot, pot_runs, strict=True):
        keep[i] = value is not None and is_equivalent(value, rows[i]["answer"])
    tir = [i for i, m in enumerate(modes) if m == "tir"]
    if tir:
        with ThreadPoolExecutor(max_workers=workers or sandbox.default_workers()) as pool:
            oks = list(pool.map(lambda i: _tir_ok(rows[i]["tir"], rows[i]["answer"]), tir))
        for i, ok in zip(tir, oks, strict=True):
            keep[i] = ok
    return keep


def build_examples(p: SftParams, rows: list[dict[str, Any]], tok: Any, cache: Path | None = None
                   ) -> tuple[list[Example], list[Example], dict[str, Any]]:
    """Training examples (format mix, verified) and CoT validation examples; plus counts for the metrics.
    ``cache``: a JSON file keeping the verification results, so a resumed run does not execute them again."""
    if p.val_problems >= len(rows):
        raise PipelineError(f"sft.val_problems: {p.val_problems} is not below the {len(rows)} problems in {p.problems}; use fewer")
    train_rows, val_rows = rows[: -p.val_problems], rows[-p.val_problems:]
    have = [row_formats(r) for r in train_rows]
    modes = assign_formats(len(train_rows), p.formats.model_dump(), p.train.seed, have)
    unshared = sum(1 for m in modes if m is None)
    t0 = time.perf_counter()
    if not p.verify_programs:
        keep = [True] * len(train_rows)
    elif cache is not None and cache.is_file():
        keep = json.loads(cache.read_text())
    else:
        keep = verify_programs(train_rows, modes)
        if cache is not None:
            write_json(cache, keep)
    verify_s = time.perf_counter() - t0
    drawn, kept, too_long = Counter(modes), Counter(), Counter()
    fmt = prompt_format(tok)
    train_ex: list[Example] = []
    for r, m, k in zip(train_rows, modes, keep, strict=True):
        if not k or m is None:
            continue
        ex = make_example(tok, fmt.prompt(r["question"], m), fmt.response(r[m]))
        if len(ex.input_ids) > p.train.seq_len:
            too_long[m] += 1
            continue
        kept[m] += 1
        train_ex.append(ex)
    val_ex = [make_example(tok, fmt.prompt(r["question"], row_formats(r)[0]), fmt.response(r[row_formats(r)[0]]))
              for r in val_rows]
    val_ex = [e for e in val_ex if len(e.input_ids) <= p.train.seq_len]
    counts = {
        "problems": len(rows), "val_problems": len(val_ex), "prompt_format": fmt.style,
        "rows_with_format": {m: sum(1 for h in have if m in h) for m in FORMATS}, "no_shared_format": unshared,
        "drawn": {m: drawn[m] for m in FORMATS}, "kept": {m: kept[m] for m in FORMATS},
        "dropped_unverified": {m: sum(1 for mm, k in zip(modes, keep, strict=True) if mm == m and not k) for m in FORMATS},
        "dropped_too_long": {m: too_long[m] for m in FORMATS},
        "verify_s": round(verify_s, 2),
        "train_examples": len(train_ex),
        "train_target_tokens": sum(sum(1 for x in e.labels if x != -100) for e in train_ex),
    }
    return train_ex, val_ex, counts


def sft(p: SftParams, *, init_dir: str | Path, out_dir: str | Path, ckpt_root: str | Path, plots_dir: str | Path
        ) -> dict[str, Any]:
    """Fine-tune the model in ``init_dir`` on ``p.problems``; save the best-validation checkpoint to ``out_dir``."""
    t = p.train
    model, tok = load_start_model(init_dir, t, "sft")
    rows = load_sft_rows(p.problems)
    rh = run_hash(p.tracked_dump(), [init_dir, p.problems])
    run_dir = Path(ckpt_root) / rh
    run_dir.mkdir(parents=True, exist_ok=True)
    train_ex, val_ex, counts = build_examples(p, rows, tok, cache=run_dir / "verified.json")
    data = PackedExamples(train_ex, t.seq_len, t.seed, tok.pad_token_id, pack=p.pack)
    val = eval_batches(val_ex, t.seq_len, tok.pad_token_id, t.micro_batch_size)

    def eval_fn(m: Any) -> float:
        return eval_loss(m, val, chunk_tokens=t.logprob_chunk_tokens)

    with gathered_params(model, partitioned(model)):
        before = eval_fn(model)
    res = train(model, data, t, run_dir, eval_fn=eval_fn, keep_best=True, desc="sft")
    rows_per_step = t.micro_batch_size * t.grad_accum * res.world_size
    hw = hardware.record(train_device(), t.precision, res.precision == "bf16")
    metrics: dict[str, Any] = {
        **loop_metrics(res),
        "hardware": hw,
        **counts,
        "rows_per_epoch": data.rows_per_epoch(),
        "examples_per_row": round(len(train_ex) / max(data.rows_per_epoch(), 1), 2),
        "epochs": round(t.steps * rows_per_step / max(data.rows_per_epoch(), 1), 3),
        "val_loss_before": round(before, 4),
        "val_loss_best": round(res.best_eval_loss, 4) if res.best_eval_loss is not None else None,
        "val_loss_last": round(res.evals[-1]["eval_loss"], 4) if res.evals else None,
        "best_step": res.best_step,
    }
    export_model(model, tok, out_dir, res, extra={"stage": "sft", "params": p.tracked_dump(), "run_hash": rh, "hardware": hw,
                                                  "best_step": res.best_step, "init": str(init_dir)})
    if is_main_process():
        metrics["plots"] = write_curves("sft", Path(plots_dir), res, "SFT: loss on responses")
    return metrics


def run(p: SftParams) -> dict[str, Any]:
    """Fine-tune data/models/pretrain into data/models/sft; write data/metrics/sft.json."""
    t0 = time.perf_counter()
    if not p.enabled:
        metrics = pass_through("sft", paths.PRETRAIN_MODEL, paths.SFT_MODEL, paths.plots_dir("sft"))
    else:
        metrics = sft(p, init_dir=paths.PRETRAIN_MODEL, out_dir=paths.SFT_MODEL, ckpt_root=paths.CHECKPOINTS / "sft",
                      plots_dir=paths.plots_dir("sft"))
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    if is_main_process():
        write_metrics("sft", metrics, ["enabled", "steps", "world_size", "train_loss_last", "val_loss_before",
                                        "val_loss_best", "best_step", "train_examples", "hardware"])
    return metrics


if __name__ == "__main__":
    raise SystemExit(cli(SftParams, run))

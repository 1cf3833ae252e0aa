"""The ``sft`` stage: supervised fine-tuning on chain-of-thought, program-of-thought and tool-integrated solutions.

Paper (arXiv 2402.03300 sections 3.1-3.2; docs/training.md): 776K examples in CoT, PoT and
tool-integrated formats, packed to 4K tokens, 500 steps, batch 256, constant LR 5e-5.

Each example is ``chat_prompt(question, mode)`` (``User: {question}\\n{instruction}\\n\\nAssistant:``, with
DeepSeekMath's CoT / TIR instructions and our PoT instruction, stages/core/prompts.py) followed by
``response_text(solution)`` and EOS; prompt and response are tokenised separately and concatenated, so the
prompt's tokens are exactly those the model sees at evaluation. The loss covers the response and EOS only.
Every training problem gets one format, drawn with the ``formats`` shares; PoT programs and TIR code are run
in the sandbox and the example is dropped unless execution reproduces the gold answer (and, for TIR, the
``output`` block written in the solution). The last ``val_problems`` problems are held out as CoT examples;
their loss picks the best checkpoint, which is the exported model.
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

from stages.core import paths, sandbox
from stages.core.answers import extract_answer, is_equivalent
from stages.core.errors import PipelineError
from stages.core.io import read_jsonl, write_json
from stages.core.prompts import chat_prompt, response_text
from stages.schema.sft import SftParams
from stages.train.checkpoint import run_hash
from stages.train.common import (
    cli,
    export_model,
    is_main_process,
    load_start_model,
    loop_metrics,
    partitioned,
    write_curves,
)
from stages.train.data import Example, PackedExamples, eval_batches, make_example
from stages.train.loop import eval_loss, gathered_params, train

FORMATS = ("cot", "pot", "tir")
_REQUIRED = ("question", "answer", "cot", "pot", "tir")
_TIR_BLOCK = re.compile(r"```python\n.*?```", re.S)
_TIR_OUT = re.compile(r"```output\n(.*?)```", re.S)


def load_problems(path: str | Path) -> list[dict[str, Any]]:
    """Read the SFT problems; one-line error when the file is missing, empty, or rows lack a field."""
    rows = read_jsonl(path)
    if not rows:
        raise PipelineError(f"{path}: no SFT problems in the file; run the corpus stage (dvc repro corpus) or fix sft.problems")
    for i, r in enumerate(rows, 1):
        missing = [k for k in _REQUIRED if not isinstance(r.get(k), str)]
        if missing:
            raise PipelineError(f"{path}:{i}: problem row lacks string field(s) {missing}; see the problem schema in stages/data/problems.py")
    return rows


def assign_formats(n: int, shares: dict[str, float], seed: int) -> list[str]:
    """One format per problem, drawn independently with the given shares (seeded)."""
    rng = random.Random(seed)
    names = [f for f in FORMATS if shares[f] > 0]
    return rng.choices(names, weights=[shares[f] for f in names], k=n)


def _tir_ok(solution: str, gold: str) -> bool:
    """Replay a TIR solution as the evaluator would: after each ```python block, run the code so far
    (``extract_tir_code`` + ``run_tir_code``, the reference conventions) and compare with the solution's
    ```output block; then the boxed answer and the last output must equal the gold answer."""
    ends = [m.end() for m in _TIR_BLOCK.finditer(solution)]
    outs = _TIR_OUT.findall(solution)
    if not ends or len(outs) != len(ends):
        return False
    for end, written in zip(ends, outs, strict=True):
        if sandbox.run_tir_code(sandbox.extract_tir_code(solution[:end])).strip() != written.strip():
            return False
    return is_equivalent(extract_answer(solution), gold) and is_equivalent(outs[-1].strip(), gold)


def verify_programs(rows: list[dict[str, Any]], modes: list[str], workers: int | None = None) -> list[bool]:
    """Run every PoT program / TIR code block in the sandbox; True where execution reproduces the gold answer
    (TIR: and every ```output block written in the solution). CoT rows are always kept."""
    keep = [True] * len(rows)
    pot = [i for i, m in enumerate(modes) if m == "pot"]
    for i, (_, value) in zip(pot, sandbox.run_many_pot([rows[i]["pot"] for i in pot], workers=workers), strict=True):
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
    modes = assign_formats(len(train_rows), p.formats.model_dump(), p.train.seed)
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
    train_ex: list[Example] = []
    for r, m, k in zip(train_rows, modes, keep, strict=True):
        if not k:
            continue
        ex = make_example(tok, chat_prompt(r["question"], m), response_text(r[m]))
        if len(ex.input_ids) > p.train.seq_len:
            too_long[m] += 1
            continue
        kept[m] += 1
        train_ex.append(ex)
    val_ex = [make_example(tok, chat_prompt(r["question"], "cot"), response_text(r["cot"])) for r in val_rows]
    val_ex = [e for e in val_ex if len(e.input_ids) <= p.train.seq_len]
    counts = {
        "problems": len(rows), "val_problems": len(val_ex),
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
    rows = load_problems(p.problems)
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
    metrics: dict[str, Any] = {
        **loop_metrics(res),
        **counts,
        "rows_per_epoch": data.rows_per_epoch(),
        "examples_per_row": round(len(train_ex) / max(data.rows_per_epoch(), 1), 2),
        "epochs": round(t.steps * rows_per_step / max(data.rows_per_epoch(), 1), 3),
        "val_loss_before": round(before, 4),
        "val_loss_best": round(res.best_eval_loss, 4) if res.best_eval_loss is not None else None,
        "val_loss_last": round(res.evals[-1]["eval_loss"], 4) if res.evals else None,
        "best_step": res.best_step,
    }
    export_model(model, tok, out_dir, res, extra={"stage": "sft", "params": p.tracked_dump(), "run_hash": rh,
                                                  "best_step": res.best_step, "init": str(init_dir)})
    if is_main_process():
        metrics["plots"] = write_curves("sft", Path(plots_dir), res, "SFT: loss on responses")
    return metrics


def run(p: SftParams) -> dict[str, Any]:
    """Fine-tune data/models/pretrain into data/models/sft; write data/metrics/sft.json."""
    t0 = time.perf_counter()
    metrics = sft(p, init_dir=paths.PRETRAIN_MODEL, out_dir=paths.SFT_MODEL, ckpt_root=paths.CHECKPOINTS / "sft",
                  plots_dir=paths.plots_dir("sft"))
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    if is_main_process():
        write_json(paths.metrics_file("sft"), metrics)
    return metrics


if __name__ == "__main__":
    raise SystemExit(cli(SftParams, run))

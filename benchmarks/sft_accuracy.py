"""Held-out greedy accuracy (CoT) of training-stage models on the generated test problems.

Compares, on the same problems: the pretrained model prompted few-shot (``Q:/A:`` exemplars drawn from the SFT
split, as the evaluate stage does), the SFT model zero-shot (chat prompt), and any other model directories
given (for example SFT started from the untrained base). Greedy decoding with the hf backend
(stages/core/generation.py); answers by stages/core/answers.py.

    python benchmarks/sft_accuracy.py                      # data/models/{pretrain,sft} on data/generated test
    python benchmarks/sft_accuracy.py --model name=DIR:zero_shot --model other=DIR2:few_shot --limit 300
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "sft_accuracy.json"


def evaluate(model_dir: str, prompting: str, problems: list[dict[str, Any]], exemplars: list[tuple[str, str]],
             max_new_tokens: int, batch_size: int) -> dict[str, Any]:
    """Greedy accuracy of one model; also by number of steps."""
    from stages.core.answers import extract_answer, is_equivalent
    from stages.core.generation import SamplingParams, make_generator
    from stages.core.modeling import load_model, load_tokenizer
    from stages.core.prompts import QA_STOP, chat_prompt, qa_fewshot_prompt

    tok = load_tokenizer(model_dir)
    model = load_model(model_dir).eval()
    gen = make_generator("hf", model, tok)
    if prompting == "zero_shot":
        prompts, stop = [chat_prompt(p["question"], "cot") for p in problems], ()
    else:
        prompts, stop = [qa_fewshot_prompt(p["question"], exemplars) for p in problems], (QA_STOP,)
    sp = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=stop)
    t0 = time.perf_counter()
    outs: list[Any] = []
    for i in range(0, len(prompts), batch_size):
        outs += gen.generate(prompts[i:i + batch_size], sp)
    wall = time.perf_counter() - t0
    correct, by_steps = [], {}
    for p, o in zip(problems, outs, strict=True):
        text = o[0].text.removesuffix(QA_STOP)
        ok = is_equivalent(extract_answer(text), p["answer"])
        correct.append(ok)
        by_steps.setdefault(int(p["n_steps"]), []).append(ok)
    return {"model": model_dir, "prompting": prompting, "n": len(problems), "accuracy": sum(correct) / len(correct),
            "by_steps": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_steps.items())},
            "gen_wall_s": round(wall, 1), "sample": outs[0][0].text[:300]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="name=DIR:zero_shot|few_shot (repeatable)")
    ap.add_argument("--test", default=str(ROOT / "data" / "generated" / "problems" / "test.jsonl"))
    ap.add_argument("--sft", default=str(ROOT / "data" / "generated" / "problems" / "sft.jsonl"), help="few-shot exemplar pool")
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--n-shots", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    import torch

    from stages.core.io import read_jsonl
    from stages.evaluate.benchmarks import fewshot_exemplars

    if args.threads:
        torch.set_num_threads(args.threads)
    specs = args.model or [f"pretrain={ROOT / 'data/models/pretrain'}:few_shot", f"sft={ROOT / 'data/models/sft'}:zero_shot"]
    problems = read_jsonl(args.test)[: args.limit]
    exemplars = fewshot_exemplars(args.sft, args.n_shots, "cot", 0)
    rows: dict[str, Any] = {}
    for spec in specs:
        name, rest = spec.split("=", 1)
        path, prompting = rest.rsplit(":", 1)
        rows[name] = evaluate(path, prompting, problems, exemplars, args.max_new_tokens, args.batch_size)
        r = rows[name]
        print(f"{name:16} {prompting:9} acc {r['accuracy']:.3f} (n={r['n']}) by steps {r['by_steps']} gen {r['gen_wall_s']} s", flush=True)
        _save(args, {name: r})  # after each model: a long run keeps what it measured


def _save(args: argparse.Namespace, rows: dict[str, Any]) -> None:
    """Merge ``rows`` into the results JSON."""
    out = {"test": args.test, "limit": args.limit, "n_shots": args.n_shots, "max_new_tokens": args.max_new_tokens,
           "decoding": "greedy", "mode": "cot"}
    prev = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    prev.update(out)
    prev.setdefault("models", {}).update(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(prev, indent=2) + "\n")


if __name__ == "__main__":
    main()

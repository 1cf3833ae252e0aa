"""What the R1-Zero start (RL from the pretrained model, no SFT; docs/rl.md) needs at toy scale (issue 32 item 6).

``--diagnose``: no training. The pretrained model (and the SFT model, for contrast) sampled on RL problems under each
RL template (``grpo.template``), at several generation budgets: how often an output stops by itself, closes
``</think>``, writes a ``\\boxed{}`` answer, is right, earns R1's format reward; and how many of a question's G
outputs differ in reward (a GRPO group with all-equal rewards trains nothing). RL can only reinforce what the policy
samples: these rates say which reward a run from this model can ever see.

``--train``: short GRPO runs from the pretrained model (the stage's loop, stages.rl.loop.fit) under the variants of
``--variants`` (each a set of grpo params changes), held-out greedy accuracy in the run's template before, during and
after; one seed each (the 3-seed comparison is benchmarks/paradigm.py's ``grpo_zero`` methods).

``--build DIR``: a project for the above, built from this checkout's HEAD: a clone in DIR whose params.yaml takes the
``--set`` values, through ``pretrain`` and ``testsets@generated`` (``python -m flows.pipeline``); what an R1-Zero start
needs is found by building base models that differ in one thing (the corpus's R1-format share
``data.crawl.r1_share``, the pretraining budget ``pretrain.train.steps``) and training from each.

    python benchmarks/r1_zero.py --data DIR --diagnose [--problems 64] [--budgets 64 128 256]
    python benchmarks/r1_zero.py --data DIR --train --variants r1 r1_len192 --steps 40
    python benchmarks/r1_zero.py --build /tmp/r1fmt --set data.crawl.r1_share=0.25 --set pretrain.train.steps=1200
    python benchmarks/r1_zero.py --data /tmp/r1fmt/data --label fmt_1200 --train --seed 1 --steps 60

``--data``: a pipeline run's data/ (models/pretrain, models/sft if there, corpus/problems/rl.jsonl,
testsets/generated.jsonl). Writes benchmarks/results/r1_zero.json (``--out``), merging with what is there; with
``--label L`` its keys are ``L/...`` and a training run's ``L/variant/seed``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "r1_zero.json"

VARIANTS: dict[str, dict[str, Any]] = {
    # issue 17's GRPO-Zero: R1's template and format reward at weight 1, the tiny default's 64-token budget
    "r1": {"template": "r1", "reward.format_weight": 1.0},
    "r1_len192": {"template": "r1", "reward.format_weight": 1.0, "rollout.max_new_tokens": 192,
                  "heldout.max_new_tokens": 192},
    "r1_len128": {"template": "r1", "reward.format_weight": 1.0, "rollout.max_new_tokens": 128,
                  "heldout.max_new_tokens": 128},
}
"""``--train`` variants: grpo.template values only (the corpus-format prompts of :data:`PROBE_TEMPLATES` are probes of
``--diagnose``: docs/results/rl.md#what-the-r1-zero-start-needs says why none was trained)."""


PROBE_TEMPLATES = {
    # the pretraining corpus's worked-problem sections (stages/data/crawl.py: "Problem k. q\nSolution.\n" in 60% of
    # them, "Question: q\nAnswer:\n" in 20%), with and without R1's opening <think>
    "qa": "Question: {q}\nAnswer:\n",
    "problem": "Problem 1. {q}\nSolution.\n",
    "r1qa": "Question: {q}\nAnswer: <think>",
}
"""Prompts tried by --diagnose besides the RL templates of stages.core.prompts (``{q}``: the question)."""


def prompt_of(template: str, question: str, tok: Any) -> str:
    from stages.core.prompts import RL_TEMPLATES, rl_prompt

    if template in RL_TEMPLATES:
        return rl_prompt(question, template, tok if template == "deepseekmath" else None)
    return PROBE_TEMPLATES[template].replace("{q}", question.strip())


def load_rows(path: Path, n: int) -> list[dict[str, Any]]:
    from stages.core.problems import load_rows as _load

    return _load(path, "problems")[:n]


def diagnose(data: Path, n: int, budgets: list[int], templates: list[str], seed: int) -> dict[str, Any]:
    """The rates of the module docstring per (model, template, budget)."""
    import torch

    from stages.core.answers import extract_answer, is_equivalent
    from stages.core.generation import SamplingParams, make_generator
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.rewards import format_reward, r1_format_reward

    rows = load_rows(data / "corpus" / "problems" / "rl.jsonl", n)
    out: dict[str, Any] = {}
    for name in ("pretrain", "sft"):
        path = data / "models" / name
        if not path.is_dir():  # a --build project stops at pretrain
            continue
        tok, model = load_tokenizer(path), load_model(path, dtype=torch.float32)
        model.eval()
        gen = make_generator("hf", model, tok, batch_size=n * 8)
        for template in templates:
            prompts = [prompt_of(template, r["question"], tok) for r in rows]
            for budget in budgets:
                t0 = time.perf_counter()
                comps = gen.generate(prompts, SamplingParams(temperature=1.0, n=8, max_new_tokens=budget, seed=seed))
                stats = {"stop": 0, "think_closed": 0, "boxed": 0, "correct": 0, "r1_format": 0, "dsm_format": 0,
                         "tokens": 0}
                spread = 0
                for r, group in zip(rows, comps, strict=True):
                    accs = []
                    for c in group:
                        pred = extract_answer(c.text, "math")
                        ok = pred is not None and is_equivalent(pred, r["answer"], percent_variants=False)
                        accs.append(ok)
                        stats["stop"] += c.finish_reason == "stop"
                        stats["think_closed"] += "</think>" in c.text
                        stats["boxed"] += "\\boxed{" in c.text
                        stats["correct"] += ok
                        stats["r1_format"] += r1_format_reward(completion=c.text, finish_reason=c.finish_reason)
                        stats["dsm_format"] += format_reward(completion=c.text, finish_reason=c.finish_reason)
                        stats["tokens"] += len(c.token_ids)
                    spread += len(set(accs)) > 1
                total = n * 8
                key = f"{name}/{template}/{budget}"
                out[key] = {k: round(v / total, 4) for k, v in stats.items()}
                out[key]["tokens"] = round(stats["tokens"] / total, 1)
                out[key]["groups_with_accuracy_spread"] = round(spread / n, 4)
                out[key]["example"] = comps[0][0].text[:300]
                out[key]["s"] = round(time.perf_counter() - t0, 1)
                print(key, {k: v for k, v in out[key].items() if k != "example"}, flush=True)
        del model, gen
    return out


def train(data: Path, variants: list[str], steps: int, seed: int, heldout: int, every: int) -> dict[str, Any]:
    """One GRPO run from the pretrained model per variant (module docstring)."""
    import torch

    from stages.core.modeling import load_model, load_tokenizer
    from stages.params import load_params
    from stages.rl.heldout import HeldoutEval
    from stages.rl.loop import fit

    base = load_params(ROOT / "params.yaml").grpo
    rows = load_rows(data / "corpus" / "problems" / "rl.jsonl", 10**9)
    out: dict[str, Any] = {}
    for v in variants:
        changes = {"start": "pretrain", "steps": steps, "seed": seed, "baseline.enabled": False,
                   "heldout.every": every, "heldout.limit": heldout, "checkpoint_every": 0, "log_completions_every": 0,
                   "compute.num_threads": 1, "heldout.problems_file": str(data / "testsets" / "generated.jsonl"),
                   "prompts_file": str(data / "corpus" / "problems" / "rl.jsonl"), **VARIANTS[v]}
        p = base.updated(changes)
        torch.manual_seed(p.seed)
        torch.set_num_threads(1)
        path = data / "models" / "pretrain"
        tok, model = load_tokenizer(path), load_model(path, dtype=torch.float32)
        h = HeldoutEval.from_params(p.heldout, p.template)
        t0, load0 = time.perf_counter(), os.getloadavg()[0]
        _, _, state = fit(p, model, tok, rows=rows, heldout=h)
        hist = state.history

        def mean(key: str, rows: list[dict[str, Any]]) -> float:
            xs = [r[key] for r in rows if r.get(key) is not None and math.isfinite(r[key])]
            return round(sum(xs) / len(xs), 4) if xs else math.nan

        out[v] = {"changes": {k: str(x) for k, x in VARIANTS[v].items()}, "seed": seed, "steps": steps,
                  "heldout": {str(r["step"]): r["heldout_accuracy"] for r in h.records} if h else None,
                  "accuracy_first5": mean("accuracy", hist[:5]), "accuracy_last5": mean("accuracy", hist[-5:]),
                  "reward_first5": mean("reward_mean", hist[:5]), "reward_last5": mean("reward_mean", hist[-5:]),
                  "zero_std_first5": mean("zero_std_frac", hist[:5]), "zero_std_last5": mean("zero_std_frac", hist[-5:]),
                  "len_first5": mean("completion_len", hist[:5]), "len_last5": mean("completion_len", hist[-5:]),
                  "truncated_last5": mean("truncated_frac", hist[-5:]),
                  "wall_s": round(time.perf_counter() - t0, 1), "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}
        print(v, json.dumps(out[v]), flush=True)
    return out


def set_key(doc: Any, dotted: str, text: str) -> None:
    """``doc[a][b][c] = value`` for ``a.b.c``, the value parsed as YAML; a key that is not there is an error."""
    import yaml

    *parents, last = dotted.split(".")
    node = doc
    for k in parents:
        node = node[k]
    if last not in node:
        raise SystemExit(f"--set {dotted}: no such key in params.yaml")
    node[last] = yaml.safe_load(text)


def build(target: Path, sets: list[str]) -> dict[str, Any]:
    """Clone HEAD into ``target``, apply ``sets`` to its params.yaml, run the graph through pretrain and the test set."""
    import subprocess

    from ruamel.yaml import YAML

    if target.exists():
        raise SystemExit(f"--build {target}: already exists; pick a new directory")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    y = YAML()
    params = target / "params.yaml"
    doc = y.load(params.read_text())
    for kv in sets:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--set {kv!r}: not KEY=VALUE")
        set_key(doc, key, value)
    with params.open("w") as f:
        y.dump(doc, f)
    from benchmarks._tiny import pipeline_env

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flows.pipeline", "pretrain", "testsets@generated"], cwd=target,
                   env=pipeline_env(), check=True)
    metrics = json.loads((target / "data" / "metrics" / "pretrain.json").read_text())
    return {"sets": sets, "wall_s": round(time.perf_counter() - t0, 1), "pretrain_metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a pipeline run's data/ directory")
    ap.add_argument("--build", type=Path, help="make a project here (module docstring)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params.yaml value for --build")
    ap.add_argument("--label", default="", help="prefix of the result keys (the base model's name)")
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--budgets", type=int, nargs="+", default=[64, 192])
    ap.add_argument("--templates", nargs="+", default=["r1", "deepseekmath", "qa", "problem", "r1qa"])
    ap.add_argument("--variants", nargs="+", default=["r1", "r1_len192"], choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if (args.build is None) == (args.data is None):
        ap.error("give --data DIR (--diagnose / --train) or --build DIR")
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.setdefault("note", "shared 2-core machine; load average beside each timing")
    prefix = f"{args.label}/" if args.label else ""
    if args.build is not None:
        built = build(args.build.resolve(), args.set)
        print(json.dumps(built))
        result.setdefault("builds", {})[args.label or args.build.name] = built
        data = args.build.resolve() / "data"
    else:
        data = Path(args.data).resolve()
    if args.diagnose:
        d = diagnose(data, args.problems, args.budgets, args.templates, args.seed)
        result["diagnose"] = {**result.get("diagnose", {}), **{prefix + k: v for k, v in d.items()}}
        result["diagnose_load"] = os.getloadavg()[0]
    if args.train:
        runs = train(data, args.variants, args.steps, args.seed, args.heldout, args.every)
        suffix = f"/seed{args.seed}" if args.label else ""
        result.setdefault("train", {}).update({prefix + k + suffix: v for k, v in runs.items()})
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

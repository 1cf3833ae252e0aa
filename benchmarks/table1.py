"""The paper's Table 1 at toy scale: the same base model pretrained on equal token budgets of four corpora,
then few-shot evaluation, as DVC experiments of the pretrain and evaluate@pretrain stages.

    python benchmarks/table1.py                      # print the plan and exit
    python benchmarks/table1.py --run [--steps 200] [--seeds 0 1 2] [--project DIR]
    python benchmarks/table1.py --collect-only --project DIR

Corpora (DeepSeekMath Table 1 compares the DeepSeekMath Corpus with OpenWebMath, Proof-Pile-2, ...):

- ``filtered``: the corpus stage's math corpus (data/corpus/math_corpus.jsonl, the last round);
- ``random``: crawl pages drawn at random (uniformly, seed 0) from the stage's candidates (deduplicated and
  decontaminated: math_corpus.jsonl + general.jsonl), as many tokens as the filtered corpus;
- ``round1``: the pages the first round collected (math_corpus.jsonl rows with ``round == 1``);
- ``seed``: the seed corpus alone (data/generated/seed.jsonl, the OpenWebMath stand-in).

Every corpus file starts with the same ``--heldout`` rows (question + worked solution of SFT-split word
problems, which no corpus contains), and ``pretrain.eval_docs`` holds exactly those out: one common held-out set
for the held-out loss. Each run is ``dvc exp run -s -n table1-<tag>-<corpus>-s<seed> -S pretrain.mixture=[...]
-S pretrain.train.seed=<seed> -S pretrain.train.steps=<steps> ... pretrain evaluate@pretrain`` in the project's
workspace (one after the other: the pretrain stage uses every core). All runs train for the same number of steps
on the same batch and sequence length, so they see the same number of tokens; a corpus smaller than that budget
is repeated (the pretrain stream starts a new epoch at its end), as the paper did. Few-shot evaluation:
evaluate@pretrain (the tiny default's few-shot CoT prompts, greedy, on the generated test problems). Table 1
has no SFT; neither has this.

``--project`` (default: a fresh clone of this repository under /tmp) must have run ``dvc repro corpus
base_model``; the script does that in a fresh clone. Results: benchmarks/results/table1.json and
benchmarks/results/table1.png, and a markdown table on stdout. On the generated crawl the math pages come from
the test problems' distribution, so this is a sanity check of the method, not a replication.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "table1.json"
CORPORA = ("filtered", "random", "round1", "seed")
LABELS = {"filtered": "filtered math corpus (all rounds)", "random": "random crawl pages",
          "round1": "round-1 corpus only", "seed": "seed corpus (OpenWebMath stand-in)"}
# DeepSeekMath Table 1 (1.3B model, 150B tokens per corpus; docs: /work/shared/docs/deepseekmath.md section 1)
PAPER = {"DeepSeekMath Corpus": {"GSM8K": 23.8, "MATH": 13.6}, "OpenWebMath": {"GSM8K": 11.5, "MATH": 8.9},
         "Proof-Pile-2": {"GSM8K": 14.3, "MATH": 11.2}}


def _env(project: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(project)
    env.setdefault("DVC_NO_ANALYTICS", "1")
    return env


def sh(project: Path, *args: str) -> str:
    out = subprocess.run(list(args), cwd=project, env=_env(project), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-2000:]}")
    return out.stdout


def dvc(project: Path, *args: str) -> str:
    return sh(project, sys.executable, "-m", "dvc", *args)


def make_project(path: Path) -> None:
    """A fresh clone of this repository's HEAD with the data, corpus and base_model stages run and locked."""
    sh(ROOT, "git", "clone", "-q", str(ROOT), str(path))
    dvc(path, "repro", "corpus", "base_model")
    sh(path, "git", "add", "dvc.lock")
    sh(path, "git", "-c", "user.name=table1", "-c", "user.email=table1@localhost", "commit", "-qm", "table1: lock upstream stages")


def _rows(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f]


def _tokens(rows: list[dict[str, Any]]) -> int:
    return sum(-(-len(r["text"]) // 4) for r in rows)


def build_corpora(project: Path, heldout: int, seeds: list[int]) -> dict[str, Any]:
    """Write data/table1/<corpus>-s<seed>.jsonl (the common held-out rows first, then the corpus in the seed's
    order); return sizes (of seed 0's files).

    The pretrain stage's own seed changes nothing here: the model starts from the same base model and a single
    source is read in file order (measured: seeds 0 and 1 on one file gave the same held-out loss to four
    decimals). So a seed sets the order of the training rows (seed 0: the stage's order) and, for ``random``,
    which pages are drawn."""
    corpus = project / "data" / "corpus"
    math_rows = _rows(corpus / "math_corpus.jsonl")
    general = _rows(corpus / "general.jsonl")
    problems = _rows(project / "data" / "corpus" / "problems" / "sft.jsonl")
    held = [{"text": f"Problem: {p['question']}\nSolution:\n{p['cot']}"} for p in problems[:heldout]]
    budget = _tokens(math_rows)
    out = project / "data" / "table1"
    out.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, Any] = {}
    for seed in seeds:
        pool = [{"text": r["text"]} for r in math_rows + general]
        random.Random(seed).shuffle(pool)
        rand, n = [], 0
        for r in pool:
            if n >= budget:
                break
            rand.append(r)
            n += -(-len(r["text"]) // 4)
        sets = {"filtered": [{"text": r["text"]} for r in math_rows], "random": rand,
                "round1": [{"text": r["text"]} for r in math_rows if r["round"] == 1],
                "seed": [{"text": r["text"]} for r in _rows(project / "data" / "generated" / "seed.jsonl")]}
        for name, rows in sets.items():
            if seed != 0 and name != "random":
                random.Random(seed).shuffle(rows)
            with open(out / f"{name}-s{seed}.jsonl", "w", encoding="utf-8") as f:
                for r in held + rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            if seed == seeds[0]:
                sizes[name] = {"pages": len(rows), "tokens_chars_div_4": _tokens(rows)}
    # how much of each corpus is math by the generator's labels (the crawl's ground truth, joined by text)
    label = {r["text"]: r["label"] for r in _rows(project / "data" / "generated" / "crawl.jsonl")}
    for name, rows in sets.items():
        known = [label[r["text"]] for r in rows if r["text"] in label]
        sizes[name]["math_share"] = round(sum(x == "math" for x in known) / len(known), 4) if known else None
    return sizes


def run_one(project: Path, name: str, corpus: str, seed: int, steps: int, warmup: int | None, heldout: int,
            limit: int | None, threads: int | None = None) -> dict[str, Any]:
    sets = [f"pretrain.mixture=[{{path:data/table1/{corpus}-s{seed}.jsonl,ratio:1.0}}]", f"pretrain.train.seed={seed}",
            f"pretrain.train.steps={steps}", f"pretrain.eval_docs={heldout}", f"pretrain.train.eval_every={steps}"]
    if warmup is not None:
        sets.append(f"pretrain.train.warmup_steps={warmup}")
    if threads is not None:
        sets.append(f"pretrain.train.num_threads={threads}")
    if limit is not None:
        sets.append(f"evaluate.models.pretrain.limit={limit}")
    args = ["exp", "run", "-s", "-n", name]
    for s in sets:
        args += ["-S", s if s.startswith(("+", "~")) else f"++{s}"]  # keys params.yaml may not name (defaults)
    t, load = time.perf_counter(), os.getloadavg()
    dvc(project, *args, "pretrain", "evaluate@pretrain")
    pre = json.loads((project / "data" / "metrics" / "pretrain.json").read_text())
    ev = json.loads((project / "data" / "metrics" / "evaluate_pretrain.json").read_text())
    return {"corpus": corpus, "seed": seed, "name": name, "wall_s": round(time.perf_counter() - t, 1),
            "heldout_loss": pre["eval_loss_after"], "heldout_loss_before": pre["eval_loss_before"],
            "heldout_tokens": pre["heldout_tokens"], "train_tokens": sum(pre["mixture_tokens"].values()),
            "epochs": next(iter(pre["source_epochs"].values())),
            "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()], "evaluate": ev}


def _accuracy(ev: dict[str, Any]) -> tuple[float, int]:
    """Greedy CoT accuracy and problem count on the generated test problems (evaluate_pretrain.json)."""
    try:
        g = ev["generated"]["cot"]["greedy"]
    except KeyError:
        raise SystemExit(f"no generated/cot/greedy in evaluate_pretrain.json (keys {list(ev)})") from None
    return float(g["acc"]), int(g["n"])


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for c in CORPORA:
        rs = [r for r in runs if r["corpus"] == c]
        if not rs:
            continue
        acc = [_accuracy(r["evaluate"])[0] for r in rs]
        loss = [r["heldout_loss"] for r in rs]

        def ms(xs: list[float]) -> tuple[float, float]:
            m = sum(xs) / len(xs)
            return round(m, 4), round(math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0, 4)
        out[c] = {"seeds": [r["seed"] for r in rs], "accuracy": acc, "accuracy_mean_sd": ms(acc),
                  "heldout_loss": loss, "heldout_loss_mean_sd": ms(loss), "n_problems": _accuracy(rs[0]["evaluate"])[1],
                  "epochs": [r["epochs"] for r in rs], "train_tokens": rs[0]["train_tokens"]}
    return out


def table(summary: dict[str, Any], sizes: dict[str, Any]) -> str:
    lines = ["| corpus | pages | tokens (chars/4) | math share | seeds run | few-shot greedy acc. (mean ± sd) | "
             "held-out loss (mean ± sd) |", "|---|---|---|---|---|---|---|"]
    for c, v in summary.items():
        a, l_ = v["accuracy_mean_sd"], v["heldout_loss_mean_sd"]
        lines.append(f"| {LABELS[c]} | {sizes[c]['pages']} | {sizes[c]['tokens_chars_div_4']} | {sizes[c]['math_share']} | "
                     f"{','.join(str(x) for x in v['seeds'])} | {a[0]:.3f} ± {a[1]:.3f} | {l_[0]:.3f} ± {l_[1]:.3f} |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    names = list(summary)
    for ax, key, title in ((axes[0], "accuracy", "few-shot greedy accuracy (generated test)"),
                           (axes[1], "heldout_loss", "held-out loss (word problems)")):
        for i, c in enumerate(names):
            ys = summary[c][key]
            ax.scatter([i] * len(ys), ys, color="C0", alpha=0.6)
            ax.errorbar([i], [summary[c][f"{key}_mean_sd"][0]], yerr=[summary[c][f"{key}_mean_sd"][1]], fmt="_",
                        color="k", markersize=20, capsize=4)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle("Table 1 at toy scale: same model, same tokens, four corpora (one dot per seed run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--collect-only", action="store_true", help="re-write table and plot from table1.json")
    ap.add_argument("--project", default=None)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=None, help="pretrain.train.warmup_steps (default: params.yaml's)")
    ap.add_argument("--threads", type=int, default=None,
                    help="pretrain.train.num_threads (1 on a crowded machine: 2 OpenMP threads that wait for each other "
                         "made a 40-step run take 10-20 min at load average ~18)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--corpora", nargs="*", default=list(CORPORA))
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--limit", type=int, default=None, help="evaluate at most this many test problems")
    ap.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M"))
    ap.add_argument("--append", action="store_true",
                    help="keep table1.json's runs (same settings) and run only the planned (corpus, seed) pairs it lacks")
    args = ap.parse_args()
    if args.collect_only:
        data = json.loads(RESULTS.read_text())
        print(table(data["summary"], data["corpora"]))
        plot(data["summary"], RESULTS.with_suffix(".png"))
        return 0
    plan = [(c, s, f"table1-{args.tag}-{c}-s{s}") for s in args.seeds for c in args.corpora]
    if not args.run:
        for c, s, n in plan:
            print(f"dvc exp run -s -n {n} -S 'pretrain.mixture=[{{path:data/table1/{c}-s{s}.jsonl,ratio:1.0}}]' "
                  f"-S pretrain.train.seed={s} -S pretrain.train.steps={args.steps} -S pretrain.eval_docs={args.heldout} "
                  "pretrain evaluate@pretrain")
        return 0
    project = Path(args.project) if args.project else Path(tempfile.mkdtemp(prefix="table1-")) / "repo"
    if not (project / "dvc.lock").is_file():
        make_project(project)
    sizes = build_corpora(project, args.heldout, sorted(set([0, *args.seeds])))
    print(json.dumps(sizes), flush=True)
    load0 = os.getloadavg()
    runs = []
    if args.append and RESULTS.is_file():
        runs = json.loads(RESULTS.read_text())["runs"]
        done = {(r["corpus"], r["seed"]) for r in runs}
        plan = [(c, s, n) for c, s, n in plan if (c, s) not in done]
    seeds = sorted({r["seed"] for r in runs} | {s for _, s, _ in plan})
    for c, s, n in plan:
        r = run_one(project, n, c, s, args.steps, args.warmup, args.heldout, args.limit, args.threads)
        runs.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "evaluate"} | {"accuracy": _accuracy(r["evaluate"])}), flush=True)
        summary = summarise(runs)
        RESULTS.write_text(json.dumps({"steps": args.steps, "warmup_steps": args.warmup, "eval_limit": args.limit,
                                       "num_threads": args.threads,
                                       "seeds": seeds, "heldout_rows": args.heldout,
                                       "project": str(project), "load_before": load0, "load_after": os.getloadavg(),
                                       "corpora": sizes, "summary": summary, "paper_table1": PAPER, "runs": runs},
                                      indent=1) + "\n")
    print(table(summarise(runs), sizes))
    plot(summarise(runs), RESULTS.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

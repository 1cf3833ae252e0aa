"""How cost grows: GRPO step time versus G, completion length and batch size; corpus scoring versus pages.

GRPO: one axis at a time around a base point (questions_per_step Q, group_size G, max_new_tokens T), each
point timed by grpo_step.py's :func:`time_steps` (the RL driver's step, a fresh copy of the model per point) on
the tiny default model (params.yaml ``base_model`` sizes, random weights, so completions run to T and the work per
point is Q*G*T generated tokens), hf backend, 2 torch threads, the grpo section's loss settings with zero-std groups kept (every step does a full update).
Each point: one untimed warm-up step at the smallest point of the whole run, then the median of
``--repeats`` steps. The exponent k of time ~ x^k (least squares on log-log) says how the cost grows.

Corpus: the stage's scoring task (stages.corpus.tasks.score_shard: read the shard's normalised texts,
load the classifier, score, save, histograms) and the in-memory MathClassifier.score versus bare
``fasttext`` (``load_model`` + ``predict(lines, k=2)``) on the same normalised pages, for growing page
counts (pages from data/generated/crawl.jsonl, repeated if needed; the classifier data/corpus/classifier.bin
or, when absent, one trained here on seed vs crawl pages). Best of ``--repeats`` runs per size. "Linear in
pages" is judged on the fit t = a + b * pages (R^2) and on the log-log slope (at most 1.1: no super-linear
growth; a fixed cost such as loading the model pulls it below 1). The goal's ratio is the stage's task over
bare fastText load + predict at the largest size.

    python benchmarks/scaling.py            # JSON to benchmarks/results/scaling.json
    python benchmarks/scaling.py --quick    # a small grid
    python benchmarks/scaling.py --skip-grpo --pages 1000,2000,4000,8000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._tiny import build_tiny_model, linear_fit, loglog_slope, machine, problem_rows  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "scaling.json"


def grpo_grid(base: dict[str, int], axes: dict[str, list[int]], repeats: int, threads: int) -> dict[str, Any]:
    """Median step time (and its parts) at every grid point; log-log slope per axis."""
    import torch

    from benchmarks.grpo_step import start, time_steps
    from stages.core.modeling import load_model
    from stages.params import load_params

    torch.set_num_threads(threads)
    params = load_params(ROOT / "params.yaml")
    rows = problem_rows(512)
    tmp = tempfile.mkdtemp(prefix="scaling-model-")
    build_tiny_model(tmp)

    def point(q: int, g: int, t: int, n: int, step0: int) -> dict[str, Any]:
        p = params.grpo.updated({"questions_per_step": q, "rollout.group_size": g, "rollout.max_new_tokens": t,
                                 "advantage.skip_zero_std_groups": False, "optim.micro_batch_size": q * g,
                                 "rollout.backend": "hf"})
        ms = time_steps({"grpo": start("grpo", p, tmp, rows, batch_size=q * g)}, n, step0)["grpo"]
        keys = ("wall_s", "t_generation", "t_scoring", "t_logprobs", "t_update", "cpu_step_s")
        out: dict[str, Any] = {"Q": q, "G": g, "T": t}
        out.update({k: round(statistics.median(m[k] for m in ms), 3) for k in keys})
        out["tokens"] = round(statistics.median(m["tokens"] for m in ms), 1)
        return out

    point(min(axes["questions_per_step"]), min(axes["group_size"]), min(axes["max_new_tokens"]), 1, 10_000)  # warm-up
    result: dict[str, Any] = {"base": base, "repeats": repeats, "threads": threads, "model": "random init, base_model size",
                              "n_params": sum(x.numel() for x in load_model(tmp).parameters())}
    step = 0
    for axis, values in axes.items():
        pts = []
        for v in values:
            cfg = dict(base, **{axis: v})
            r = point(cfg["questions_per_step"], cfg["group_size"], cfg["max_new_tokens"], repeats, step)
            step += repeats
            r["loadavg"] = machine()["loadavg"]
            print(f"grpo {axis}={v:<4} step {r['wall_s']:8.2f} s  tokens {r['tokens']:7.0f}  "
                  f"gen {r['t_generation']:.2f} logp {r['t_logprobs']:.2f} upd {r['t_update']:.2f}", flush=True)
            pts.append(r)
        result[axis] = {"points": pts, "loglog_slope": loglog_slope(values, [p["wall_s"] for p in pts]),
                        "loglog_slope_cpu": loglog_slope(values, [p["cpu_step_s"] for p in pts])}
    return result


def _pages(n: int) -> list[str]:
    f = ROOT / "data" / "generated" / "crawl.jsonl"
    texts: list[str] = []
    if f.is_file():
        with f.open(encoding="utf-8") as fh:
            for line in fh:
                texts.append(json.loads(line)["text"])
                if len(texts) >= n:
                    break
    if not texts:
        from stages.data.problems import generate_splits

        rows = generate_splits(0, n_sft=1, n_rl=max(n, 100), n_test=1, min_steps=1, max_steps=3, max_value=20)["rl"]
        texts = [r["question"] + " " + r["cot"] for r in rows]
    while len(texts) < n:
        texts += texts[: n - len(texts)]
    return texts[:n]


def _classifier(tmp: Path) -> tuple[Path, str]:
    f = ROOT / "data" / "corpus" / "classifier.bin"
    if f.is_file():
        return f, "data/corpus/classifier.bin"
    from stages.corpus.classifier import train_classifier

    pages = _pages(2000)
    seed = ROOT / "data" / "generated" / "seed.jsonl"
    pos = [json.loads(x)["text"] for x in seed.open()][:1000] if seed.is_file() else pages[:1000]
    clf = train_classifier(pos, pages[1000:], dim=32, epochs=3, min_count=3, word_ngrams=3, bucket=100_000)
    out = tmp / "classifier.bin"
    clf.save(out)
    return out, "trained here (dim 32, 3 epochs)"


def corpus_scaling(sizes: list[int], repeats: int) -> dict[str, Any]:
    """Scoring time versus pages: the stage's task, MathClassifier.score and bare fastText."""
    import fasttext
    import numpy as np

    from stages.core.text import normalize_for_classifier
    from stages.corpus.classifier import MathClassifier
    from stages.corpus.tasks import score_shard

    tmp = Path(tempfile.mkdtemp(prefix="scaling-corpus-"))
    model_path, model_kind = _classifier(tmp)
    all_pages = _pages(max(sizes))
    t0 = time.perf_counter()
    norm_all = [normalize_for_classifier(t) for t in all_pages]
    norm_s = time.perf_counter() - t0
    rows = []
    for n in sizes:
        lines = norm_all[:n]
        shard = tmp / f"shard{n}"
        shard.mkdir(exist_ok=True)
        (shard / "norm.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        np.save(shard / "keep.npy", np.ones(n, dtype=bool))  # the shard state score_shard reads
        np.save(shard / "tokens.npy", np.array([len(x.split()) for x in lines], dtype=np.int64))
        best: dict[str, float] = {}

        def timed(key: str, fn: Any, best: dict[str, float] = best) -> None:
            t = time.perf_counter()
            fn()
            best[key] = min(best.get(key, float("inf")), time.perf_counter() - t)

        clf = MathClassifier.load(model_path)
        bare = fasttext.load_model(str(model_path))
        for _ in range(repeats):
            timed("stage_task_s", lambda: score_shard(str(shard), str(model_path), 10000))  # noqa: B023
            timed("bare_load_predict_s", lambda: fasttext.load_model(str(model_path)).predict(lines, k=2))  # noqa: B023
            timed("classifier_score_s", lambda: clf.score(lines, normalized=True))  # noqa: B023
            timed("bare_predict_s", lambda: bare.predict(lines, k=2))  # noqa: B023
        r = {"pages": n, **{k: round(v, 4) for k, v in best.items()},
             "stage_task_over_bare": round(best["stage_task_s"] / best["bare_load_predict_s"], 3),
             "score_over_bare_predict": round(best["classifier_score_s"] / best["bare_predict_s"], 3),
             "pages_per_s_stage_task": round(n / best["stage_task_s"], 1),
             "pages_per_s_bare": round(n / best["bare_predict_s"], 1)}
        print(f"corpus pages={n:<7} stage task {r['stage_task_s']:.3f} s  bare load+predict {r['bare_load_predict_s']:.3f} s"
              f"  score {r['classifier_score_s']:.3f} s  bare predict {r['bare_predict_s']:.3f} s", flush=True)
        rows.append(r)
    big = rows[-1]
    fit = linear_fit([r["pages"] for r in rows], [r["stage_task_s"] for r in rows])
    return {
        "classifier": model_kind, "repeats": repeats, "points": rows,
        "normalize_pages_per_s": round(len(all_pages) / norm_s, 1),
        "loglog_slope": loglog_slope([r["pages"] for r in rows], [r["stage_task_s"] for r in rows]),
        "loglog_slope_bare": loglog_slope([r["pages"] for r in rows], [r["bare_predict_s"] for r in rows]),
        # linear in pages: t = a + b * pages fits (R^2 near 1) and the log-log slope is not above 1
        # (a fixed cost a, loading the model, pulls the log-log slope below 1 at small sizes)
        "linear_fit": None if fit is None else {"fixed_s": round(fit["intercept"], 4),
                                                "us_per_page": round(fit["slope"] * 1e6, 2), "r2": round(fit["r2"], 5)},
        # the goal's figure: the stage's scoring task over bare fastText (load + predict), at the largest size
        "score_over_bare_fasttext": {"median": big["stage_task_over_bare"], "at_pages": big["pages"],
                                     "median_over_sizes": round(statistics.median(r["stage_task_over_bare"] for r in rows), 3)},
        "loadavg": machine()["loadavg"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grid: base Q=2 G=4 T=16, pages up to 4000")
    ap.add_argument("--repeats", type=int, default=None, help="timed steps / runs per point (default 2; quick 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pages", default=None, help="comma-separated page counts")
    ap.add_argument("--skip-grpo", action="store_true")
    ap.add_argument("--skip-corpus", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.quick:
        base = {"questions_per_step": 2, "group_size": 4, "max_new_tokens": 16}
        axes = {"group_size": [2, 4, 8], "max_new_tokens": [8, 16, 32], "questions_per_step": [1, 2, 4]}
        sizes = [500, 1000, 2000, 4000]
        repeats = args.repeats or 1
    else:
        base = {"questions_per_step": 4, "group_size": 8, "max_new_tokens": 32}
        axes = {"group_size": [2, 4, 8, 16], "max_new_tokens": [16, 32, 64], "questions_per_step": [2, 4, 8]}
        sizes = [1000, 2000, 4000, 8000, 16000]
        repeats = args.repeats or 2
    if args.pages:
        sizes = [int(x) for x in args.pages.split(",")]
    import torch

    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"benchmark": "scaling", "quick": args.quick, "machine_before": machine(),
                              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    out = Path(args.out)
    if out.is_file():  # keep the other half of an earlier run when one half is skipped
        old = json.loads(out.read_text())
        for k in ("grpo", "corpus"):
            if k in old:
                result[k] = old[k]
    if not args.skip_corpus:
        result["corpus"] = corpus_scaling(sizes, max(repeats, 2))
    if not args.skip_grpo:
        result["grpo"] = grpo_grid(base, axes, repeats, args.threads)
    result["machine_after"] = machine()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if "corpus" in result:
        c = result["corpus"]
        print(f"\ncorpus: time ~ pages^{c['loglog_slope']} (bare predict ^{c['loglog_slope_bare']}); linear fit {c['linear_fit']}; "
              f"stage task / bare "
              f"fastText = {c['score_over_bare_fasttext']['median']} at {c['score_over_bare_fasttext']['at_pages']} pages")
    if "grpo" in result:
        for axis in axes:
            print(f"grpo: step time ~ {axis}^{result['grpo'][axis]['loglog_slope']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``evaluate`` stage for one model: every run it asks for, its completions, metrics and plots.

Outputs (``<model>`` is a key of ``evaluate.models``):
- ``data/eval/<model>/<benchmark>_<mode>_<greedy|sample>.jsonl``: one row per problem with every
  completion, its extracted answer and verdict; ``prompts.txt``: the first prompt of each run;
- ``data/metrics/evaluate_<model>.json`` (dvc metrics): per benchmark, mode and decoding: greedy
  accuracy with its standard error, or avg@n / pass@k / maj@k (k = 1, 2, 4, ... n) with theirs, under the headline
  checker mode; ``wall_s``; the checker's mode and version;
- ``data/details/evaluate_<model>.json``: all of that, per difficulty, the verifier-sensitivity table of every run
  (accuracy under each checker mode and under math-verify alone, disagreements and samples of each kind), the
  per-problem scores the report's paired comparisons need, and what produced the numbers (checker mode and version,
  prompt template hash, sampling parameters and seeds);
- ``data/plots/evaluate/<model>/<benchmark>_<mode>.tsv`` (dvc plots): k, pass@k, maj@k per sampled run.

Resumable: each run appends finished batches to ``checkpoints/evaluate/<hash>/<run>.jsonl``, where the
hash covers the model's weights, the params, the benchmark files and the evaluation code, so only an
identical evaluation resumes; the checkpoint is deleted once the outputs are written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from stages.core import generation, paths, sandbox, threads
from stages.core.answers import CHECKER_VERSION, MODES, OUTCOMES, RIGHT, answer_key
from stages.core.errors import PipelineError
from stages.core.hardware import fast_bf16_generation, generation_record
from stages.core.io import atomic_path, write_metrics
from stages.core.modeling import resolve_model
from stages.core.plots import write_table
from stages.core.problems import Problem, load_problem_file
from stages.core.progress import Throughput, describe
from stages.evaluate.benchmarks import build_prompt, check_supported, fewshot_exemplars
from stages.evaluate.loop import LoopSettings, RunSpec, frac, generator_format, greedy_summary, run_one
from stages.evaluate.metrics import default_ks, mean_se, sample_metrics
from stages.schema.evaluate import EvalCommonParams, EvalModelParams, EvaluateParams

_CODE_DIRS = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "core")


def benchmark_file(c: EvalCommonParams, name: str) -> Path:
    """The rows of test set ``name``: ``<testsets>/<name>.jsonl`` (or ``testsets`` itself when it is that file)."""
    base = Path(c.testsets)
    return base if base.is_file() and base.stem == name else base / f"{name}.jsonl"


def load_benchmarks(c: EvalCommonParams, model_limit: int | None = None) -> dict[str, list[Problem]]:
    """The test sets ``c.benchmarks`` names, each cut to the smaller of ``c.limit`` and ``model_limit``; a test set
    not written yet is a one-line error naming the stage that writes it."""
    limits = [x for x in (c.limit, model_limit) if x is not None]
    limit = min(limits) if limits else None
    out: dict[str, list[Problem]] = {}
    for name in c.benchmarks:
        f = benchmark_file(c, name)
        if not f.is_file():
            raise PipelineError(f"evaluate.common.benchmarks: test set {name!r} not found ({f}); add it to "
                                f"testsets.datasets and run dvc repro testsets@{name}")
        out[name] = load_problem_file(f, limit)
    return out


def plan_runs(m: EvalModelParams, benchmarks: dict[str, list[Problem]] | Sequence[str]) -> list[RunSpec]:
    """Every (benchmark, mode, decoding) run of one model, checked for a prompt format up front. ``benchmarks``:
    the loaded test sets (each run gets its rows' family), or names (each name is its own family)."""
    runs = []
    for bench in benchmarks:
        fam = benchmarks[bench][0].benchmark if isinstance(benchmarks, dict) else bench
        for mode in m.greedy_modes:
            check_supported(fam, mode, m.prompting)
            runs.append(RunSpec(bench, mode, "greedy", 1, fam))
        for mode in m.sample_modes:
            check_supported(fam, mode, m.prompting)
            runs.append(RunSpec(bench, mode, "sample", m.n_samples, fam))
    if not runs:
        raise PipelineError("evaluate.models: a model with no greedy_modes and no sample_modes evaluates nothing")
    return runs


def _file_digest(path: Path, h: Any) -> None:
    st = path.stat()
    h.update(f"{path.name}:{st.st_size}:".encode())
    if st.st_size <= 256 * 2**20:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(2**20), b""):
                h.update(chunk)
    else:  # multi-GB weights: size and mtime stand in for the content
        h.update(str(st.st_mtime_ns).encode())


def fingerprint(model: str, m: EvalModelParams, c: EvalCommonParams, data_files: Sequence[str | Path]) -> str:
    """Hash of everything an evaluation's results depend on (the checkpoint directory name)."""
    h = hashlib.sha256()
    h.update(json.dumps({"model": model, "m": m.tracked_dump(), "c": c.tracked_dump()}, sort_keys=True).encode())
    target = Path(resolve_model(m.path))
    files = sorted(p for p in target.iterdir() if p.is_file()) if target.is_dir() else []
    h.update(str(target if not files else "").encode())
    for p in files:
        _file_digest(p, h)
    for f in data_files:
        _file_digest(Path(f), h)
    for d in _CODE_DIRS:
        for p in sorted(d.glob("*.py")):
            _file_digest(p, h)
    return h.hexdigest()[:16]


def _candidates(x: dict[str, Any]) -> list[str]:
    if x.get("answers"):
        return list(x["answers"])
    return [] if x.get("answer") is None else [str(x["answer"])]


def summarize(records: list[dict[str, Any]], spec: RunSpec, c: EvalCommonParams | None) -> dict[str, Any]:
    """Metrics of one run under the headline checker mode: greedy accuracy, or avg@n / pass@k / maj@k, each with its
    standard error over problems; overall and per difficulty; the verifier-sensitivity table; per-problem scores.
    ``c``: the evaluation's settings (a greedy run needs none; GRPO's held-out curve takes the greedy part alone,
    stages.evaluate.loop.greedy_summary, its records judged with the loop's default headline mode, strict)."""
    mode = c.checker.headline if c is not None else "strict"
    if spec.decoding == "greedy":
        out = greedy_summary(records, spec.mode)
    else:
        assert c is not None
        ks = default_ks(spec.n)
        per_problem = []
        for i, r in enumerate(records):
            comps = r["completions"]
            per_problem.append(sample_metrics([answer_key(_candidates(x), mode) for x in comps],
                                              [x["correct"] for x in comps], ks, max_subsets=c.maj_subsets,
                                              seed=c.seed + i))
        out = {"n": len(records), "n_samples": spec.n, "temperature": c.temperature}
        out.update(_mean_dicts(per_problem))
        for k in per_problem[0] if per_problem else ():
            out[f"{k}_se"] = round(mean_se([pm[k] for pm in per_problem])[1], 4)
        comps_all = [x for r in records for x in r["completions"]]
        out["no_answer"] = frac(x["answer"] is None for x in comps_all)
        by: dict[str, list[dict[str, float]]] = {}
        for r, pm in zip(records, per_problem, strict=True):
            by.setdefault(str(r["difficulty"]), []).append(pm)
        out["by_difficulty"] = {d: {"n": len(v), **_mean_dicts(v)} for d, v in sorted(by.items())}
        top = ks[-1]
        out["per_problem"] = {"ids": [r["id"] for r in records],
                              f"avg@{spec.n}": [round(pm[f"avg@{spec.n}"], 4) for pm in per_problem],
                              f"pass@{top}": [round(pm[f"pass@{top}"], 4) for pm in per_problem],
                              f"maj@{top}": [round(pm[f"maj@{top}"], 4) for pm in per_problem]}
    comps_all = [x for r in records for x in r["completions"]]
    out["timeouts"] = sum(x.get("verdicts", {}).get(mode) == "timeout" for x in comps_all)
    out["refused"] = sum(x.get("verdicts", {}).get(mode) == "refused" for x in comps_all)
    out["verifiers"] = verifier_table(records)
    return out


VERIFIERS = (*MODES, "math_verify")
"""The verdicts every completion gets (stages/evaluate/loop.py judge): each checker mode and math-verify alone."""


def verifier_table(records: list[dict[str, Any]], n_examples: int = 3) -> dict[str, Any]:
    """The verifier-sensitivity table of one run: per verifier (each checker mode, math-verify alone) its accuracy
    over all completions and its outcome counts; per pair of verifiers the number of completions they disagree on
    (right vs not right); per kind of disagreement (which verifiers say right) its count and up to ``n_examples``
    samples (problem id, answer, gold, verdicts)."""
    comps = [(r, x) for r in records for x in r["completions"]]
    names = [v for v in VERIFIERS if any(v in x.get("verdicts", {}) for _, x in comps)]
    out: dict[str, Any] = {"n": len(comps)}
    for v in names:
        got = [x["verdicts"].get(v) for _, x in comps]
        out[v] = {"acc": frac(g == RIGHT for g in got), **{o: got.count(o) for o in OUTCOMES if o != RIGHT}}
    pairs = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pairs[f"{a}/{b}"] = sum((x["verdicts"].get(a) == RIGHT) != (x["verdicts"].get(b) == RIGHT) for _, x in comps)
    out["disagreements"] = pairs
    kinds: dict[str, dict[str, Any]] = {}
    for r, x in comps:
        right = [v for v in names if x["verdicts"].get(v) == RIGHT]
        if 0 < len(right) < len(names):
            kind = "right only by " + " + ".join(right) if right else ""
            k = kinds.setdefault(kind, {"count": 0, "samples": []})
            k["count"] += 1
            if len(k["samples"]) < n_examples:
                k["samples"].append({"id": r["id"], "answer": x.get("answers") or x.get("answer"), "gold": r["gold"],
                                     "verdicts": dict(x["verdicts"]), "tail": x.get("text", "")[-160:]})
    out["kinds"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1]["count"]))
    return out


def _mean_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    if not ds:
        return {}
    return {k: round(sum(d[k] for d in ds) / len(ds), 4) for k in ds[0]}


def resolve_dtype(dtype: str) -> str:
    """``auto`` -> ``bfloat16`` where bf16 generation is faster (CUDA with bf16, CPUs with AMX tiles:
    :func:`stages.core.hardware.fast_bf16_generation`), else ``float32``; other values unchanged. (bf16 generation is
    faster than fp32 on an AMX CPU, slower on CPUs without AMX: benchmarks/results/generation.json.)"""
    if dtype != "auto":
        return dtype
    return "bfloat16" if fast_bf16_generation("cuda" if torch.cuda.is_available() else "cpu")[0] else "float32"


def make_generator(c: EvalCommonParams, model_path: str, rows: int | None = None) -> Any:
    """The generation backend (evaluate.common.backend) for the model directory ``model_path``; the hf
    backend decodes up to ``rows`` sequences together (default ``batch_size``: one generate call's worth,
    larger batches are much faster for small models on CPU)."""
    backend = generation.resolve_backend(c.backend)
    kw: dict[str, Any] = {"dtype": resolve_dtype(c.dtype)}
    if backend == "hf":
        kw["batch_size"] = rows or c.batch_size
    return generation.make_generator(backend, resolve_model(model_path), None, **kw)


def run(p: EvaluateParams, model: str, generator: Any = None) -> dict[str, Any]:
    """Evaluate the model ``model`` (a key of ``p.models``); returns (and writes) its metrics.

    ``generator`` overrides the backend built from params (tests pass one).
    """
    t0 = time.perf_counter()
    if model not in p.models:
        raise PipelineError(f"evaluate: unknown model {model!r}; evaluate.models has {sorted(p.models)}")
    m, c = p.models[model], p.common
    resolve_model(m.path)  # one-line error when the model directory is missing
    benchmarks = load_benchmarks(c, m.limit)
    runs = plan_runs(m, benchmarks)
    tool_modes = sorted({r.mode for r in runs} & {"pot", "tir"})
    reduced = sandbox.require_isolation(f"evaluate@{model} ({'/'.join(tool_modes)})") if tool_modes else None
    sft_file = paths.problems_file("sft")
    need_shots = m.prompting == "few_shot" and any(r.family == "generated" for r in runs) and c.n_shots > 0
    data_files = [benchmark_file(c, name) for name in benchmarks] + ([sft_file] if need_shots else [])
    ckpt_dir = paths.CHECKPOINTS / "evaluate" / fingerprint(model, m, c, data_files)
    threads.use(c.num_threads)  # at most num_threads, fewer while other work competes (stages/core/threads.py)
    own_generator = generator is None
    if generator is None:
        generator = make_generator(c, m.path, rows=c.batch_size * (m.n_samples if m.sample_modes else 1))
    settings = LoopSettings(c.batch_size, c.max_new_tokens, c.temperature, c.top_p, c.seed, c.tir_max_rounds,
                            c.exec_timeout_s, c.exec_workers, c.checker.headline, c.checker.timeout_s,
                            c.checker.math_verify)

    metrics: dict[str, Any] = {"model": model, "prompting": m.prompting, "checker": checker_record(c),
                               "seeds": {"sampling": c.seed, "maj_subsets": c.seed}}
    if reduced:
        metrics["sandbox"] = reduced
    if own_generator:  # the dtype and backend ``auto`` resolved to on this machine (stages/core/hardware.py)
        metrics["hardware"] = generation_record(c.dtype, resolve_dtype(c.dtype), generation.resolve_backend(c.backend))
    outputs: dict[str, list[dict[str, Any]]] = {}
    prompt_examples: list[str] = []
    resumed_total = 0
    gen_tokens = 0
    for spec in runs:
        records, resumed, summary, example = _evaluate_run(model, m, c, spec, benchmarks[spec.benchmark], sft_file,
                                                           generator, settings, ckpt_dir)
        prompt_examples.append(example)
        resumed_total += resumed
        gen_tokens += sum(x["n_tokens"] for r in records for x in r["completions"])
        outputs[spec.name] = records
        metrics.setdefault(spec.benchmark, {}).setdefault(spec.mode, {})[spec.decoding] = summary
    with atomic_path(paths.eval_dir(model)) as tmp:
        tmp.mkdir(parents=True)
        for name, records in outputs.items():
            with open(tmp / f"{name}.jsonl", "w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        (tmp / "prompts.txt").write_text("\n\n".join(prompt_examples) + "\n", encoding="utf-8")
    write_plots(model, metrics)
    metrics["resumed_problems"] = resumed_total
    metrics["generated_tokens"] = gen_tokens
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    write_metrics(f"evaluate_{model}", metrics, ["model", "checker.headline", "checker.version", "*.greedy.acc",
                                                 "*.greedy.acc_se", "*.greedy.exec_ok", "*.sample.avg@*",
                                                 "*.sample.pass@*", "*.sample.maj@*", "hardware", "sandbox"])
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return metrics


def _evaluate_run(model: str, m: EvalModelParams, c: EvalCommonParams, spec: RunSpec, problems: list[Problem],
                  sft_file: Path, generator: Any, settings: LoopSettings, ckpt_dir: Path
                  ) -> tuple[list[dict[str, Any]], int, dict[str, Any], str]:
    """One run (benchmark, mode, decoding) of the model: (its records, problems resumed from ``ckpt_dir``, its
    summary with the prompt template's hash, the sampling settings and its wall time, its first prompt)."""
    if spec.decoding == "sample" and c.sample_limit is not None:
        problems = problems[: c.sample_limit]
    exemplars = (fewshot_exemplars(sft_file, c.n_shots, spec.mode, c.seed)
                 if m.prompting == "few_shot" and spec.family == "generated" else None)
    example = (f"===== {spec.name} =====\n"
               f"{build_prompt(problems[0], spec.mode, m.prompting, exemplars, generator_format(generator))}")
    template = build_prompt(Problem("template", spec.family, "{question}", None, None), spec.mode, m.prompting,
                            exemplars, generator_format(generator))  # the run's template: its hash is recorded
    t_run = time.perf_counter()
    records, resumed = run_one(generator, problems, spec, settings, m.prompting, exemplars,
                               ckpt_dir / f"{spec.name}.jsonl", progress=_progress(f"{model}:{spec.name}"))
    summary = summarize(records, spec, c)
    summary["prompt_sha256"] = hashlib.sha256(template.encode()).hexdigest()[:16]
    summary["sampling"] = sampling_record(spec, settings, m.prompting)
    summary["wall_s"] = round(time.perf_counter() - t_run, 2)
    return records, resumed, summary, example


def checker_record(c: EvalCommonParams) -> dict[str, Any]:
    """What judged the answers: the headline and report modes, the checker's version, the deadline, math-verify's
    version (every result file records it)."""
    try:
        from importlib.metadata import version

        mv = version("math-verify")
    except Exception:  # noqa: BLE001 - not installed: recorded as such
        mv = None
    return {"headline": c.checker.headline, "report": c.checker.report, "version": CHECKER_VERSION,
            "timeout_s": c.checker.timeout_s, "math_verify": mv if c.checker.math_verify else None}


def sampling_record(spec: RunSpec, s: LoopSettings, prompting: str) -> dict[str, Any]:
    """The decoding parameters of one run (greedy: temperature 0), with its stop strings and seed."""
    from stages.evaluate.benchmarks import stop_strings

    greedy = spec.decoding == "greedy"
    return {"temperature": 0.0 if greedy else s.temperature, "top_p": 1.0 if greedy else s.top_p, "n": spec.n,
            "max_new_tokens": s.max_new_tokens, "seed": s.seed, "stop": list(stop_strings(spec.family, spec.mode,
                                                                                         prompting)),
            "tir_max_rounds": s.tir_max_rounds if spec.mode == "tir" else None}


def write_plots(model: str, metrics: dict[str, Any]) -> None:
    """dvc plots under data/plots/evaluate/<model>/: per sampled run ``<bench>_<mode>_at_k.tsv`` (k,
    pass_at_k, maj_at_k); per greedy run ``<bench>_<mode>_greedy_by_difficulty.tsv`` (difficulty, acc, n)."""
    out_dir = paths.plots_dir("evaluate") / model
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        for bench, modes in metrics.items():
            if not isinstance(modes, dict):
                continue
            for mode, decs in modes.items():
                if not isinstance(decs, dict):
                    continue
                if "sample" in decs:
                    s = decs["sample"]
                    write_table(tmp / f"{bench}_{mode}_at_k.tsv", ({"k": k, "pass_at_k": s[f"pass@{k}"],
                                "maj_at_k": s[f"maj@{k}"]} for k in default_ks(s["n_samples"])),
                                ["k", "pass_at_k", "maj_at_k"])
                if "greedy" in decs:
                    write_table(tmp / f"{bench}_{mode}_greedy_by_difficulty.tsv",
                                ({"difficulty": d, **v} for d, v in decs["greedy"]["by_difficulty"].items()),
                                ["difficulty", "acc", "n"])


def _progress(label: str) -> Any:
    """Progress lines of one evaluation run (every 5 s and at the end): problems done, problems per second, the cores
    this process used and the load average since the previous line (stages.core.progress)."""
    last = [0.0, 0]
    live = Throughput()

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] > 5.0:
            rate = live.tick(done - last[1])
            last[0], last[1] = now, done
            print(f"[evaluate] {label}: {done}/{total} problems ({describe(rate, 'problems')})", file=sys.stderr,
                  flush=True)

    return report

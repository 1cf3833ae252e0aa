"""The report's content: the headline table, the paper beside ours, the per-stage key metrics; written out as the
HTML page (:func:`html_page`), the markdown summary (:func:`markdown_summary`, also the Prefect artifact) and
the console lines (:func:`headline_lines`).

Every value goes through :func:`stages.report.inputs.get` / :func:`~stages.report.inputs.num`, so an absent
stage, metric or key shows as "not run" (or "—" for one value), never as an error.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from stages.report import figures, paper
from stages.report.inputs import STAGES, Inputs, get, mapping, num, seq
from stages.report.uncertainty import Comparison, comparisons, find, interval_text, verifier_rows

NOT_RUN = "not run"
DASH = "—"
TIMINGS_NOTE = ("Wall times, throughputs and peak memory of the run are not on this page, which is the same bytes for "
                "the same inputs (DVC caches it): they are in data/timings/<stage>.json, written by each stage's run "
                "(docs/pipeline.md#what-a-run-writes-and-what-the-run-cache-restores).")


# ---------------------------------------------------------------------------------------------
# formatting


def fmt(v: Any) -> str:
    """One value for a table cell: numbers to 3-4 significant places, dicts as ``k: v``, None as a dash."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v.is_integer() and abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:,.1f}"
        return f"{v:.4g}" if abs(v) >= 1 or v == 0 else f"{v:.3g}" if abs(v) < 0.001 else f"{v:.3f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) or DASH
    if isinstance(v, list):
        s = ", ".join(fmt(x) for x in v[:8])
        return f"[{s}{', …' if len(v) > 8 else ''}]"
    return str(v)


def acc(v: Any) -> str:
    """An accuracy in [0, 1] with three decimals (a dash when absent)."""
    x = num(v)
    return DASH if x is None else f"{x:.3f}"


def acc_se(v: Any, se: Any) -> str:
    """An accuracy with its standard error: ``0.506 ± 0.022`` (the accuracy alone when there is no SE)."""
    x, e = num(v), num(se)
    return acc(v) if x is None or e is None else f"{x:.3f} ± {e:.3f}"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested metrics as ``{"a.b": value}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    if not isinstance(d, dict):
        return out
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# ---------------------------------------------------------------------------------------------
# the headline: held-out accuracy per model


@dataclass(frozen=True)
class HeadRow:
    """One row of the headline table: a model on one benchmark (``benchmark`` None: the model was not run)."""

    model: str
    prompting: str | None
    benchmark: str | None
    cot: float | None
    pot: float | None
    tir: float | None
    k: int | None
    pass_k: float | None
    maj_k: float | None
    cot_se: float | None = None
    pass_se: float | None = None
    maj_se: float | None = None


BENCHMARK_ORDER = ("generated", "gsm8k", "math")


def benchmarks_of(m: dict[str, Any] | None) -> list[str]:
    """The benchmarks in one model's evaluate metrics (generated, gsm8k, math first, then others)."""
    found = [k for k, v in (m or {}).items() if isinstance(v, dict) and any(
        isinstance(get(v, f"{mode}.greedy"), dict) or isinstance(get(v, f"{mode}.sample"), dict) for mode in v)]
    return sorted(found, key=lambda b: (BENCHMARK_ORDER.index(b) if b in BENCHMARK_ORDER else len(BENCHMARK_ORDER), b))


def headline(inputs: Inputs) -> list[HeadRow]:
    """Held-out accuracy per model (the models of ``report.models``, in order) and benchmark."""
    out = []
    for model, m in inputs.evaluate.items():
        benches = benchmarks_of(m)
        if not benches:
            out.append(HeadRow(model, None, None, None, None, None, None, None, None))
        for b in benches:
            s = get(m, f"{b}.cot.sample")
            k = int(s["n_samples"]) if isinstance(s, dict) and num(s.get("n_samples")) else None
            out.append(HeadRow(
                model, get(m, "prompting"), b, num(get(m, f"{b}.cot.greedy.acc")), num(get(m, f"{b}.pot.greedy.acc")),
                num(get(m, f"{b}.tir.greedy.acc")), k, num(get(s, f"pass@{k}")) if k else None,
                num(get(s, f"maj@{k}")) if k else None, num(get(m, f"{b}.cot.greedy.acc_se")),
                num(get(s, f"pass@{k}_se")) if k else None, num(get(s, f"maj@{k}_se")) if k else None))
    return out


HEAD_COLUMNS = ("model", "stands for", "prompting", "benchmark", "CoT greedy", "PoT greedy", "TIR greedy",
                "CoT pass@k", "CoT maj@k")


def _head_cells(r: HeadRow) -> list[str]:
    if r.benchmark is None:
        return [r.model, paper.MODEL_NAMES.get(r.model, ""), NOT_RUN, "", "", "", "", "", ""]
    kk = f" (k={r.k})" if r.k else ""
    return [r.model, paper.MODEL_NAMES.get(r.model, ""), (r.prompting or DASH).replace("_", "-"), r.benchmark,
            acc_se(r.cot, r.cot_se), acc(r.pot), acc(r.tir), acc_se(r.pass_k, r.pass_se) + (kk if r.pass_k is not None else ""),
            acc_se(r.maj_k, r.maj_se) + (kk if r.maj_k is not None else "")]


def headline_lines(inputs: Inputs, report_path: str | None) -> list[str]:
    """The console summary: held-out accuracy per model (fixed-width), then where the report is."""
    head = ["model", "benchmark", "CoT", "PoT", "TIR", "pass@k", "maj@k"]
    rows = []
    for r in headline(inputs):
        if r.benchmark is None:
            rows.append([r.model, NOT_RUN, "", "", "", "", ""])
        else:
            rows.append([r.model, r.benchmark, acc(r.cot), acc(r.pot), acc(r.tir), acc(r.pass_k), acc(r.maj_k)])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = ["held-out accuracy per model (greedy; pass@k / maj@k from sampling):", line.format(*head)]
    out += [line.format(*r).rstrip() for r in rows]
    if report_path:
        out.append(f"report: {report_path}")
    return out


# ---------------------------------------------------------------------------------------------
# the paper beside ours


@dataclass(frozen=True)
class PaperRow:
    """One line of the comparison: what the paper reports and what we measured (``ours`` None: not run)."""

    what: str
    paper: str
    source: str
    ours: str | None
    note: str


@dataclass(frozen=True)
class AccCell:
    """One cell of the accuracy comparison: the paper's percent and ours (None: not run); ``stand_in`` when ours
    is on the generated test problems because no GSM8K file was evaluated."""

    paper: float
    ours: float | None
    stand_in: bool
    n: Any


ACC_COLUMNS = (("gsm8k", "cot"), ("math", "cot"), ("gsm8k", "tool"), ("math", "tool"))
"""The comparison's columns; "tool" is PoT for the base model (Table 3) and tool-integrated for the others."""


def report_mode(inputs: Inputs) -> str | None:
    """The checker mode whose accuracies are set beside the paper's (``evaluate.common.checker.report``, recorded
    in every evaluation's details), or None for evaluations older than the checker modes."""
    for m in inputs.evaluate.values():
        r = get(m, "checker.report")
        if isinstance(r, str):
            return r
    return None


def greedy_acc(m: dict[str, Any] | None, path: str, mode: str | None) -> float | None:
    """A greedy run's accuracy (``path``: ``<benchmark>.<mode>``) under checker ``mode`` (its verifier table), or
    the headline accuracy when the run has no verdict of that mode."""
    v = num(get(m, f"{path}.greedy.verifiers.{mode}.acc")) if mode else None
    return v if v is not None else num(get(m, f"{path}.greedy.acc"))


def _our_accuracy(inputs: Inputs, a: paper.Accuracy) -> AccCell:
    m = inputs.evaluate.get(a.model)
    mode = report_mode(inputs)
    v = greedy_acc(m, f"{a.benchmark}.{a.mode}", mode)
    if v is not None:
        return AccCell(a.percent, 100 * v, False, get(m, f"{a.benchmark}.{a.mode}.greedy.n"))
    if a.benchmark == "gsm8k":  # the tiny default's word problems stand in for GSM8K (marked)
        v = greedy_acc(m, f"generated.{a.mode}", mode)
        if v is not None:
            return AccCell(a.percent, 100 * v, True, get(m, f"generated.{a.mode}.greedy.n"))
    return AccCell(a.percent, None, False, None)


def accuracy_table(inputs: Inputs) -> list[tuple[str, str, list[AccCell | None]]]:
    """(row label, sources, cells in :data:`ACC_COLUMNS` order) per paper model: the paper's top-1 accuracy
    (stages/report/paper.py) beside ours for the same benchmark and prompting mode."""
    out = []
    for model in paper.MODEL_NAMES:
        entries = [a for a in paper.ACCURACIES if a.model == model]
        cells: list[AccCell | None] = []
        for bench, kind in ACC_COLUMNS:
            a = next((a for a in entries if a.benchmark == bench and (a.mode == "cot") == (kind == "cot")), None)
            cells.append(None if a is None else _our_accuracy(inputs, a))
        sources = ", ".join(dict.fromkeys(a.source for a in entries))
        tool = next((a.mode for a in entries if a.mode != "cot"), "tir")
        out.append((f"{paper.MODEL_NAMES[model]} ↔ {model} (tool = {tool.upper()})", sources, cells))
    return out


def _acc_cell_text(c: AccCell | None) -> tuple[str, str]:
    if c is None:
        return DASH, DASH
    return f"{c.paper:.1f}", NOT_RUN if c.ours is None else f"{c.ours:.1f}{'†' if c.stand_in else ''}"


STAND_IN_NOTE = ("† on the generated test problems (GSM8K-like word problems made by the data stage, not GSM8K): "
                 "this run evaluated no GSM8K test set (evaluate.common.benchmarks).")


def _pick(evals: dict[str, Any], model: str, bench_first: Sequence[str], path: str) -> tuple[float | None, str | None]:
    for b in bench_first:
        v = num(get(evals.get(model), f"{b}.{path}"))
        if v is not None:
            return v, b
    return None, None


def paper_rows(inputs: Inputs, comps: list[Comparison] | None = None) -> list[PaperRow]:
    """The paper's findings (stages/report/paper.py) beside what we measured (with the paired bootstrap interval
    of each model comparison, ``comps``)."""
    comps = comps if comps is not None else comparisons(inputs.evaluate)
    return (_rl_rows(inputs.evaluate, comps) + _corpus_rows(inputs.metrics.get("corpus"))
            + [_reward_model_row(inputs.metrics.get("reward_model"))] + _paradigm_rows(inputs))


def _rl_rows(ev: dict[str, Any], comps: list[Comparison]) -> list[PaperRow]:
    """RL over SFT (CoT greedy, on the same benchmark) and Figure 7 (maj@K against pass@K gain of RL over SFT)."""
    out, c = [], paper.CLAIMS
    cot_s, b1 = _pick(ev, "sft", ("gsm8k", "generated"), "cot.greedy.acc")
    cot_g, b2 = _pick(ev, "grpo", (b1,) if b1 else (), "cot.greedy.acc")
    ours = None if cot_s is None or cot_g is None else f"{100 * (cot_g - cot_s):+.1f} points"
    cmp = find(comps, "sft", "grpo", b2, "cot greedy", "acc")
    if ours and cmp is not None:
        ours = interval_text(cmp)
    out.append(PaperRow("RL over SFT (CoT greedy)", c["rl_gain"].text, c["rl_gain"].source, ours,
                        f"grpo - sft on {b2}, paired bootstrap over problems" if ours else
                        "needs evaluate@sft and evaluate@grpo"))
    ours, note = None, "needs sampled CoT runs of sft and grpo"
    for b in ("gsm8k", "generated", "math"):
        s, g = get(ev.get("sft"), f"{b}.cot.sample"), get(ev.get("grpo"), f"{b}.cot.sample")
        k = num(get(s, "n_samples"))
        if isinstance(s, dict) and isinstance(g, dict) and k:
            k = int(k)
            dp = (num(get(g, f"pass@{k}")), num(get(s, f"pass@{k}")))
            dm = (num(get(g, f"maj@{k}")), num(get(s, f"maj@{k}")))
            if None not in dp + dm:
                gp, gm = dp[0] - dp[1], dm[0] - dm[1]
                ours = f"maj@{k} {gm:+.3f}, pass@{k} {gp:+.3f}"
                cm, cp = (find(comps, "sft", "grpo", b, "cot sample", f"{x}@{k}") for x in ("maj", "pass"))
                if cm is not None and cp is not None:
                    ours = (f"maj@{k} {gm:+.3f} [{cm.lo:+.3f}, {cm.hi:+.3f}], pass@{k} {gp:+.3f} "
                            f"[{cp.lo:+.3f}, {cp.hi:+.3f}] (95% CIs)")
                note = f"grpo - sft on {b}, T = {get(s, 'temperature')}; maj@k " + (
                    "gains more than pass@k" if gm > gp else "does not gain more than pass@k")
                break
    out.append(PaperRow("pass@k vs maj@k", c["maj_not_pass"].text, c["maj_not_pass"].source, ours, note))
    return out


def _corpus_rows(cm: Any) -> list[PaperRow]:
    """The corpus's collection rounds and size."""
    c = paper.CLAIMS
    rounds = [r for r in seq(get(cm, "rounds")) if isinstance(r, dict)]
    last_ov = num(rounds[-1].get("overlap_with_previous")) if rounds else None
    ours = None if cm is None else f"{fmt(get(cm, 'rounds_run'))} rounds" + (
        f"; last round {last_ov:.1%} already collected" if last_ov is not None else "")
    size = None if cm is None else f"{fmt(get(cm, 'math_pages'))} pages, {fmt(get(cm, 'math_tokens'))} tokens"
    return [PaperRow("corpus collection rounds", c["corpus_rounds"].text, c["corpus_rounds"].source, ours,
                     "overlap of a round's collection with the previous round's"),
            PaperRow("math corpus size", c["corpus_size"].text, c["corpus_size"].source, size,
                     "tiny default: a generated crawl")]


def _reward_model_row(rm: Any) -> PaperRow:
    """The reward model's held-out AUCs and best-of-n."""
    c = paper.CLAIMS
    o, s = num(get(rm, "heldout.outcome_auc")), num(get(rm, "heldout.step_auc"))
    ours = None if rm is None else f"outcome AUC {fmt(o)}, step AUC {fmt(s)}"
    bon = get(rm, "best_of_n")
    if isinstance(bon, dict) and num(bon.get("rm_last")) is not None:
        ours += (f"; best-of-{fmt(bon.get('n'))} {fmt(bon.get('rm_last'))} vs a random sample's "
                 f"{fmt(bon.get('random'))}")
    return PaperRow("reward model quality", c["rm_auc"].text, c["rm_auc"].source, ours, "held-out questions")


def _paradigm_rows(inputs: Inputs) -> list[PaperRow]:
    """Figure 5 (the unified paradigm, with exact and with learned rewards) and Figure 6 (iterative RL), from the
    committed benchmark results."""
    out, c = [], paper.CLAIMS
    for kind, label in (("exact", "rule reward / exact step labels"), ("reward_model", "learned reward models")):
        src, name = inputs.paradigm, "paradigm.json"
        if kind == "reward_model" and isinstance(get(inputs.paradigm_rm, f"comparison.{kind}"), dict):
            src, name = inputs.paradigm_rm, "paradigm_rm.json"  # the comparison run for the learned RMs
        comp = get(src, f"comparison.{kind}")
        if isinstance(comp, dict) and isinstance(comp.get("measured_order"), list):
            ours = " > ".join(str(x) for x in comp["measured_order"])
            note = (f"{fmt(comp.get('pairs_agreeing'))} of {fmt(comp.get('n_pairs'))} pairs in the paper's order "
                    f"({fmt(comp.get('pairs_clear_agreeing'))} beyond seed spread); {paradigm_source(src, name)}")
        else:
            ours, note = None, "benchmarks/paradigm.py result absent"
        out.append(PaperRow(f"unified paradigm, {label}", c["paradigm_order"].text, c["paradigm_order"].source,
                            ours, note))
    it = iterative_series(inputs.iterative)
    if it:
        parts = [f"{k}: " + " → ".join(f"{sum(s[j] for s in v) / len(v):.3f}" for j in range(min(map(len, v))))
                 for k, v in it.items()]
        ours = "; ".join(parts)
        note = ("held-out accuracy per iteration (0 = SFT), mean over seeds; benchmarks/results/iterative_rl.json"
                f" (measured {str(get(inputs.iterative, 'measured_at'))[:10]}; its setup in the Comparisons section)")
    else:
        ours, note = None, "benchmarks/results/iterative_rl.json absent"
    out.append(PaperRow("iterative RL", c["iterative"].text, c["iterative"].source, ours, note))
    return out


def paradigm_source(d: dict[str, Any] | None, name: str = "paradigm.json") -> str:
    """Where a committed comparison result came from (its file, seeds and date)."""
    bits = [f"seeds {fmt(d.get('seeds'))}" if d and d.get("seeds") else "",
            f"measured {str(d.get('measured_at'))[:10]}" if d and d.get("measured_at") else ""]
    return f"benchmarks/results/{name}" + (f" ({', '.join(b for b in bits if b)})" if any(bits) else "")


def iterative_series(d: dict[str, Any] | None) -> dict[str, list[list[float]]]:
    """{supervision: [per seed: held-out accuracy at iteration 0 (the SFT model), 1, 2, ...]} from
    benchmarks/results/iterative_rl.json (``runs[].accuracy_per_iteration``, ``sft_accuracy``); {} when absent or
    in another format."""
    runs = get(d, "runs")
    if not isinstance(runs, list):
        return {}
    start = num(get(d, "sft_accuracy"))
    out: dict[str, list[list[float]]] = {}
    for r in runs:
        accs = get(r, "accuracy_per_iteration")
        if not isinstance(accs, list) or not accs or any(num(a) is None for a in accs):
            continue
        series = ([start] if start is not None else []) + [float(a) for a in accs]
        out.setdefault(str(get(r, "supervision") or get(r, "name") or "run"), []).append(series)
    return out


# ---------------------------------------------------------------------------------------------
# per-stage key metrics


@dataclass(frozen=True)
class Key:
    """A key metric: a label and one or more dotted paths into the stage's metrics (shown joined by ``sep``)."""

    label: str
    paths: tuple[str, ...]
    sep: str = " / "


def K(label: str, *paths_: str, sep: str = " / ") -> Key:  # noqa: N802 (a table row constructor)
    """Shorthand for :class:`Key`."""
    return Key(label, paths_, sep)


ARROW = " → "
KEYS: dict[str, tuple[Key, ...]] = {
    "data": (K("problems: sft / rl / test", "problems.sft", "problems.rl", "problems.test"),
             K("crawl pages / math pages", "crawl.pages", "crawl.math_pages"),
             K("crawl domains", "crawl.domains"), K("seed (OpenWebMath stand-in) pages", "crawl.seed_pages"),
             K("planted near-duplicates / contaminated pages", "crawl.near_dup_pages", "crawl.contaminated_pages")),
    "corpus": (K("pages in", "pages_in"), K("recall rounds", "rounds_run"),
               K("math corpus: pages / tokens", "math_pages", "math_tokens"), K("general text pages", "general_pages"),
               K("duplicates removed: exact / near", "duplicates_removed.exact", "duplicates_removed.near"),
               K("contaminated pages removed", "contaminated_removed"),
               K("problems removed (decontamination): sft / rl", "problems_removed.sft", "problems_removed.rl")),
    "base_model": (K("mode", "mode"), K("parameters", "n_params"), K("vocabulary", "vocab_size")),
    "pretrain": (K("steps", "steps"), K("tokens", "tokens"),
                 K("train loss: first → last", "train_loss_first", "train_loss_last", sep=ARROW),
                 K("held-out loss: before → after", "eval_loss_before", "eval_loss_after", sep=ARROW),
                 K("held-out perplexity: before → after", "perplexity_before", "perplexity_after", sep=ARROW),
                 K("tokens per source", "mixture_tokens"), K("precision", "precision")),
    "sft": (K("steps", "steps"), K("training examples", "train_examples"), K("kept per format", "kept"),
            K("dropped (answer not verified)", "dropped_unverified"),
            K("train loss: first → last", "train_loss_first", "train_loss_last", sep=ARROW),
            K("validation loss: before → best", "val_loss_before", "val_loss_best", sep=ARROW)),
    "reward_model": (K("init", "init"), K("training / held-out examples", "n_train_examples", "n_heldout_examples"),
                     K("held-out AUC: outcome / outcome within a question / step / step vs exact labels",
                       "outcome_auc", "heldout.outcome_auc_within", "step_auc", "step_auc_values"),
                     K("best-of-n on held-out questions: n / RM pick / random pick / majority / pass@n", "best_of_n.n",
                       "best_of_n.rm_last", "best_of_n.random", "best_of_n.majority", "best_of_n.oracle"),
                     K("loss per epoch", "loss_per_epoch")),
    "grpo": (K("algorithm", "algorithm"), K("steps", "grpo.steps"),
             K("reward: first 5 → last 5 steps", "grpo.reward_mean_first5", "grpo.reward_mean_last5", sep=ARROW),
             K("sampled accuracy: first 5 → last 5", "grpo.accuracy_first5", "grpo.accuracy_last5", sep=ARROW),
             K("KL: first 5 → last 5", "grpo.kl_first5", "grpo.kl_last5", sep=ARROW),
             K("completion tokens: first 5 → last 5", "grpo.completion_len_first5", "grpo.completion_len_last5",
               sep=ARROW),
             K("groups with zero reward spread: first 5 → last 5", "grpo.zero_std_frac_first5",
               "grpo.zero_std_frac_last5", sep=ARROW),
             K("held-out accuracy: first → last", "heldout.first", "heldout.last", sep=ARROW),
             K("continued-SFT baseline loss: first → last", "baseline.sft_loss_first", "baseline.sft_loss_last",
               sep=ARROW)),
}
TITLES = {"data": "Data: generated crawl, seed corpus, word problems",
          "corpus": "Corpus: the math corpus (paper §2.1)",
          "base_model": "Base model: tokenizer and initial model",
          "pretrain": "Pretrain: continual pretraining (paper §2.3)",
          "sft": "SFT: CoT / PoT / tool-integrated solutions (paper §3)",
          "reward_model": "Reward model: outcome / process (paper §4.1.3-4.1.4)",
          "grpo": "GRPO (paper §4) and the continued-SFT baseline",
          "evaluate": "Evaluate: every model (paper Table 5, Figure 7)",
          "comparisons": "Comparisons: unified paradigm (paper Figure 5), iterative RL (Figure 6)"}


def key_rows(stage: str, m: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) of a stage's key metrics; a metric the stage did not write shows a dash."""
    out = []
    for k in KEYS.get(stage, ()):
        vals = [get(m, p) for p in k.paths]
        out.append((k.label, DASH if all(v is None for v in vals) else k.sep.join(fmt(v) for v in vals)))
    return out


def auc_rows(m: dict[str, Any] | None) -> list[list[str]]:
    """The reward model's quality: one row per block of AUCs in its metrics (held-out, before training, train,
    and any other block holding ``*_auc`` keys), columns outcome / step AUC, then any other AUC, counts."""
    out = []
    for name, block in (m or {}).items():
        if not isinstance(block, dict) or not any(str(k).endswith("_auc") for k in block):
            continue
        aucs = [k for k in block if str(k).endswith("_auc")]
        other = ", ".join(f"{k}: {fmt(block[k])}" for k in aucs if k not in ("outcome_auc", "step_auc"))
        out.append([name, fmt(block.get("outcome_auc")), fmt(block.get("step_auc")), other or DASH,
                    fmt(block.get("n_examples")), fmt(block.get("n_steps"))])
    return out


def stage_summary(stage: str, m: dict[str, Any] | None) -> str:
    """One line of a stage's main result for the overview table."""
    if m is None:
        return ""
    g = {"data": lambda: f"{fmt(get(m, 'problems.test'))} test problems, {fmt(get(m, 'crawl.pages'))} crawl pages",
         "corpus": lambda: f"{fmt(get(m, 'math_pages'))} math pages in {fmt(get(m, 'rounds_run'))} rounds",
         "base_model": lambda: f"{fmt(get(m, 'n_params'))} parameters ({fmt(get(m, 'mode'))})",
         "pretrain": lambda: f"held-out loss {fmt(get(m, 'eval_loss_before'))} → {fmt(get(m, 'eval_loss_after'))}",
         "sft": lambda: f"validation loss {fmt(get(m, 'val_loss_before'))} → {fmt(get(m, 'val_loss_best'))}",
         "reward_model": lambda: f"held-out AUC outcome {fmt(get(m, 'heldout.outcome_auc'))}, "
                                 f"step {fmt(get(m, 'heldout.step_auc'))}",
         "grpo": lambda: f"{fmt(get(m, 'grpo.steps'))} steps, reward {fmt(get(m, 'grpo.reward_mean_first5'))} → "
                         f"{fmt(get(m, 'grpo.reward_mean_last5'))}"}.get(stage)
    return g() if g else ""


def overview_rows(inputs: Inputs) -> list[list[str]]:
    """Stage | status | main result, for every stage and evaluated model (no wall time: the page is the same bytes
    for the same inputs; the run's timings are in data/timings/, :data:`TIMINGS_NOTE`)."""
    rows = []
    for s in STAGES:
        m = inputs.metrics.get(s)
        rows.append([s, "ran" if m is not None else NOT_RUN, stage_summary(s, m)])
    for model, m in inputs.evaluate.items():
        cot = num(get(m, "generated.cot.greedy.acc"))
        rows.append([f"evaluate@{model}", "ran" if m is not None else NOT_RUN,
                     "" if m is None else f"CoT greedy {acc(cot)}" if cot is not None else ""])
    return rows


# ---------------------------------------------------------------------------------------------
# markdown (the Prefect artifact and data/report/summary.md)


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, r)) + " |" for r in rows])


def _any_stand_in(inputs: Inputs) -> bool:
    return any(c is not None and c.stand_in for _, _, cells in accuracy_table(inputs) for c in cells)


def markdown_summary(title: str, inputs: Inputs, report_path: str, comps: list[Comparison] | None = None) -> str:
    """The report's summary as markdown: headline, the model comparisons, the verifier table, the paper beside ours,
    the stages."""
    comps = comps if comps is not None else comparisons(inputs.evaluate)
    return "\n\n".join([
        f"# {title}",
        f"Full report (self-contained HTML): `{report_path}`",
        "## Held-out accuracy per model",
        _md_table(HEAD_COLUMNS, [_head_cells(r) for r in headline(inputs)]),
        checker_note(inputs) + "; ± one standard error over problems.",
        "## Model comparisons (paired bootstrap over problems, 95% intervals)",
        _md_table(COMPARISON_COLUMNS, comparison_rows(comps)) if comps else NOT_RUN,
        "## Verifier sensitivity",
        _md_table(VERIFIER_COLUMNS, verifier_table_rows(inputs)) if verifier_table_rows(inputs) else NOT_RUN,
        f"## The paper beside ours ({paper.PAPER})",
        "Top-1 greedy accuracy, percent (paper / ours):",
        _md_table(["model", "source"] + [f"{b.upper()} {k}" for b, k in ACC_COLUMNS],
                  [[label, src] + [" / ".join(_acc_cell_text(c)) for c in cells]
                   for label, src, cells in accuracy_table(inputs)]),
        STAND_IN_NOTE if _any_stand_in(inputs) else "",
        _md_table(("finding", "paper", "source", "ours", "our measurement"),
                  [(r.what, r.paper, r.source, r.ours or NOT_RUN, r.note) for r in paper_rows(inputs, comps)]),
        "## Stages",
        _md_table(("stage", "status", "result"), overview_rows(inputs)),
        TIMINGS_NOTE,
    ]).replace("\n\n\n\n", "\n\n") + "\n"


# ---------------------------------------------------------------------------------------------
# HTML

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg-alt: #f5f7fa; --accent: #1f5fbf; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg);
       margin: 0; background: #fff; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 16px; margin: 20px 0 8px; }
p.sub, .note { color: var(--muted); }
p.sub { margin: 0 0 12px; }
nav { font-size: 13px; margin: 8px 0 4px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 12px; white-space: nowrap; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: var(--bg-alt); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.model-sep td { border-top: 2px solid #b8bfcc; }
table.head td.num { font-size: 15px; }
.na { color: #8a6d00; background: #fff8e1; }
td.paper { color: var(--muted); }
.badge { display: inline-block; font-size: 12px; padding: 1px 8px; border-radius: 10px; margin-left: 8px;
         vertical-align: middle; font-weight: 500; }
.badge.ok { background: #e3f4e8; color: #1e6b35; }
.badge.na { background: #fff3cd; color: #8a6d00; }
img { max-width: 100%; height: auto; display: block; margin: 8px 0; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--accent); font-size: 14px; }
details table, table.small { font-size: 12.5px; }
code { background: var(--bg-alt); padding: 0 4px; border-radius: 3px; font-size: 13px; }
"""


def esc(x: Any) -> str:
    """HTML-escaped text."""
    return html.escape(str(x), quote=True)


def _cell(x: str, numeric: bool = False) -> str:
    cls = "na" if x == NOT_RUN else "num" if numeric else ""
    return f'<td class="{cls}">{esc(x)}</td>' if cls else f"<td>{esc(x)}</td>"


def html_table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = (),
               cls: str = "", row_classes: Sequence[str] | None = None) -> str:
    """An HTML table; columns ``numeric`` right-aligned, "not run" cells marked."""
    out = [f'<table class="{cls}">' if cls else "<table>", "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for i, r in enumerate(rows):
        rc = row_classes[i] if row_classes else ""
        out.append((f'<tr class="{rc}">' if rc else "<tr>") + "".join(
            _cell(x, j in numeric) for j, x in enumerate(r)) + "</tr>")
    return "\n".join(out + ["</table>"])


def accuracy_html(inputs: Inputs) -> str:
    """The paper's accuracies beside ours: one row per paper model, a paper / ours column pair per benchmark."""
    out = ['<table class="acc"><tr><th rowspan="2">paper model ↔ ours</th><th rowspan="2">source</th>'
           + "".join(f'<th colspan="2">{esc(b.upper())} {esc(k)}</th>' for b, k in ACC_COLUMNS) + "</tr>",
           "<tr>" + "<th>paper</th><th>ours</th>" * len(ACC_COLUMNS) + "</tr>"]
    for label, src, cells in accuracy_table(inputs):
        tds = []
        for c in cells:
            p_, o = _acc_cell_text(c)
            tds.append(f'<td class="num paper">{esc(p_)}</td>' + _cell(o, numeric=True))
        out.append(f"<tr><td>{esc(label)}</td><td>{esc(src)}</td>{''.join(tds)}</tr>")
    out.append("</table>")
    if _any_stand_in(inputs):
        out.append(f'<p class="note">{esc(STAND_IN_NOTE)}</p>')
    return "\n".join(out)


def img(uri: str | None, alt: str) -> str:
    """An inlined figure, or a "not run" line when there is nothing to plot."""
    if uri is None:
        return f'<p class="na">{esc(alt)}: {NOT_RUN}</p>'
    return f'<img src="{uri}" alt="{esc(alt)}">'


def badge(ran: bool) -> str:
    """The status badge next to a section title."""
    if not ran:
        return f'<span class="badge na">{NOT_RUN}</span>'
    return '<span class="badge ok">ran</span>'


def all_metrics(m: dict[str, Any] | None, label: str) -> str:
    """Every metric of a file in a collapsed table."""
    if not m:
        return ""
    rows = [[k, fmt(v)] for k, v in flatten(m).items()]
    return f"<details><summary>all metrics of {esc(label)} ({len(rows)})</summary>" + html_table(
        ("metric", "value"), rows) + "</details>"


def _not_run(stage: str, path: str) -> str:
    return (f'<p class="na">{NOT_RUN}: <code>{esc(path)}</code> is absent; <code>dvc repro {esc(stage)}</code> '
            "(or <code>python -m flows.pipeline</code>) produces it.</p>")


def _section(sid: str, title: str, ran: bool, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}{badge(ran)}</h2>\n{body}\n</section>'


def stage_section(stage: str, inputs: Inputs, extra: Callable[[], str] | None = None) -> str:
    """One stage's section: key metrics, its figures (``extra``), every metric collapsed."""
    m = inputs.metrics.get(stage)
    if m is None:
        return _section(stage, TITLES[stage], False, _not_run(stage, f"data/details/{stage}.json"))
    body = html_table(("key metric", "value"), key_rows(stage, m), numeric=(1,))
    if extra is not None:
        body += extra()
    body += all_metrics(m, f"data/details/{stage}.json")
    return _section(stage, TITLES[stage], True, body)


def _evaluate_section(inputs: Inputs) -> str:
    ev = {k: v for k, v in inputs.evaluate.items() if v is not None}
    ran = bool(ev)
    if not ran:
        return _section("evaluate", TITLES["evaluate"], False,
                        _not_run("evaluate", "data/details/evaluate_<model>.json"))
    body = []
    benches = sorted({b for v in ev.values() for b in benchmarks_of(v)},
                     key=lambda b: BENCHMARK_ORDER.index(b) if b in BENCHMARK_ORDER else 99)
    for b in benches:
        body.append(img(figures.accuracy_bars(ev, b), f"greedy accuracy per model on {b}"))
    body.append("<h3>pass@k and maj@k against k (paper Figure 7)</h3>")
    body.append(img(figures.pass_maj(ev), "pass@k and maj@k"))
    body.append("<h3>Every run</h3>")
    body.append(html_table(("model", "benchmark", "mode", "decoding", "problems", "acc. / pass@1", "pass@k",
                            "maj@k", "k", "no answer", "truncated", "tokens"), run_rows(ev),
                           numeric=range(4, 12), cls="small"))
    missing = [k for k, v in inputs.evaluate.items() if v is None]
    if missing:
        body.append(f'<p class="na">{NOT_RUN}: ' + ", ".join(f"evaluate@{esc(k)}" for k in missing) + "</p>")
    # greedy CoT accuracy by difficulty
    for b in benches:
        diffs = sorted({d for v in ev.values() for d in mapping(get(v, f"{b}.cot.greedy.by_difficulty"))},
                       key=lambda d: (len(d), d))
        if diffs:
            body.append(f"<h3>Greedy CoT accuracy by difficulty ({esc(b)})</h3>")
            drows = [[k] + [acc(get(v, f"{b}.cot.greedy.by_difficulty.{d}.acc")) for d in diffs]
                     for k, v in ev.items() if isinstance(get(v, f"{b}.cot.greedy.by_difficulty"), dict)]
            body.append(html_table(["model"] + [f"difficulty {d}" for d in diffs], drows,
                                   numeric=range(1, len(diffs) + 1)))
    for k, v in ev.items():
        body.append(all_metrics(_without(v, ("per_problem", "verifiers")), f"data/details/evaluate_{k}.json"))
    return _section("evaluate", TITLES["evaluate"], True, "\n".join(body))


def _without(d: Any, keys: tuple[str, ...]) -> Any:
    """``d`` without the nested keys ``keys`` (the per-problem scores and verifier tables have their own tables)."""
    if not isinstance(d, dict):
        return d
    return {k: _without(v, keys) for k, v in d.items() if k not in keys}


def _one(v: Any) -> str:
    x = num(v)
    return DASH if x is None else f"{x:.1f}"


def run_rows(ev: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Every evaluation run: model, benchmark, mode, decoding, its accuracy (greedy) or pass@1 / pass@k / maj@k
    (sampled, k = samples per problem), the share with no extracted answer, truncated share, mean tokens."""
    out = []
    for model, m in ev.items():
        for b in benchmarks_of(m):
            for mode, decs in m[b].items():
                for dec in ("greedy", "sample"):
                    r = get(decs, dec)
                    if not isinstance(r, dict):
                        continue
                    k = int(r["n_samples"]) if num(r.get("n_samples")) else None
                    first = r.get("acc") if dec == "greedy" else r.get("pass@1")
                    out.append([model, b, mode, dec, fmt(r.get("n")), acc(first),
                                acc(r.get(f"pass@{k}")) if k else DASH, acc(r.get(f"maj@{k}")) if k else DASH,
                                fmt(k), acc(r.get("no_answer")), acc(r.get("truncated")),
                                _one(r.get("mean_tokens"))])
    return out


COMPARISON_COLUMNS = ("step", "before → after", "benchmark", "run", "metric", "problems", "before", "after",
                      "difference", "95% interval", "p", "beyond noise")


def comparison_rows(comps: list[Comparison]) -> list[list[str]]:
    """One row per model comparison: both means, the difference, its paired-bootstrap interval and p-value."""
    return [[c.what, f"{c.before} → {c.after}", c.benchmark, c.run, c.metric, fmt(c.n), f"{c.before_mean:.3f}",
             f"{c.after_mean:.3f}", f"{c.diff:+.3f}", f"[{c.lo:+.3f}, {c.hi:+.3f}]", f"{c.p_value:.3f}",
             "yes" if c.beyond_noise else "no"] for c in comps]


def checker_note(inputs: Inputs) -> str:
    """Which checker judged the numbers (recorded in the evaluations' details)."""
    rec = next((get(m, "checker") for m in inputs.evaluate.values() if isinstance(get(m, "checker"), dict)), None)
    if not isinstance(rec, dict):
        return "answer checker: not recorded (an evaluation older than the checker modes)"
    return (f"answer checker: headline mode {rec.get('headline')}, the paper comparison in {rec.get('report')} mode "
            f"(checker version {rec.get('version')}, deadline {fmt(rec.get('timeout_s'))} s per check"
            + (f", math-verify {rec.get('math_verify')} beside" if rec.get("math_verify") else "") + ")")


def seeds_note(inputs: Inputs, resamples: int, seed: int) -> str:
    """The seeds behind the numbers on the page."""
    s = next((get(m, "seeds.sampling") for m in inputs.evaluate.values() if num(get(m, "seeds.sampling")) is not None),
             None)
    g = get(inputs.metrics.get("grpo"), "seed")
    parts = [f"evaluation sampling seed {fmt(s)} (batch b samples with seed + b; maj@k subsets with seed + problem)"
             if s is not None else "evaluation sampling seed: not recorded"]
    if num(g) is not None:
        parts.append(f"GRPO seed {fmt(g)}")
    parts.append(f"paired bootstrap: {fmt(resamples)} resamples of the problems, seed {seed}")
    return "Seeds: " + "; ".join(parts) + "."


VERIFIER_COLUMNS = ("model", "benchmark", "run", "completions", "strict", "deepseekmath", "math-verify",
                    "strict ≠ deepseekmath", "strict ≠ math-verify", "deepseekmath ≠ math-verify", "timeouts")


def verifier_table_rows(inputs: Inputs) -> list[list[str]]:
    """The verifier-sensitivity table: per model, benchmark and run, the accuracy under each checker mode and under
    math-verify alone, the completions each pair disagrees on, and the timeouts (any verifier)."""
    out = []
    for r in verifier_rows(inputs.evaluate):
        v = r["v"]
        d = mapping(v.get("disagreements"))
        out.append([r["model"], r["benchmark"], r["run"], fmt(v.get("n")), acc(get(v, "strict.acc")),
                    acc(get(v, "deepseekmath.acc")), acc(get(v, "math_verify.acc")),
                    fmt(d.get("deepseekmath/strict")), fmt(d.get("strict/math_verify")),
                    fmt(d.get("deepseekmath/math_verify")),
                    fmt(sum(num(get(v, f"{k}.timeout")) or 0 for k in ("strict", "deepseekmath", "math_verify")))])
    return out


def _verifier_samples_html(inputs: Inputs) -> str:
    parts = []
    for r in verifier_rows(inputs.evaluate):
        kinds = mapping(r["v"].get("kinds"))
        if not kinds:
            continue
        rows = []
        for kind, k in kinds.items():
            for smp in seq(get(k, "samples")):
                verdicts = ", ".join(f"{a}: {b}" for a, b in mapping(get(smp, "verdicts")).items())
                rows.append([f"{kind} ({fmt(get(k, 'count'))})", str(get(smp, "id")), fmt(get(smp, "answer")),
                             str(get(smp, "gold")), verdicts, str(get(smp, "tail") or "")[-120:]])
        parts.append(f"<details><summary>{esc(r['model'])} · {esc(r['benchmark'])} · {esc(r['run'])}: "
                     f"{len(kinds)} kind(s) of disagreement</summary>"
                     + html_table(("kind (count)", "problem", "answer", "gold", "verdicts", "end of the output"), rows,
                                  cls="small") + "</details>")
    return "\n".join(parts) if parts else '<p class="note">No disagreement between the verifiers.</p>'


def _uncertainty_section(inputs: Inputs, comps: list[Comparison], resamples: int, seed: int) -> str:
    ran = any(v is not None for v in inputs.evaluate.values())
    if not ran:
        return _section("uncertainty", "Model comparisons with their uncertainty", False,
                        _not_run("evaluate", "data/details/evaluate_<model>.json"))
    body = ['<p class="note">Each step of the pipeline and each RL variant, on the problems both models were scored '
            "on: the difference of the mean scores (after − before) and its 95% paired-bootstrap interval over "
            "problems (stages/core/stats.py). Beyond noise: the interval excludes 0. Greedy runs compare per-problem "
            "correctness; sampled runs avg@n (mean correctness of the n samples), pass@n and maj@n.</p>"]
    if comps:
        body.append(html_table(COMPARISON_COLUMNS, comparison_rows(comps), numeric=range(5, 11), cls="small"))
    else:
        body.append(f'<p class="na">{NOT_RUN}: no two evaluated models with per-problem scores to compare '
                    "(evaluations older than the checker modes carry none).</p>")
    body.append(f'<p class="note">{esc(seeds_note(inputs, resamples, seed))}</p>')
    return _section("uncertainty", "Model comparisons with their uncertainty", bool(comps), "\n".join(body))


def _verifier_section(inputs: Inputs) -> str:
    rows = verifier_table_rows(inputs)
    if not rows:
        return _section("verifiers", "Answer checking: verifier sensitivity", False,
                        '<p class="na">not run: no evaluation with per-verifier verdicts '
                        "(data/details/evaluate_&lt;model&gt;.json, verifiers).</p>")
    body = ['<p class="note">Every completion is judged three ways: the strict checker (the headline), the '
            "reference's rules (deepseekmath mode, the paper comparison) and math-verify alone (its own extraction "
            "and verify). Accuracy over all completions of the run under each, the completions each pair disagrees "
            "on, and the checks that hit their deadline (never counted right). docs/evaluation.md has the rules.</p>",
            f'<p class="note">{esc(checker_note(inputs))}.</p>',
            html_table(VERIFIER_COLUMNS, rows, numeric=range(3, 11), cls="small"),
            "<h3>Samples of each kind of disagreement</h3>", _verifier_samples_html(inputs)]
    return _section("verifiers", "Answer checking: verifier sensitivity", True, "\n".join(body))


def _comparisons_section(inputs: Inputs, enabled: bool) -> str:
    if not enabled:
        return _section("comparisons", TITLES["comparisons"], False,
                        f'<p class="na">{NOT_RUN}: report.benchmark_results is false (the committed comparisons '
                        "describe the tiny default).</p>")
    body = ["<h3>Unified paradigm: held-out accuracy during training (paper Figure 5)</h3>"]
    if not _paradigm_block(body, inputs.paradigm, "paradigm.json"):
        body.append(f'<p class="na">{NOT_RUN}: benchmarks/results/paradigm.json absent '
                    "(<code>python benchmarks/paradigm.py --run</code>).</p>")
    if inputs.paradigm_rm is not None:
        body.append("<h3>Figure 5 with the learned reward models</h3>")
        _paradigm_block(body, inputs.paradigm_rm, "paradigm_rm.json")
    body.append("<h3>Iterative RL (paper Figure 6)</h3>")
    it = iterative_series(inputs.iterative)
    if it:
        note = get(inputs.iterative, "note")
        body.append(f'<p class="note">benchmarks/results/iterative_rl.json (measured '
                    f'{esc(str(get(inputs.iterative, "measured_at"))[:10])}). {esc(note or "")}</p>')
        body.append(img(figures.iterative(it), "iterative RL: held-out accuracy per iteration"))
    else:
        body.append(f'<p class="na">{NOT_RUN}: benchmarks/results/iterative_rl.json absent or in another format '
                    "(<code>python benchmarks/paradigm.py --iterative-out ...</code>).</p>")
    return _section("comparisons", TITLES["comparisons"], inputs.paradigm is not None or bool(it), "\n".join(body))


def _paradigm_block(body: list[str], d: dict[str, Any] | None, name: str) -> bool:
    """Append one paradigm comparison (benchmarks/paradigm.py's result file ``name``) to ``body``: its plot, the
    final accuracy per method and the pairs against the paper's order; False when it has no summary."""
    summary = get(d, "summary")
    if not (isinstance(summary, dict) and summary):
        return False
    body.append(f'<p class="note">{esc(paradigm_source(d, name))}. {esc(get(d, "note") or "")}</p>')
    body.append(img(figures.paradigm(summary), f"unified paradigm ({name}): held-out accuracy per step"))
    rows = []
    for k, v in summary.items():
        if isinstance(v, dict):
            rows.append([k, acc(get(v, "final_mean")), acc(get(v, "final_sd")), fmt(len(seq(get(v, "seeds"))))])
    body.append(html_table(("method", "final held-out accuracy (mean)", "sd over seeds", "seeds"), rows,
                           numeric=(1, 2, 3)))
    for kind in ("exact", "reward_model"):
        comp = get(d, f"comparison.{kind}")
        if isinstance(comp, dict) and isinstance(comp.get("pairs"), list):
            body.append(f"<p>Paper order ({esc(kind)}): {esc(' > '.join(map(str, seq(comp.get('paper_order')))))}"
                        f"; measured: {esc(' > '.join(map(str, seq(comp.get('measured_order')))))}.</p>")
            prows = [[str(get(p, "pair")), fmt(get(p, "diff")), str(get(p, "verdict")),
                      "yes" if get(p, "clear") else "no"] for p in comp["pairs"] if isinstance(p, dict)]
            body.append(html_table(("pair (paper's order)", "difference", "verdict", "beyond seed spread"),
                                   prows, numeric=(1,)))
    return True


def _page_header(title: str, when: str) -> list[str]:
    """The page's title, what made it, and the navigation."""
    return [
        f"<header><h1>{esc(title)}</h1>",
        f'<p class="sub">Generated{esc(when)} by the report stage (<code>dvc repro report</code>) from '
        f'<code>data/details</code>, <code>data/plots</code> and <code>benchmarks/results</code>. Paper: '
        f'<a href="{paper.PAPER_URL}">{esc(paper.PAPER)}</a>.</p>',
        "<nav>" + "".join(f'<a href="#{sid}">{esc(t)}</a>' for sid, t in (
            ("headline", "Headline"), ("uncertainty", "Comparisons"), ("verifiers", "Verifiers"),
            ("paper", "Paper vs ours"), ("stages", "Stages"), ("data", "data"),
            ("corpus", "corpus"), ("base_model", "base_model"), ("pretrain", "pretrain"), ("sft", "sft"),
            ("reward_model", "reward_model"), ("grpo", "grpo"), ("evaluate", "evaluate"),
            ("comparisons", "comparisons"))) + "</nav></header>",
    ]


def _paper_section(inputs: Inputs, comps: list[Comparison]) -> list[str]:
    """The paper beside ours: the accuracy table and the findings (:func:`paper_rows`)."""
    return [
        '<section id="paper"><h2>The paper beside ours</h2><p class="note">The paper\'s numbers and findings with '
        "their table or figure (stages/report/paper.py); ours from this run, or from the committed benchmark "
        "results. Paper: 7B models on GSM8K / MATH; ours: the models of this run on the benchmark named.</p>",
        f"<h3>Top-1 greedy accuracy, percent ({esc(report_mode(inputs) or 'headline')} rules)</h3>",
        accuracy_html(inputs),
        "<h3>Findings</h3>",
        html_table(("finding", "paper", "source", "ours", "our measurement"),
                   [(r.what, r.paper, r.source, r.ours or NOT_RUN, r.note) for r in paper_rows(inputs, comps)],
                   numeric=()),
        "</section>",
    ]


def html_page(title: str, inputs: Inputs, benchmark_results: bool, generated_at: datetime | None = None,
              bootstrap_resamples: int = 2000, bootstrap_seed: int = 0,
              comps: list[Comparison] | None = None) -> str:
    """The whole page: headline (with standard errors), the model comparisons with their paired-bootstrap intervals,
    the verifier-sensitivity table, the paper beside ours, the stages overview, one section per stage.

    No clock reading: the same inputs give the same bytes (the page is a DVC output; a build time on it
    would make two runs of the same inputs differ whenever they ended in different minutes). ``generated_at``, given
    by a caller, is printed."""
    when = f" {generated_at.astimezone(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}" if generated_at else ""
    if comps is None:
        comps = comparisons(inputs.evaluate, bootstrap_resamples, bootstrap_seed)
    head_rows = headline(inputs)
    seps = ["model-sep" if i and r.model != head_rows[i - 1].model else "" for i, r in enumerate(head_rows)]
    parts = [
        *_page_header(title, when),
        '<section id="headline"><h2>Held-out accuracy per model</h2>',
        '<p class="note">Greedy top-1 accuracy on each benchmark the evaluate stage ran; pass@k and maj@k from k '
        "sampled CoT solutions per problem; ± one standard error over problems. The tiny default's benchmark is "
        "<code>generated</code>: held-out word problems made by the data stage (GSM8K and MATH when "
        f"<code>evaluate.common</code> gives their files). {esc(checker_note(inputs))}.</p>",
        html_table(HEAD_COLUMNS, [_head_cells(r) for r in head_rows], numeric=range(4, 9), cls="head",
                   row_classes=seps),
        "</section>",
        _uncertainty_section(inputs, comps, bootstrap_resamples, bootstrap_seed),
        _verifier_section(inputs),
        *_paper_section(inputs, comps),
        '<section id="stages"><h2>Stages</h2>',
        html_table(("stage", "status", "result"), overview_rows(inputs), numeric=()),
        f'<p class="note">{esc(TIMINGS_NOTE)}</p>',
        "</section>",
        stage_section("data", inputs),
        stage_section("corpus", inputs, lambda: img(figures.corpus_rounds(get(inputs.metrics["corpus"], "rounds")),
                                                    "corpus recall rounds")),
        stage_section("base_model", inputs),
    ]
    for s in ("pretrain", "sft"):
        c = inputs.curves.get(s, {})
        parts.append(stage_section(s, inputs, lambda s=s, c=c: img(figures.loss_curves(s, c.get("train"), c.get("eval")),
                                                                   f"{s} loss curves")))
    parts.append(stage_section("reward_model", inputs, lambda: "<h3>AUC (ranking correct above incorrect)</h3>" +
                               html_table(("block", "outcome AUC", "step AUC", "other AUCs", "examples", "steps"),
                                          auc_rows(inputs.metrics["reward_model"]), numeric=(1, 2, 4, 5))))
    parts.append(stage_section("grpo", inputs, lambda: img(figures.grpo_curves(inputs.grpo_curves),
                                                           "GRPO reward, KL and accuracy against step")))
    parts.append(_evaluate_section(inputs))
    parts.append(_comparisons_section(inputs, benchmark_results))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n")

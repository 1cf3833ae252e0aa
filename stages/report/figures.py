"""The report's plots: matplotlib figures rendered to PNG and returned as ``data:`` URIs (the page fetches nothing).

Each function takes already-loaded inputs and returns the URI, or None when there is nothing to plot (the page
then says "not run"). Figures are built on :class:`matplotlib.figure.Figure` (no pyplot state, Agg canvas).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from stages.report.inputs import Row, get, num, seq

DPI = 100
WIDTH_IN = 10.0
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})  # constrained layout: no "tight" pass
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(ncols: int, height_in: float = 3.0) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, list(axes)


def _legend(ax: Any, **kw: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _xy(rows: Sequence[Row], x: str, y: str) -> tuple[list[float], list[float]]:
    pts = [(r.get(x), r.get(y)) for r in rows]
    pts = [(a, b) for a, b in pts if a is not None and b is not None]
    return [a for a, _ in pts], [b for _, b in pts]


def _smooth(ys: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(ys)):
        part = ys[max(0, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def loss_curves(stage: str, train: Sequence[Row] | None, heldout: Sequence[Row] | None) -> str | None:
    """Train loss and held-out loss against step (log scale) of a training stage."""
    tx, ty = _xy(train or [], "step", "loss")
    ex, ey = _xy(heldout or [], "step", "eval_loss")
    if not tx and not ex:
        return None
    fig, (ax,) = _figure(1, 2.8)
    if tx:
        ax.plot(tx, ty, color=COLORS[0], lw=1.5, label="train loss")
    if ex:
        ax.plot(ex, ey, "o-", color=COLORS[1], lw=1.5, label="held-out loss")
    if all(v > 0 for v in ty + ey):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(  # label 2 and 5 of each decade
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(f"{stage}: loss")
    _legend(ax, frameon=False)
    return _uri(fig)


def grpo_curves(curves: dict[str, list[Row]]) -> str | None:
    """GRPO against step: reward and batch accuracy (with a reward model: its reward, also before the reshaping guards
    when on, beside the rule accuracy of the same samples: the overoptimisation monitor; dotted lines: the steps where
    the divergence guard fired); KL to the reference; held-out accuracy (or completion length when no held-out curve
    was recorded). Thin lines: per step; thick: 5-step moving average."""
    if not any(k in curves for k in ("reward_mean", "accuracy", "kl")):
        return None
    fig, axes = _figure(3, 3.0)
    for i, (name, label, style) in enumerate((("reward_mean", "reward (mean)", "-"),
                                              ("accuracy", "accuracy", "--"),  # equal under the rule reward
                                              ("rm_raw_mean", "RM reward before the guards", ":"))):
        x, y = _xy(curves.get(name, []), "step", name)
        if x:
            axes[0].plot(x, y, color=COLORS[i], lw=0.8, alpha=0.3)
            axes[0].plot(x, _smooth(y, 5), style, color=COLORS[i], lw=2, label=label)
    axes[0].set_title("sampled groups: reward, accuracy")
    for r in curves.get("rm_divergence", []):
        if num(r.get("rm_divergence")):
            for ax in axes:
                ax.axvline(float(r["step"]), color="0.4", ls=":", lw=1)
    _legend(axes[0], frameon=False, fontsize=8)
    x, y = _xy(curves.get("kl", []), "step", "kl")
    if x:
        axes[1].plot(x, y, color=COLORS[4], lw=0.8, alpha=0.35)
        axes[1].plot(x, _smooth(y, 5), color=COLORS[4], lw=2)
    axes[1].set_title("KL to the reference (k3, eq. 4)")
    if curves.get("heldout_accuracy"):
        x, y = _xy(curves["heldout_accuracy"], "step", "heldout_accuracy")
        axes[2].plot(x, y, "o-", color=COLORS[2], lw=2)
        axes[2].set_title("held-out greedy accuracy")
    else:
        x, y = _xy(curves.get("completion_len", []), "step", "completion_len")
        if x:
            axes[2].plot(x, y, color=COLORS[3], lw=0.8, alpha=0.35)
            axes[2].plot(x, _smooth(y, 5), color=COLORS[3], lw=2)
        axes[2].set_title("completion length (tokens)")
    for ax in axes:
        ax.set_xlabel("step")
    return _uri(fig)


def _at_k(sample: dict[str, Any], prefix: str) -> tuple[list[int], list[float]]:
    ks = sorted(int(k.split("@")[1]) for k in sample if k.startswith(prefix + "@") and k.split("@")[1].isdigit())
    pts = [(k, num(sample[f"{prefix}@{k}"])) for k in ks]
    pts = [(k, v) for k, v in pts if v is not None]
    return [k for k, _ in pts], [v for _, v in pts]


def sampled_runs(evals: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, dict[str, Any]]]:
    """{"<benchmark> <mode>": {model: sample metrics}} for every sampled run of every evaluated model."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for model, m in evals.items():
        for bench, modes in (m or {}).items():
            if not isinstance(modes, dict):
                continue
            for mode, decs in modes.items():
                s = get(decs, "sample")
                if isinstance(s, dict):
                    out.setdefault(f"{bench} {mode}", {})[model] = s
    return out


def pass_maj(evals: dict[str, dict[str, Any] | None]) -> str | None:
    """pass@k (solid) and maj@k (dashed) against k, one panel per sampled benchmark and mode (paper Figure 7)."""
    runs = sampled_runs(evals)
    if not runs:
        return None
    fig, axes = _figure(len(runs), 3.2)
    for ax, (name, by_model) in zip(axes, runs.items(), strict=True):
        for i, (model, s) in enumerate(by_model.items()):
            for prefix, style in (("pass", "o-"), ("maj", "s--")):
                ks, vs = _at_k(s, prefix)
                if ks:
                    ax.plot(ks, vs, style, color=COLORS[i % len(COLORS)], lw=1.8, ms=4, label=f"{model} {prefix}@k")
        ax.set_xscale("log", base=2)
        ks = sorted({k for s in by_model.values() for k in _at_k(s, "pass")[0] + _at_k(s, "maj")[0]})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel("accuracy")
        t = get(next(iter(by_model.values())), "temperature")
        ax.set_title(f"pass@k and maj@k: {name}" + (f", T = {t}" if t is not None else ""))
        _legend(ax, frameon=False, fontsize=8)
    return _uri(fig)


def accuracy_bars(evals: dict[str, dict[str, Any] | None], benchmark: str) -> str | None:
    """Greedy accuracy per model on one benchmark, one bar per mode (CoT / PoT / TIR)."""
    models = [m for m, v in evals.items() if isinstance(get(v, benchmark), dict)]
    modes = [mode for mode in ("cot", "pot", "tir") if any(num(get(evals[m], f"{benchmark}.{mode}.greedy.acc"))
                                                           is not None for m in models)]
    if not models or not modes:
        return None
    fig, (ax,) = _figure(1, 2.8)
    width = min(0.8 / len(modes), 0.3)
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, m in enumerate(models):
            v = num(get(evals[m], f"{benchmark}.{mode}.greedy.acc"))
            if v is not None:
                xs.append(i + (j - (len(modes) - 1) / 2) * width)
                ys.append(v)
        bars = ax.bar(xs, ys, width * 0.95, color=COLORS[j], label=f"{mode.upper()} greedy")
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title(f"held-out greedy accuracy per model ({benchmark})")
    _legend(ax, frameon=False, fontsize=8, ncols=len(modes), loc="upper left")
    return _uri(fig)


def corpus_rounds(rounds: Sequence[dict[str, Any]] | None) -> str | None:
    """fastText recall rounds (paper Figure 2): precision / recall / F1 against ground truth, and pages collected."""
    rows = [r for r in seq(rounds) if isinstance(r, dict) and num(r.get("round")) is not None]
    if not rows:
        return None
    fig, axes = _figure(2, 2.8)
    xs = [int(r["round"]) for r in rows]
    for i, key in enumerate(("precision", "recall", "f1")):
        pts = [(x, num(r.get(key))) for x, r in zip(xs, rows, strict=True)]
        pts = [(x, v) for x, v in pts if v is not None]
        if pts:
            axes[0].plot([x for x, _ in pts], [v for _, v in pts], "o-", color=COLORS[i], lw=1.8, label=key)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("math-page classifier per round (vs ground truth)")
    _legend(axes[0], frameon=False, fontsize=8)
    collected = [num(r.get("collected")) or 0 for r in rows]
    new = [num(r.get("new")) or 0 for r in rows]
    axes[1].bar(xs, collected, color=COLORS[0], alpha=0.45, label="collected")
    axes[1].bar(xs, new, color=COLORS[0], label="new this round")
    for x, r, c in zip(xs, rows, collected, strict=True):
        ov = num(r.get("overlap_with_previous"))
        if ov is not None:
            axes[1].annotate(f"{ov:.1%} seen", (x, c), ha="center", va="bottom", fontsize=7)
    axes[1].set_title("pages collected per round")
    _legend(axes[1], frameon=False, fontsize=8)
    for ax in axes:
        ax.set_xlabel("round")
        ax.set_xticks(xs)
    return _uri(fig)


def _band(ax: Any, steps: list[float], mean: list[float], sd: list[float] | None, color: str, label: str) -> None:
    ax.plot(steps, mean, "o-", color=color, lw=1.8, ms=3, label=label)
    if sd and len(sd) == len(mean):
        ax.fill_between(steps, [m - s for m, s in zip(mean, sd, strict=True)],
                        [m + s for m, s in zip(mean, sd, strict=True)], color=color, alpha=0.15)


def paradigm_panels(methods: list[str]) -> list[tuple[str, list[str]]]:
    """The panels of :func:`paradigm`: (title, methods) for rule rewards / exact labels, and for the learned reward
    models (methods named ``*_rm`` or ``*_rm_*``, e.g. ``grpo_ps_rm_iter2``) when any, with RFT and online RFT."""
    learned = [k for k in methods if k.endswith("_rm") or "_rm_" in k]
    panels = [("rule reward / exact step labels", [k for k in methods if k not in learned])]
    if learned:
        panels.append(("learned reward models", [k for k in methods if k in ("rft", "online_rft")] + learned))
    return panels


def paradigm(summary: dict[str, Any] | None) -> str | None:
    """Held-out accuracy against step per method, mean +- sd over seeds (paper Figure 5): rule rewards and exact
    step labels on the left, learned reward models (``*_rm``, ``*_rm_*``) on the right, RFT and online RFT on both."""
    methods = {k: v for k, v in (summary or {}).items() if isinstance(v, dict)
               and isinstance(v.get("steps"), list) and isinstance(v.get("mean"), list)}
    if not methods:
        return None
    panels = paradigm_panels(list(methods))
    fig, axes = _figure(len(panels), 3.2)
    colors = {k: COLORS[i % len(COLORS)] for i, k in enumerate(methods)}
    for ax, (title, names) in zip(axes, panels, strict=True):
        for k in names:
            v = methods[k]
            mean = [num(x) for x in v["mean"]]
            if any(x is None for x in mean) or len(mean) != len(v["steps"]):
                continue
            sd = [num(x) or 0.0 for x in v["sd"]] if isinstance(v.get("sd"), list) else None
            _band(ax, [float(s) for s in v["steps"]], mean, sd, colors[k], f"{k} (n={len(seq(v.get('seeds')))})")
        ax.set_title(f"held-out accuracy: {title}")
        ax.set_xlabel("step")
        _legend(ax, frameon=False, fontsize=8)
    return _uri(fig)


def iterative(per_iteration: dict[str, list[list[float]]]) -> str | None:
    """Held-out accuracy after each iteration of iterative RL (paper Figure 6), mean +- sd over seeds."""
    if not per_iteration:
        return None
    fig, (ax,) = _figure(1, 2.8)
    for i, (name, seeds) in enumerate(per_iteration.items()):
        n = min(len(s) for s in seeds)
        if n == 0:
            continue
        mean = [sum(s[j] for s in seeds) / len(seeds) for j in range(n)]
        sd = [math.sqrt(sum((s[j] - mean[j]) ** 2 for s in seeds) / max(1, len(seeds) - 1)) for j in range(n)]
        _band(ax, list(range(n)), mean, sd, COLORS[i % len(COLORS)], f"{name} (n={len(seeds)})")
    ax.set_xlabel("iteration (0 = SFT model)")
    ax.set_ylabel("held-out accuracy")
    ax.set_xticks(range(max(len(s) for v in per_iteration.values() for s in v)))
    ax.set_title("iterative RL: held-out accuracy per iteration")
    _legend(ax, frameon=False, fontsize=8)
    return _uri(fig)

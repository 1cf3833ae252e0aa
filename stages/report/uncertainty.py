"""The report's numbers with their uncertainty: every model comparison the page makes as a paired bootstrap over
problems, the verifier-sensitivity rows, the seeds.

Comparisons (:data:`PAIRS`): pretrained -> SFT -> RL along the pipeline, and the RL variants (continued SFT, the
baseline RL is compared with; any other evaluated model whose name starts with ``grpo``). For each pair, benchmark
and run both models have (greedy modes; sampled CoT at the same n), the per-problem scores of the evaluate stage's
details (``per_problem``: greedy correctness, or avg@n / pass@n / maj@n per problem) are paired by problem id and
resampled together (:func:`stages.core.stats.paired_bootstrap`): the difference, its 95% interval and whether
it excludes 0 ("beyond noise").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stages.core.stats import paired_bootstrap
from stages.report.inputs import get, mapping, num, seq

PAIRS: tuple[tuple[str, str, str], ...] = (
    ("base", "pretrain", "continual pretraining"),
    ("pretrain", "sft", "SFT"),
    ("sft", "grpo", "RL (GRPO)"),
    ("sft", "sft_continued", "continued SFT (the RL baseline)"),
    ("sft_continued", "grpo", "RL over the continued-SFT baseline"),
)
"""(before, after, what the step is) in pipeline order; other ``grpo*`` models are compared with ``grpo``."""


@dataclass(frozen=True)
class Comparison:
    """``after`` minus ``before`` on one benchmark / run / metric, paired over the problems both were scored on."""

    before: str
    after: str
    what: str
    benchmark: str
    run: str
    metric: str
    n: int
    before_mean: float
    after_mean: float
    diff: float
    lo: float
    hi: float
    p_value: float
    beyond_noise: bool


def pairs_of(models: list[str]) -> list[tuple[str, str, str]]:
    """The comparisons that apply to the evaluated ``models``."""
    out = [p for p in PAIRS if p[0] in models and p[1] in models]
    out += [("grpo", m, f"RL variant {m}") for m in models if m.startswith("grpo") and m != "grpo" and "grpo" in models]
    return out


def _runs(m: dict[str, Any], bench: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for mode, decs in mapping(get(m, bench)).items():
        for dec in ("greedy", "sample"):
            r = get(decs, dec)
            if isinstance(r, dict) and isinstance(r.get("per_problem"), dict):
                out[(mode, dec)] = r
    return out


def _paired(a: dict[str, Any], b: dict[str, Any], key: str) -> tuple[list[float], list[float]] | None:
    ia, ib = seq(get(a, "per_problem.ids")), seq(get(b, "per_problem.ids"))
    va, vb = seq(get(a, f"per_problem.{key}")), seq(get(b, f"per_problem.{key}"))
    if len(ia) != len(va) or len(ib) != len(vb) or not ia:
        return None
    pos = {pid: j for j, pid in enumerate(ib)}
    common = [(va[i], vb[pos[pid]]) for i, pid in enumerate(ia) if pid in pos]
    if not common or any(num(x) is None or num(y) is None for x, y in common):
        return None
    return [float(x) for x, _ in common], [float(y) for _, y in common]


def comparisons(evals: dict[str, dict[str, Any] | None], resamples: int = 2000, seed: int = 0) -> list[Comparison]:
    """Every comparison of :func:`pairs_of` on every benchmark and run both models have (module docstring)."""
    ran = {k: v for k, v in evals.items() if isinstance(v, dict)}
    out = []
    for before, after, what in pairs_of(list(ran)):
        a_m, b_m = ran[before], ran[after]
        for bench in [b for b in a_m if isinstance(a_m.get(b), dict) and isinstance(b_m.get(b), dict)]:
            ra, rb = _runs(a_m, bench), _runs(b_m, bench)
            for (mode, dec) in [k for k in ra if k in rb]:
                if dec == "greedy":
                    keys = ["acc"]
                else:
                    n = num(ra[(mode, dec)].get("n_samples"))
                    if n is None or n != num(rb[(mode, dec)].get("n_samples")):
                        continue
                    keys = [f"avg@{int(n)}", f"pass@{int(n)}", f"maj@{int(n)}"]
                for key in keys:
                    pair = _paired(ra[(mode, dec)], rb[(mode, dec)], key)
                    if pair is None:
                        continue
                    xa, xb = pair
                    r = paired_bootstrap(xa, xb, resamples=resamples, seed=seed)
                    out.append(Comparison(before, after, what, bench, f"{mode} {dec}", key, int(r["n"]),
                                          sum(xa) / len(xa), sum(xb) / len(xb), float(r["diff"]), float(r["lo"]),
                                          float(r["hi"]), float(r["p_value"]), bool(r["beyond_noise"])))
    return out


def find(comps: list[Comparison], before: str, after: str, bench: str | None, run: str, metric: str
         ) -> Comparison | None:
    """The comparison of ``before`` -> ``after`` on ``bench`` / ``run`` / ``metric`` (None when not made)."""
    return next((c for c in comps if (c.before, c.after, c.run, c.metric) == (before, after, run, metric)
                 and (bench is None or c.benchmark == bench)), None)


def interval_text(c: Comparison, scale: float = 100.0, unit: str = " points") -> str:
    """``+5.8 points (95% CI +2.9 to +8.7; beyond noise)``."""
    verdict = "beyond noise" if c.beyond_noise else "within noise"
    return (f"{scale * c.diff:+.1f}{unit} (95% CI {scale * c.lo:+.1f} to {scale * c.hi:+.1f}, n = {c.n}; "
            f"{verdict})")


def verifier_rows(evals: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per evaluated model, benchmark and run with a verifier table (stages/evaluate/stage.py
    ``verifier_table``): completions, accuracy per verifier, disagreements per pair, timeouts, and the kinds of
    disagreement with their samples."""
    rows = []
    for model, m in evals.items():
        if not isinstance(m, dict):
            continue
        for bench, modes in m.items():
            if not isinstance(modes, dict):
                continue
            for mode, decs in modes.items():
                for dec in ("greedy", "sample"):
                    v = get(decs, f"{dec}.verifiers")
                    if isinstance(v, dict) and num(v.get("n")):
                        rows.append({"model": model, "benchmark": bench, "run": f"{mode} {dec}", "v": v})
    return rows

"""The pure RL functions of issues 31 / 32 against verl's own functions on the same tensors.

verl cannot be installed beside this project (it pins numpy < 2, needs ray and a tensordict built for its torch), but
the functions compared are plain torch: this script downloads verl's wheel with pip (``pip download verl==VERSION
--no-deps``, nothing installed), reads the needed top-level functions from its source files, and runs them
unchanged in a namespace that provides what they import: torch, verl's own ``masked_sum`` / ``masked_mean`` (also
read from its source), and stand-ins for the config classes and decorators (an ``ActorConfig`` with the clip
ratios and ``global_batch_info = {}``, an identity ``register_policy_loss``).

Compared (ours -> verl 0.9.1):

- :func:`stages.rl.corrections.rollout_correction` -> ``rollout_corr_helper.compute_rollout_correction_weights``:
  TIS (``rollout_is_threshold`` a float: ours ``truncate_high``, no lower bound) and IcePop (``"lower_upper"``: ours
  ``mis`` / ``seq-mis``) at token and sequence level (weights);
- the rejection of :func:`rollout_correction` (``weight_level=None``) -> ``compute_rollout_rejection_mask`` with
  ``token_k1``, ``seq_sum_k1``, ``seq_mean_k1`` (verl's k1 statistic is log(pi_rollout / pi_train), kept inside
  [log lower, log upper]: ours rejects the ratio outside [1 / upper, 1 / lower] at token / sequence / geometric level);
- :func:`stages.rl.losses.gspo_loss` -> ``core_algos.compute_policy_loss_gspo`` (beta 0, every aggregation, with and
  without rollout weights): loss value and gradient w.r.t. the log-probs;
- :func:`stages.rl.losses.cispo_loss` -> ``compute_policy_loss_cispo`` (clip [1 - clip_ratio_low,
  1 + clip_ratio_high]);
- :func:`stages.rl.losses.grpo_loss` with ``is_weights`` -> ``compute_policy_loss_vanilla`` with
  ``rollout_is_weights`` (verl's dual clip, c = 3, is inactive here: every ratio is below 3);
- :func:`stages.rl.losses.entropy_bonus` -> ``-coef * agg_loss(entropy, mask, mode)`` (verl's ``entropy_coeff``).

    python benchmarks/rl_math_vs_verl.py               # -> benchmarks/results/rl_math_vs_verl.json
    python benchmarks/rl_math_vs_verl.py --verl-src D  # a verl checkout or unpacked wheel instead of the download

Not a test (it needs the registry to fetch verl); tests/benchmarks/test_rl_math_vs_trl.py is the CI check against
TRL, and tests/rl/ the loop references.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "rl_math_vs_verl.json"
VERL_VERSION = "0.9.1"
AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


def _functions(path: Path, names: set[str]) -> tuple[str, set[str]]:
    """The source of the named top-level functions (decorators kept) and constants of ``path``."""
    src = path.read_text()
    tree = ast.parse(src)
    parts, found = [], set()
    for node in tree.body:
        name = getattr(node, "name", None)
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if targets and all(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
            parts.append(ast.get_source_segment(src, node))
        elif name in names:
            start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            parts.append("\n".join(src.splitlines()[start - 1 : node.end_lineno]))
            found.add(name)
    return "\n\n".join(p for p in parts if p), found


class ActorConfig:
    """Stand-in for verl's ActorConfig: the fields the compared policy losses read."""

    def __init__(self, clip_ratio: float, clip_ratio_low: float | None = None, clip_ratio_high: float | None = None):
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high = clip_ratio, clip_ratio_low, clip_ratio_high
        self.global_batch_info: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def load_verl(src: Path) -> types.SimpleNamespace:
    """verl's functions, read from its source tree ``src`` (the directory holding ``verl/``)."""
    tf_src, _ = _functions(src / "verl/utils/torch_functional.py", {"masked_sum", "masked_mean"})
    verl_f: dict[str, Any] = {"torch": torch}
    exec(compile(tf_src, "verl/utils/torch_functional.py", "exec"), verl_f)
    ns: dict[str, Any] = {
        "torch": torch, "math": math, "Optional": Optional, "Any": Any, "ActorConfig": ActorConfig,
        "DictConfig": dict, "AlgoConfig": type("AlgoConfig", (), {}), "verl_F": types.SimpleNamespace(**verl_f),
        "register_policy_loss": lambda name: (lambda fn: fn), "deprecated": lambda *a, **k: (lambda fn: fn),
    }  # fmt: skip
    wanted = {
        "verl/trainer/ppo/core_algos.py": {"agg_loss", "compute_policy_loss_gspo", "compute_policy_loss_cispo",
                                           "compute_policy_loss_vanilla"},
        "verl/trainer/ppo/rollout_corr_helper.py": {"_parse_rollout_is_threshold", "_parse_rollout_rs_thresholds",
                                                    "compute_rollout_correction_weights", "compute_is_metrics",
                                                    "compute_rollout_rejection_mask", "compute_rs_metrics"},
    }  # fmt: skip
    missing = []
    for rel, names in wanted.items():
        code, found = _functions(src / rel, names)
        missing += sorted(names - found)
        exec(compile(code, rel, "exec"), ns)
    if missing:
        raise SystemExit(f"verl source at {src} lacks {missing} (another verl version?)")
    return types.SimpleNamespace(**{k: v for k, v in ns.items() if callable(v) or k.isupper()})


def fetch_verl(tmp: Path, version: str) -> Path:
    """pip-download verl's wheel (no dependencies, nothing installed) and unpack it; return the source root."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"verl=={version}", "--no-deps", "-d", str(tmp)],
                   check=True)  # fmt: skip
    wheel = next(tmp.glob("verl-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp / "src")
    return tmp / "src"


# ---------------------------------------------------------------------------------------------- the cases


def case(seed: int, B: int = 6, T: int = 7, spread: float = 0.3) -> dict[str, torch.Tensor]:
    """Right-padded outputs of lengths 2..T, per-token advantages broadcast from per-output ones, float64."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    old = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3) * mask
    rollout = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread) * mask
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.15 * mask
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).contiguous()
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    return {"mask": mask, "old": old, "rollout": rollout, "logp": logp, "adv": adv, "ent": ent}


def compare_weights(
    verl: Any, c: dict[str, torch.Tensor], level: str, low: float | None, high: float
) -> dict[str, float]:
    """Max abs difference of the weights, and the share of units truncated / rejected (the bounds were active)."""
    from stages.rl.corrections import rollout_correction

    m = c["mask"]
    spec = high if low is None else f"{low}_{high}"
    theirs, _ = verl.compute_rollout_correction_weights(c["old"] - c["rollout"], m, rollout_is=level,
                                                        rollout_is_threshold=spec)  # fmt: skip
    if low is None:  # TIS: upper bound only
        ours = rollout_correction(c["old"], c["rollout"], m, weight_level=level, truncate_high=high)
    else:  # IcePop: the raw ratio, zero outside [low, high]
        ours = rollout_correction(c["old"], c["rollout"], m, weight_level=level, reject_level=level, reject_low=low,
                                  reject_high=high)  # fmt: skip
    active = ours.metrics["is_truncated_high_frac"] + ours.metrics["is_rejected_token_frac"]
    return {"weights": float((ours.weights - theirs * m).abs().max()), "active_frac": active}


def compare_rejection(
    verl: Any, c: dict[str, torch.Tensor], option: str, lower: float, upper: float
) -> dict[str, float]:
    """Max abs difference of the keep masks, and the share of loss tokens rejected."""
    from stages.rl.corrections import rollout_correction

    m = c["mask"]
    theirs, _ = verl.compute_rollout_rejection_mask(c["old"] - c["rollout"], m, rollout_rs=option,
                                                    rollout_rs_threshold=f"{lower}_{upper}")  # fmt: skip
    level = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}[option]
    ours = rollout_correction(c["old"], c["rollout"], m, weight_level=None, reject_level=level,
                              reject_low=1.0 / upper, reject_high=1.0 / lower)  # fmt: skip
    return {"keep": float((ours.keep.double() - theirs * m).abs().max()),
            "rejected_frac": ours.metrics["is_rejected_token_frac"]}  # fmt: skip


def compare_loss(
    verl: Any, c: dict[str, torch.Tensor], kind: str, aggregation: str, weighted: bool
) -> dict[str, float]:
    """Max abs differences of loss value and gradient (log-probs; entropies for the bonus), ours vs verl's.

    verl's "seq-mean-token-mean" divides each output's token sum by its token count + 1e-8: differences ~1e-9 there."""
    from stages.rl.corrections import correct
    from stages.rl.losses import cispo_loss, entropy_bonus, grpo_loss, gspo_loss

    m = c["mask"]
    w = correct("tis", c["old"], c["rollout"], m, low=None, high=2.0).weights if weighted else None
    out = {}
    for side in ("ours", "verl"):
        x = (c["ent"] if kind == "entropy" else c["logp"]).clone().requires_grad_(True)
        if side == "verl":
            if kind == "entropy":
                loss = -0.01 * verl.agg_loss(x, m, aggregation)
            else:
                fn = {"gspo": verl.compute_policy_loss_gspo, "cispo": verl.compute_policy_loss_cispo,
                      "grpo": verl.compute_policy_loss_vanilla}[kind]  # fmt: skip
                cfg = ActorConfig(0.2, *({"gspo": (0.03, 0.04), "cispo": (0.5, 0.1)}.get(kind, (0.1, 0.15))))
                loss, _ = fn(c["old"], x, c["adv"], m, loss_agg_mode=aggregation, config=cfg, rollout_is_weights=w)
        else:
            kw = dict(beta=0.0, aggregation=aggregation, is_weights=w)
            if kind == "gspo":
                loss, _ = gspo_loss(x, c["old"], None, c["adv"], m, clip_eps=0.03, clip_eps_high=0.04, **kw)
            elif kind == "cispo":
                loss, _ = cispo_loss(x, c["old"], None, c["adv"], m, min_ratio=0.5, max_ratio=1.1, **kw)
            elif kind == "grpo":
                loss, _ = grpo_loss(x, c["old"], None, c["adv"], m, clip_eps=0.1, clip_eps_high=0.15, **kw)
            else:
                loss, _ = entropy_bonus(x, m, coef=0.01, aggregation=aggregation)
        (g,) = torch.autograd.grad(loss, x)
        out[side] = (loss.detach(), g)
    (lo, go), (lv, gv) = out["ours"], out["verl"]
    return {"loss": float((lo - lv).abs()), "grad": float((go - gv).abs().max()), "grad_norm": float(go.norm())}


def run_all(verl: Any, seeds: range = range(3)) -> dict[str, Any]:
    res: dict[str, Any] = {"weights": {}, "rejection": {}, "loss": {}}
    for level in ("token", "sequence"):
        for low, high in ((None, 2.0), (None, 1.2), (0.5, 2.0), (0.8, 1.25)):
            key = f"{level} {'TIS' if low is None else 'IcePop'} {low}_{high}"
            rows = [compare_weights(verl, case(s), level, low, high) for s in seeds]
            res["weights"][key] = {k: max(r[k] for r in rows) for k in rows[0]}
    for option in ("token_k1", "seq_sum_k1", "seq_mean_k1"):
        for lower, upper in ((0.5, 2.0), (0.8, 1.25), (0.9, 1.1)):
            key = f"{option} {lower}_{upper}"
            rows = [compare_rejection(verl, case(s), option, lower, upper) for s in seeds]
            res["rejection"][key] = {k: max(r[k] for r in rows) for k in rows[0]}
    for kind in ("gspo", "cispo", "grpo", "entropy"):
        for agg in AGGREGATIONS:
            for weighted in (False, True) if kind != "entropy" else (False,):
                rows = [compare_loss(verl, case(s), kind, agg, weighted) for s in seeds]
                key = f"{kind} {agg}" + (" + rollout_is_weights" if weighted else "")
                res["loss"][key] = {k: max(r[k] for r in rows) for k in rows[0]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verl-src", type=Path, default=None, help="a directory holding verl/ (default: pip download)")
    ap.add_argument("--verl-version", default=VERL_VERSION)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    from benchmarks._tiny import machine

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="verl-") as tmp:
        src = args.verl_src or fetch_verl(Path(tmp), args.verl_version)
        verl = load_verl(src)
        res = run_all(verl)
    worst = max(
        [r["weights"] for r in res["weights"].values()] + [r["keep"] for r in res["rejection"].values()]
        + [r[k] for r in res["loss"].values() for k in ("loss", "grad")]
    )  # fmt: skip
    out = {"benchmark": "rl_math_vs_verl", "verl_version": args.verl_version if args.verl_src is None else str(src),
           "torch_version": torch.__version__, "dtype": "float64", "seeds": 3, "max_abs_diff_overall": worst, **res,
           "wall_s": round(time.perf_counter() - t0, 1), "machine": machine(),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for group in ("weights", "rejection", "loss"):
        for name, r in res[group].items():
            print(f"{group:10} {name:50} " + " ".join(f"{k}={v:.1e}" for k, v in r.items()))
    print(f"max abs difference overall: {worst:.2e}; wrote {args.out}")
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())

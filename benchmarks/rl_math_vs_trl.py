"""The pure RL functions of issues 31 / 32 against TRL's own code on the same tensors.

Compared (ours -> TRL):

- :func:`stages.rl.corrections.correct` ``tis`` / ``mis`` / ``seq-tis`` / ``seq-mis`` -> the importance-sampling
  ratio of ``GRPOTrainer._generate_and_score_completions`` with ``vllm_importance_sampling_mode`` ``token_truncate``
  / ``token_mask`` / ``sequence_truncate`` / ``sequence_mask`` (weights and its logged min / mean / max, and the
  sampler-trainer log-prob difference it logs);
- :func:`stages.rl.losses.grpo_loss` with ``is_weights`` (the correction inside the loss), :func:`gspo_loss`
  (``importance_sampling_level="sequence"``), :func:`cispo_loss` (``loss_type="cispo"``) and :func:`entropy_bonus`
  (``entropy_coef``) -> ``GRPOTrainer._compute_loss``: loss value and gradients with respect to the per-token
  log-probs and entropies;
- :func:`stages.rl.reward_shaping.overlong_penalty` -> ``trl.rewards.get_soft_overlong_punishment``.

TRL keeps the correction and the losses inside GRPOTrainer, not as free functions. :class:`Harness` is a real
GRPOTrainer (over a tiny model, built once) whose two model-facing methods return injected tensors:
``_get_per_token_logps_and_entropies`` (the policy's per-token log-probs and entropies, with gradient, in place of a
forward pass) and ``_generate`` (completion ids and the sampler's log-probs, in place of vLLM). Everything between
those and the outputs is TRL's code path; the trainer's attributes that the config would set (``loss_type``,
``importance_sampling_level``, epsilons, ``beta``, ``entropy_coef``, ``use_vllm``, ...) are set per case.

Correspondences (module docstrings of stages.rl.losses / corrections say why): TRL "grpo" / "bnpo" / "dr_grpo"
aggregation = ours "seq-mean-token-mean" / "token-mean" / "seq-mean-token-sum-norm" (every output with a loss
token, L_max = T); TRL cispo ``epsilon_high`` = our ``max_ratio`` (no lower bound); TRL's entropy bonus = ours with
"token-mean"; TRL ``use_bias_correction_kl`` off (DeepSeekMath's plain k3 KL). TRL builds the sampler log-probs from
Python floats into a float32 tensor: our side gets the same float32-rounded values.

TRL is in the pyproject extra ``bench`` (``pip install -e '.[bench]'``: it leaves torch as it is). ::

    python benchmarks/rl_math_vs_trl.py    # -> benchmarks/results/rl_math_vs_trl.json (max abs differences)

tests/benchmarks/test_rl_math_vs_trl.py runs the same comparisons (skipped without trl) and asserts 1e-6.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "rl_math_vs_trl.json"
MODES = {"tis": "token_truncate", "mis": "token_mask", "seq-tis": "sequence_truncate", "seq-mis": "sequence_mask"}
AGG_TO_TRL = {"seq-mean-token-mean": "grpo", "token-mean": "bnpo", "seq-mean-token-sum-norm": "dr_grpo"}


# ---------------------------------------------------------------------------------------------- the TRL side


def build_harness(model_dir: Path, batch: int = 6) -> Any:
    """A GRPOTrainer over ``model_dir`` (CPU, float32, beta 0) whose model-facing methods return injected tensors."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from stages.core.modeling import load_tokenizer

    class Harness(GRPOTrainer):
        inj_logps: torch.Tensor | None = None
        inj_entropies: torch.Tensor | None = None
        inj_generate: tuple | None = None

        def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kw: Any) -> Any:
            return self.inj_logps, self.inj_entropies, None

        def _generate(self, prompts: Any) -> Any:
            return self.inj_generate

    def zero_reward(completions: list[Any], **_: Any) -> list[float]:
        return [0.0] * len(completions)

    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-harness-"), per_device_train_batch_size=batch, num_generations=2,
        max_completion_length=8, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
        beta=0.0, model_init_kwargs={"dtype": "float32"}, disable_tqdm=True, logging_steps=1, log_completions=False,
        use_bias_correction_kl=False,
    )  # fmt: skip
    data = datasets.Dataset.from_list([{"prompt": "1 + 1 ="}] * batch)
    tr = Harness(model=str(model_dir), reward_funcs=[zero_reward], args=cfg, train_dataset=data,
                 processing_class=load_tokenizer(model_dir))  # fmt: skip
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1
    return tr


def trl_is_ratio(tr: Any, trainer_lp: torch.Tensor, sampler_lp: list[list[float]], tool_mask: torch.Tensor,
                 mode: str, clip_min: float | None, clip_max: float | None) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """TRL's importance-sampling ratio ((B, T) or (B, 1)) and its logged metrics, from ``_generate_and_score_completions``
    with the trainer's log-probs ``trainer_lp`` (B, T) and, per output, the sampler's log-probs (its length is the
    output's completion length) and ``tool_mask`` (B, T) (0 = tool output)."""
    B = len(sampler_lp)
    lengths = [len(x) for x in sampler_lp]
    ids = [[5 + (i + t) % 50 for t in range(n)] for i, n in enumerate(lengths)]
    tool = [tool_mask[i, :n].long().tolist() for i, n in enumerate(lengths)]
    tr.inj_generate = ([[3, 4]] * B, ids, tool, ["x"] * B, sampler_lp, {}, None, None)
    tr.inj_logps, tr.inj_entropies = trainer_lp, None
    tr.use_vllm = True
    tr.vllm_importance_sampling_correction = True
    tr.vllm_importance_sampling_mode = mode
    tr.vllm_importance_sampling_clip_min, tr.vllm_importance_sampling_clip_max = clip_min, clip_max
    tr.beta = 0.0
    tr._metrics["train"].clear()
    out = tr._generate_and_score_completions([{"prompt": "1 + 1 ="} for _ in range(B)])
    met = {k.split("/", 1)[1]: v[-1] for k, v in tr._metrics["train"].items() if k.startswith("sampling/")}
    return out["importance_sampling_ratio"], met


def trl_loss(tr: Any, *, logp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None, adv: torch.Tensor,
             mask: torch.Tensor, tool_mask: torch.Tensor | None = None, loss_type: str, level: str = "token",
             eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0, entropy: torch.Tensor | None = None,
             entropy_coef: float = 0.0, is_ratio: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """TRL's ``_compute_loss`` on injected per-token log-probs ``logp`` (and entropies) with these inputs."""
    B, T = mask.shape
    tr.inj_logps, tr.inj_entropies = logp, (entropy if entropy is not None else torch.zeros_like(logp))
    tr.loss_type, tr.importance_sampling_level = loss_type, level
    tr.epsilon_low, tr.epsilon_high, tr.beta = eps_low, eps_high, beta
    tr.entropy_coef, tr.use_adaptive_entropy = entropy_coef, False
    tr._entropy_bonus_enabled = entropy_coef != 0.0
    tr.top_entropy_quantile, tr.off_policy_mask_threshold = 1.0, None
    tr.use_vllm = tr.vllm_importance_sampling_correction = is_ratio is not None
    tr.max_completion_length = T
    inputs: dict[str, Any] = {
        "prompt_ids": torch.full((B, 2), 3, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.full((B, T), 5, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": adv, "old_per_token_logps": old,
        "num_items_in_batch": (mask * (tool_mask if tool_mask is not None else 1)).sum(),
    }  # fmt: skip
    if tool_mask is not None:
        inputs["tool_mask"] = tool_mask.long()
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    tr._metrics["train"].clear()
    return type(tr).__mro__[1]._compute_loss(tr, tr.model, inputs)


# ---------------------------------------------------------------------------------------------- the cases


def case(seed: int, B: int = 6, T: int = 7, spread: float = 0.3) -> dict[str, Any]:
    """Random tensors: right-padded outputs of lengths 1..T (every output has a loss token), one tool-output token
    inside output 0, one NaN sampler log-prob, per-output advantages."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    tool = torch.ones(B, T, dtype=torch.float64)
    tool[0, 1] = 0.0
    old = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3) * mask
    sampler = old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    sampler = sampler.float().double()  # TRL's sampler log-probs pass through a float32 tensor
    sampler[3, 0] = math.nan
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.15 * mask
    ref = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3 * mask
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return {"mask": mask, "tool": tool, "old": old, "sampler": sampler, "logp": logp, "ref": ref, "ent": ent,
            "adv": adv, "lengths": lengths}  # fmt: skip


def _sampler_lists(c: dict[str, Any]) -> list[list[float]]:
    return [c["sampler"][i, : int(n)].tolist() for i, n in enumerate(c["lengths"])]


def compare_correction(
    tr: Any, c: dict[str, Any], method: str, low: float | None, high: float | None
) -> dict[str, float]:
    """Max abs differences, ours vs TRL, of the IS weights (B, T over loss tokens) and TRL's logged metrics."""
    from stages.rl.corrections import correct

    m = c["mask"] * c["tool"]
    trl_w, trl_m = trl_is_ratio(tr, c["old"], _sampler_lists(c), c["tool"], MODES[method], low, high)
    ours = correct(method, c["old"], c["sampler"], m, low=low, high=high)
    trl_full = trl_w.expand_as(m) * m
    pairs = {"weights": (ours.weights, trl_full)}
    met = {"weight_min": ("is_weight_min", "importance_sampling_ratio/min"),
           "weight_mean": ("is_weight_mean", "importance_sampling_ratio/mean"),
           "weight_max": ("is_weight_max", "importance_sampling_ratio/max"),
           "logp_diff_mean": ("mismatch_abs_mean", "sampling_logp_difference/mean"),
           "logp_diff_max": ("mismatch_abs_max", "sampling_logp_difference/max")}  # fmt: skip
    out = {k: float((a - b).abs().max()) for k, (a, b) in pairs.items()}
    out.update({k: abs(ours.metrics[a] - trl_m[b]) for k, (a, b) in met.items()})
    out["nonzero_weights"] = float((ours.weights != 0).sum())
    return out


def _grads(loss: torch.Tensor, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, xs, allow_unused=True))


def compare_loss(tr: Any, c: dict[str, Any], kind: str, aggregation: str, *, beta: float = 0.04,
                 is_method: str | None = None) -> dict[str, float]:  # fmt: skip
    """Max abs differences of loss value and gradients (w.r.t. log-probs and entropies), ours vs TRL's _compute_loss.

    kind: "grpo" (the clipped loss; with ``is_method`` the correction's weights inside it), "gspo", "cispo",
    "entropy" (grpo + the entropy bonus)."""
    from stages.rl.corrections import correct
    from stages.rl.losses import LossNormalizer, cispo_loss, entropy_bonus, grpo_loss, gspo_loss

    m = c["mask"] * c["tool"]
    is_trl = w = None
    if is_method is not None:
        is_trl, _ = trl_is_ratio(tr, c["old"], _sampler_lists(c), c["tool"], MODES[is_method], 0.5, 2.0)
        w = correct(is_method, c["old"], c["sampler"], m, low=0.5, high=2.0).weights
    eps = {"gspo": (3e-2, 4e-2)}.get(kind, (0.1, 0.15))  # small enough that some tokens / outputs are clipped
    max_ratio = 1.1
    sides = {}
    for side in ("ours", "trl"):
        lp = c["logp"].clone().requires_grad_(True)
        ent = c["ent"].clone().requires_grad_(True)
        if side == "trl":
            loss = trl_loss(
                tr, logp=lp, old=c["old"], ref=c["ref"], adv=c["adv"], mask=c["mask"], tool_mask=c["tool"],
                loss_type="cispo" if kind == "cispo" else AGG_TO_TRL[aggregation],
                level="sequence" if kind == "gspo" else "token", eps_low=eps[0],
                eps_high=max_ratio if kind == "cispo" else eps[1], beta=beta, entropy=ent,
                entropy_coef=0.01 if kind == "entropy" else 0.0, is_ratio=is_trl,
            )  # fmt: skip
        else:
            norm = LossNormalizer.from_mask(m)
            kw = dict(beta=beta, aggregation=aggregation, normalizer=norm, is_weights=w)
            if kind == "gspo":
                loss, met = gspo_loss(lp, c["old"], c["ref"], c["adv"], m, clip_eps=eps[0], clip_eps_high=eps[1], **kw)
            elif kind == "cispo":
                loss, met = cispo_loss(lp, c["old"], c["ref"], c["adv"], m, max_ratio=max_ratio, **kw)
            else:
                loss, met = grpo_loss(lp, c["old"], c["ref"], c["adv"], m, clip_eps=eps[0], clip_eps_high=eps[1], **kw)
            if kind == "entropy":
                loss = loss + entropy_bonus(ent, m, coef=0.01, aggregation="token-mean", normalizer=norm)[0]
        g = _grads(loss, [lp, ent])
        sides[side] = (loss.detach(), [x if x is not None else torch.zeros_like(lp) for x in g])
    (lo, go), (lt, gt) = sides["ours"], sides["trl"]
    return {"loss": float((lo - lt).abs()), "grad_logp": float((go[0] - gt[0]).abs().max()),
            "grad_entropy": float((go[1] - gt[1]).abs().max()), "loss_value": float(lo),
            "grad_logp_norm": float(go[0].norm()), "grad_entropy_norm": float(go[1].norm()),
            "clip_frac": met["clip_frac_low"] + met["clip_frac_high"]}  # fmt: skip


def compare_overlong() -> dict[str, float]:
    """Ours vs trl.rewards.get_soft_overlong_punishment over every length 0..L_max + 3 for a few (L_max, L_cache)."""
    from trl.rewards import get_soft_overlong_punishment

    from stages.rl.reward_shaping import overlong_penalty

    worst = 0.0
    for max_len, cache in ((20, 5), (64, 16), (10, 10), (7, 1), (100, 20)):
        lengths = list(range(0, max_len + 4))
        theirs = get_soft_overlong_punishment(max_len, cache)([[1] * n for n in lengths])
        ours = overlong_penalty(torch.tensor(lengths), max_len=max_len, buffer_len=cache)
        worst = max(worst, float((ours - torch.tensor(theirs, dtype=torch.float64)).abs().max()))
    return {"penalty": worst}


CORRECTION_CASES = [("tis", 0.5, 2.0), ("tis", None, 1.5), ("mis", 0.7, 1.4), ("mis", None, 1.2),
                    ("seq-tis", 0.5, 2.0), ("seq-tis", None, 1.5), ("seq-mis", 0.5, 2.0), ("seq-mis", 0.8, None)]  # fmt: skip
LOSS_CASES = [(k, a, None) for k in ("gspo", "grpo", "entropy") for a in AGG_TO_TRL] + [
    ("cispo", "token-mean", None), ("grpo", "seq-mean-token-mean", "tis"), ("grpo", "token-mean", "seq-mis"),
    ("gspo", "seq-mean-token-mean", "seq-tis"), ("cispo", "token-mean", "mis"),
]  # fmt: skip


def run_all(tr: Any, seeds: range = range(3)) -> dict[str, Any]:
    """Every case on every seed: the max over seeds of each max abs difference."""
    res: dict[str, Any] = {"correction": {}, "loss": {}}
    for method, low, high in CORRECTION_CASES:
        key = f"{method} low={low} high={high}"
        rows = [compare_correction(tr, case(s, spread=0.3), method, low, high) for s in seeds]
        res["correction"][key] = {k: max(r[k] for r in rows) for k in rows[0]}
    for kind, agg, is_method in LOSS_CASES:
        key = f"{kind} {agg}" + (f" + {is_method}" if is_method else "")
        rows = [compare_loss(tr, case(s), kind, agg, is_method=is_method) for s in seeds]
        res["loss"][key] = {k: max(r[k] for r in rows) for k in rows[0]}
    res["overlong"] = compare_overlong()
    return res


def main() -> int:
    if importlib.util.find_spec("trl") is None:
        bench = ROOT / ".venv-bench" / "bin" / "python"
        if bench.exists() and Path(sys.prefix).resolve() != bench.parent.parent.resolve():
            return subprocess.call([str(bench), __file__, *sys.argv[1:]])
        print("trl is not installed here (pip install -e '.[bench]'; see this script's docstring)", file=sys.stderr)
        return 2
    import trl

    from benchmarks._tiny import build_tiny_model, machine

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rl-math-vs-trl-") as tmp:
        tr = build_harness(build_tiny_model(Path(tmp) / "model", n_texts=200))
        res = run_all(tr)
    worst = max(
        [v for r in res["correction"].values() for k, v in r.items() if k != "nonzero_weights"]
        + [r[k] for r in res["loss"].values() for k in ("loss", "grad_logp", "grad_entropy")]
        + [res["overlong"]["penalty"]]
    )  # fmt: skip
    out = {"benchmark": "rl_math_vs_trl", "trl_version": trl.__version__, "torch_version": torch.__version__,
           "dtype": "float64 (TRL's sampler log-probs float32-rounded on both sides)", "seeds": 3,
           "max_abs_diff_overall": worst, **res, "wall_s": round(time.perf_counter() - t0, 1), "machine": machine(),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    for group in ("correction", "loss"):
        for name, r in res[group].items():
            print(f"{group:10} {name:42} " + " ".join(f"{k}={v:.1e}" for k, v in r.items()))
    print(
        f"overlong   penalty={res['overlong']['penalty']:.1e}\nmax abs difference overall: {worst:.2e}; wrote {RESULTS}"
    )
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())

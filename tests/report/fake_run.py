"""A small fake run: every input of the report stage, with the keys the stages write (values made up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODELS = ("base", "pretrain", "sft", "sft_continued", "grpo")
GREEDY = {"base": {"cot": 0.0}, "pretrain": {"cot": 0.054}, "sft": {"cot": 0.386, "pot": 0.782, "tir": 0.742},
          "sft_continued": {"cot": 0.364}, "grpo": {"cot": 0.55, "pot": 0.792, "tir": 0.806}}
SAMPLED = {"sft": ([0.35, 0.45, 0.55, 0.62], [0.35, 0.33, 0.34, 0.35]),
           "grpo": ([0.5, 0.58, 0.65, 0.70], [0.5, 0.47, 0.46, 0.46])}


def _w(root: Path, rel: str, obj: Any) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=1) if not isinstance(obj, str) else obj, encoding="utf-8")


def _per_problem(a: float, n: int, model: str) -> list[int]:
    """0/1 per problem with mean ``a`` (deterministic): mostly the same problems for every model, the continued-SFT
    baseline on a shuffled set (its difference from SFT is within noise)."""
    right = round(a * n)
    mult = 7 if model == "sft_continued" else 1
    return [1 if (i * mult) % n < right else 0 for i in range(n)]


def _verifiers(a: float, n: int) -> dict[str, Any]:
    return {"n": n, "strict": {"acc": a, "wrong": round((1 - a) * n), "timeout": 0, "refused": 0},
            "deepseekmath": {"acc": round(min(1.0, a + 0.012), 4), "wrong": round((1 - a) * n) - 6, "timeout": 0,
                             "refused": 0},
            "math_verify": {"acc": round(min(1.0, a + 0.004), 4), "wrong": round((1 - a) * n) - 2, "timeout": 1,
                            "refused": 0},
            "disagreements": {"deepseekmath/strict": 6, "deepseekmath/math_verify": 4, "strict/math_verify": 2},
            "kinds": {"right only by deepseekmath": {"count": 4, "samples": [
                {"id": "generated-17", "answer": "12", "gold": "12", "verdicts": {
                    "strict": "wrong", "deepseekmath": "right", "math_verify": "wrong"},
                 "tail": "3 + 4 = 7\n7 + 5 = 12"}]},
                "right only by deepseekmath + math_verify": {"count": 2, "samples": [
                    {"id": "generated-40", "answer": ["5", "8"], "gold": "8", "verdicts": {
                        "strict": "wrong", "deepseekmath": "right", "math_verify": "right"},
                     "tail": "The answer is \\boxed{5}. No: \\boxed{8}."}]}}}


def _evaluate(model: str) -> dict[str, Any]:
    gen: dict[str, Any] = {}
    n = 100 if model == "base" else 500
    ids = [f"generated-{i}" for i in range(n)]
    for mode, a in GREEDY[model].items():
        pp = _per_problem(a, n, model)
        gen[mode] = {"greedy": {"acc": round(sum(pp) / n, 4), "acc_se": round((a * (1 - a) / (n - 1)) ** 0.5, 4),
                                "n": n, "no_answer": 0.01, "truncated": 0.02, "mean_tokens": 40.5,
                                "by_difficulty": {"1": {"acc": min(1.0, a + 0.1), "n": 170},
                                                  "2": {"acc": a, "n": 165}, "3": {"acc": max(0.0, a - 0.1), "n": 165}},
                                "timeouts": 0, "refused": 0, "per_problem": {"ids": ids, "acc": pp},
                                "verifiers": _verifiers(a, n), "prompt_sha256": "0123456789abcdef",
                                "sampling": {"temperature": 0.0, "top_p": 1.0, "n": 1, "max_new_tokens": 80,
                                             "seed": 0, "stop": [], "tir_max_rounds": None},
                                "wall_s": 3.0}}
    if model in SAMPLED:
        p, m = SAMPLED[model]
        s = {"n": 100, "n_samples": 8, "temperature": 0.7, "no_answer": 0.01, "wall_s": 20.0, "avg@8": p[0],
             "avg@8_se": 0.03}
        for k, pv, mv in zip((1, 2, 4, 8), p, m, strict=True):
            s[f"pass@{k}"], s[f"maj@{k}"] = pv, mv
            s[f"pass@{k}_se"], s[f"maj@{k}_se"] = 0.04, 0.045
        s["per_problem"] = {"ids": ids[:100], "avg@8": [x * 0.875 for x in _per_problem(p[0], 100, model)],
                            "pass@8": _per_problem(p[3], 100, model), "maj@8": _per_problem(m[3], 100, model)}
        s["verifiers"] = _verifiers(p[0], 800)
        gen["cot"]["sample"] = s
    return {"model": model, "prompting": "few_shot" if model in ("base", "pretrain") else "zero_shot",
            "checker": {"headline": "strict", "report": "deepseekmath", "version": "2", "timeout_s": 5.0,
                        "math_verify": "0.9.0"}, "seeds": {"sampling": 0, "maj_subsets": 0},
            "generated": gen, "resumed_problems": 0, "generated_tokens": 12345, "wall_s": 12.5}


def write_fake_run(root: Path, skip: tuple[str, ...] = ()) -> Path:
    """Write every report input under ``root`` (a project root), except the stages / files named in ``skip``
    (a stage name, ``evaluate_<model>``, ``plots_grpo``, ``paradigm``, ``paradigm_rm``, ``iterative``)."""
    metrics = {
        "data": {"problems": {"test": 500, "sft": 4000, "rl": 2000},
                 "crawl": {"pages": 12726, "math_pages": 3740, "domains": 144, "seed_pages": 1500,
                           "near_dup_pages": 606, "contaminated_pages": 126}, "wall_s": 3.3},
        "corpus": {"pages_in": 12726, "rounds_run": 3, "math_pages": 3385, "math_tokens": 1128196,
                   "general_pages": 8653, "duplicates_removed": {"near": 254, "exact": 308},
                   "contaminated_removed": {"generated": 126}, "problems_removed": {"sft": 81, "rl": 42},
                   "rounds": [{"round": 1, "collected": 1540, "new": 1540, "overlap_with_previous": None,
                               "precision": 1.0, "recall": 0.4466, "f1": 0.6175},
                              {"round": 2, "collected": 3070, "new": 1530, "overlap_with_previous": 0.5016,
                               "precision": 1.0, "recall": 0.8904, "f1": 0.942},
                              {"round": 3, "collected": 3375, "new": 305, "overlap_with_previous": 0.9096,
                               "precision": 1.0, "recall": 0.9788, "f1": 0.9893}], "wall_s": 8.4},
        "base_model": {"mode": "tiny", "n_params": 3934464, "vocab_size": 2048, "wall_s": 1.5},
        "pretrain": {"steps": 300, "tokens": 1228800, "tokens_per_s": 12014.6, "train_loss_first": 7.41,
                     "train_loss_last": 0.748, "eval_loss_before": 7.68, "eval_loss_after": 0.801,
                     "perplexity_before": 2158.5, "perplexity_after": 2.23, "precision": "bf16", "wall_s": 107.5},
        "sft": {"steps": 250, "train_examples": 3719, "kept": {"cot": 2199, "pot": 755, "tir": 765},
                "dropped_unverified": {"cot": 0, "pot": 0, "tir": 0}, "train_loss_first": 1.255,
                "train_loss_last": 0.1145, "val_loss_before": 1.1875, "val_loss_best": 0.1163, "wall_s": 163.4},
        "reward_model": {"heldout": {"outcome_auc": 0.6492, "step_auc": 0.6774, "n_examples": 48, "n_steps": 147},
                         "heldout_before_training": {"outcome_auc": 0.3235, "step_auc": 0.4881, "n_examples": 48,
                                                     "n_steps": 147},
                         "train": {"outcome_auc": 0.8605, "step_auc": 0.8969, "n_examples": 144, "n_steps": 483},
                         "n_train_examples": 144, "n_heldout_examples": 48, "loss_per_epoch": [0.567, 0.431],
                         "wall_s": 15.2},
        "grpo": {"algorithm": "grpo", "grpo": {"steps": 40, "reward_mean_first5": 0.25, "reward_mean_last5": 0.41,
                                               "accuracy_first5": 0.25, "accuracy_last5": 0.41, "kl_first5": 0.01,
                                               "kl_last5": 0.05, "step_s_mean": 2.9},
                 "baseline": {"steps": 40, "sft_loss_first": 0.2, "sft_loss_last": 0.15}, "wall_s": 130.0},
    }
    for stage, m in metrics.items():
        if stage not in skip:
            _w(root, f"data/details/{stage}.json", m)
    for model in MODELS:
        if f"evaluate_{model}" not in skip:
            _w(root, f"data/details/evaluate_{model}.json", _evaluate(model))
    for stage, (first, last) in (("pretrain", (7.4, 0.75)), ("sft", (1.25, 0.11))):
        if stage in skip:
            continue
        rows = ["step\tloss\tlr\tgrad_norm\ttokens_per_s\tskipped"]
        rows += [f"{s}\t{first + (last - first) * s / 100:.4f}\t0.0003\t1.0\t9000\t0" for s in range(5, 101, 5)]
        _w(root, f"data/plots/{stage}/train.tsv", "\n".join(rows) + "\n")
        _w(root, f"data/plots/{stage}/eval.tsv", f"step\teval_loss\n50\t{(first + last) / 2}\n100\t{last}\n")
    if "plots_grpo" not in skip and "grpo" not in skip:
        curves = {"reward_mean": lambda s: 0.2 + 0.005 * s, "accuracy": lambda s: 0.2 + 0.005 * s,
                  "kl": lambda s: 0.001 * s, "completion_len": lambda s: 50 - 0.2 * s}
        for name, f in curves.items():
            _w(root, f"data/plots/grpo/{name}.csv", "step," + name + "\n"
               + "".join(f"{s},{f(s):.4f}\n" for s in range(1, 41)))
        _w(root, "data/plots/grpo/heldout_accuracy.csv", "step,heldout_accuracy\n0,0.37\n20,0.5\n40,0.55\n")
    if "paradigm" not in skip:
        summary = {m: {"seeds": [0, 1, 2], "steps": [0, 20, 40], "mean": [0.37, 0.37 + d, 0.37 + 2 * d],
                       "sd": [0.0, 0.01, 0.02], "final_mean": 0.37 + 2 * d, "final_sd": 0.02}
                   for m, d in (("rft", 0.05), ("online_rft", 0.09), ("grpo_os", 0.088), ("grpo_ps", 0.095),
                                ("grpo_os_rm", -0.17), ("grpo_ps_rm", -0.16))}
        comparison = {"exact": {"paper_order": ["grpo_ps", "grpo_os", "online_rft", "rft"],
                                "measured_order": ["grpo_ps", "online_rft", "grpo_os", "rft"],
                                "pairs": [{"pair": "grpo_ps > grpo_os", "diff": 0.014, "verdict": "agree",
                                           "clear": False}],
                                "pairs_agreeing": 5, "n_pairs": 6, "pairs_clear_agreeing": 3}}
        _w(root, "benchmarks/results/paradigm.json", {"seeds": [0, 1, 2], "summary": summary, "comparison": comparison,
                                                      "note": "fake", "measured_at": "2026-11-30T15:43:15"})
    if "paradigm_rm" not in skip:
        rm = {m: v for m, v in summary.items() if m in ("rft", "online_rft", "grpo_os_rm", "grpo_ps_rm")}
        _w(root, "benchmarks/results/paradigm_rm.json", {
            "seeds": [0, 1, 2], "summary": rm, "note": "fake", "measured_at": "2026-12-01T18:00:00",
            "comparison": {"reward_model": {"paper_order": ["grpo_ps_rm", "grpo_os_rm", "online_rft", "rft"],
                                            "measured_order": ["online_rft", "rft", "grpo_ps_rm", "grpo_os_rm"],
                                            "pairs": [{"pair": "grpo_ps_rm > grpo_os_rm", "diff": 0.01,
                                                       "verdict": "agree", "clear": False}],
                                            "pairs_agreeing": 2, "n_pairs": 6, "pairs_clear_agreeing": 1}}})
    if "iterative" not in skip:
        _w(root, "benchmarks/results/iterative_rl.json", {
            "sft_accuracy": 0.0467, "measured_at": "2026-11-30T10:26:19", "note": "fake",
            "runs": [{"seed": s, "supervision": sup, "accuracy_per_iteration": [0.05 + 0.001 * s, 0.06]}
                     for s in range(3) for sup in ("process_rm", "outcome_rm")]})
    return root

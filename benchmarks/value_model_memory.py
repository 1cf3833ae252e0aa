"""Analytic memory of PPO's value model at 7B, against GRPO (the paper's efficiency argument, section 4.1.1).

    python benchmarks/value_model_memory.py        # writes benchmarks/results/value_model_memory.json, prints a table

The models are counted exactly (instantiated on the meta device, no weights): DeepSeek-Coder-Base-v1.5 7B, the
model params/deepseekmath-7b.yaml starts from, as a Llama-architecture config (hidden 4096, intermediate 11008, 30
layers, 32 heads, vocabulary 102400, untied embeddings: the published config of DeepSeek-LLM / Coder 7B; not
downloadable here, so written out below). The policy is the causal LM; the value model and the reward model are the
same backbone with a scalar head and no LM head (stages/rl/value.py, stages/rl/rm/model.py).

Bytes per parameter as a bf16 mixed-precision run with Adam holds them (the ZeRO paper's accounting; DeepSpeed's bf16
mode): a trained model keeps bf16 weights (2) and gradients (2) plus fp32 master weights and both Adam moments
(4 + 4 + 4) = 16 bytes; a frozen model (the reference, the reward model) keeps its bf16 weights only = 2 bytes.
Per GPU under ZeRO-2 on N GPUs: weights whole, gradients and optimizer states divided by N. Activations, the KV
cache of the rollout engine and buffers come on top and are not counted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "results" / "value_model_memory.json"
CONFIG_7B = {"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 30,
             "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
             "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
TRAINED_BYTES = {"bf16 weights": 2, "bf16 gradients": 2, "fp32 master weights": 4, "fp32 Adam m": 4, "fp32 Adam v": 4}
FROZEN_BYTES = {"bf16 weights": 2}
GPUS = 8
GIB = 2**30


def count(kind: str, cfg: dict[str, Any]) -> int:
    """Parameters of the causal LM (``policy``) or of the scalar-head model (``value``) for ``cfg``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

    c = LlamaConfig(**cfg, num_labels=1)
    with torch.device("meta"):
        m = LlamaForCausalLM(c) if kind == "policy" else LlamaForTokenClassification(c)
    return sum(p.numel() for p in m.parameters())


def model_memory(n: int, trained: bool, gpus: int = GPUS) -> dict[str, Any]:
    """Bytes of one model (module docstring): total, by part, and per GPU under ZeRO-2 on ``gpus`` GPUs."""
    parts = TRAINED_BYTES if trained else FROZEN_BYTES
    by = {k: n * b for k, b in parts.items()}
    per_gpu = sum(v if k == "bf16 weights" else v / gpus for k, v in by.items())
    return {"parameters": n, "bytes_per_parameter": sum(parts.values()), "total_gib": sum(by.values()) / GIB,
            "by_part_gib": {k: v / GIB for k, v in by.items()}, "zero2_per_gpu_gib": per_gpu / GIB}


def main() -> int:
    n_pol, n_val = count("policy", CONFIG_7B), count("value", CONFIG_7B)
    models = {"policy (trained)": model_memory(n_pol, True), "value model (trained)": model_memory(n_val, True),
              "reference (frozen)": model_memory(n_pol, False), "reward model (frozen)": model_memory(n_val, False)}
    setups = {"GRPO, rule reward": ["policy (trained)", "reference (frozen)"],
              "GRPO, reward model (the paper)": ["policy (trained)", "reference (frozen)", "reward model (frozen)"],
              "PPO (value model + reward model)": ["policy (trained)", "value model (trained)", "reference (frozen)",
                                                   "reward model (frozen)"]}
    totals = {name: {"models": ms, "total_gib": sum(models[m]["total_gib"] for m in ms),
                     "zero2_per_gpu_gib": sum(models[m]["zero2_per_gpu_gib"] for m in ms),
                     "trained_parameters": sum(models[m]["parameters"] for m in ms if "trained" in m)}
              for name, ms in setups.items()}
    ppo, grpo = totals["PPO (value model + reward model)"], totals["GRPO, reward model (the paper)"]
    out = {"config": CONFIG_7B, "gpus_for_zero2": GPUS, "models": models, "setups": totals,
           "ppo_over_grpo_total": ppo["total_gib"] / grpo["total_gib"],
           "value_model_share_of_ppo": models["value model (trained)"]["total_gib"] / ppo["total_gib"]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'model':<26}{'params (B)':>11}{'B/param':>8}{'total GiB':>11}{f'ZeRO-2/{GPUS} GiB/GPU':>20}")
    for k, v in models.items():
        print(f"{k:<26}{v['parameters'] / 1e9:>11.3f}{v['bytes_per_parameter']:>8}{v['total_gib']:>11.1f}"
              f"{v['zero2_per_gpu_gib']:>20.1f}")
    for k, v in totals.items():
        print(f"{k:<36} total {v['total_gib']:6.1f} GiB, ZeRO-2 {v['zero2_per_gpu_gib']:5.1f} GiB/GPU, "
              f"trained {v['trained_parameters'] / 1e9:.2f}B")
    print(f"PPO / GRPO (both with a reward model): {out['ppo_over_grpo_total']:.2f}x; the value model is "
          f"{100 * out['value_model_share_of_ppo']:.0f}% of PPO's model memory. Wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The paper's reference numbers that the report puts beside ours, each with its source.

Source: Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv:2402.03300 v3 (27 Apr 2024); table, figure or section given per entry. Accuracies are top-1 greedy in
percent, as printed. The paper's models are 7B on GSM8K / MATH; the tiny default's are a 4M-parameter Llama on
generated word problems, so the report labels which benchmark each of our numbers comes from and never mixes
them silently.

Which of our models stands for which of the paper's: ``pretrain`` for DeepSeekMath-Base 7B (continual
pretraining on the math corpus), ``sft`` for DeepSeekMath-Instruct 7B, ``grpo`` for DeepSeekMath-RL 7B.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = "DeepSeekMath (arXiv:2402.03300 v3)"
PAPER_URL = "https://arxiv.org/abs/2402.03300"

# our model key -> the paper's model it stands for
MODEL_NAMES = {"pretrain": "DeepSeekMath-Base 7B", "sft": "DeepSeekMath-Instruct 7B", "grpo": "DeepSeekMath-RL 7B"}


@dataclass(frozen=True)
class Accuracy:
    """One accuracy of the paper: ``model`` (our key), benchmark, prompting mode, value in percent, source."""

    model: str
    benchmark: str  # "gsm8k" | "math"
    mode: str  # our evaluate mode: "cot" | "pot" | "tir"
    percent: float
    source: str
    prompting: str  # how the paper evaluated it


ACCURACIES: tuple[Accuracy, ...] = (
    # Table 2: DeepSeekMath-Base 7B, few-shot chain-of-thought
    Accuracy("pretrain", "gsm8k", "cot", 64.2, "Table 2", "few-shot CoT"),
    Accuracy("pretrain", "math", "cot", 36.2, "Table 2", "few-shot CoT"),
    # Table 3: DeepSeekMath-Base 7B, few-shot program-aided (Python)
    Accuracy("pretrain", "gsm8k", "pot", 66.9, "Table 3", "few-shot PoT (GSM8K+Python)"),
    Accuracy("pretrain", "math", "pot", 31.4, "Table 3", "few-shot PoT (MATH+Python)"),
    # Table 5: Instruct and RL 7B, zero-shot top-1 greedy; "Tool" = tool-integrated reasoning
    Accuracy("sft", "gsm8k", "cot", 82.9, "Table 5", "zero-shot CoT"),
    Accuracy("sft", "math", "cot", 46.8, "Table 5", "zero-shot CoT"),
    Accuracy("sft", "gsm8k", "tir", 83.7, "Table 5", "zero-shot tool-integrated"),
    Accuracy("sft", "math", "tir", 57.4, "Table 5", "zero-shot tool-integrated"),
    Accuracy("grpo", "gsm8k", "cot", 88.2, "Table 5", "zero-shot CoT"),
    Accuracy("grpo", "math", "cot", 51.7, "Table 5", "zero-shot CoT"),
    Accuracy("grpo", "gsm8k", "tir", 86.7, "Table 5", "zero-shot tool-integrated"),
    Accuracy("grpo", "math", "tir", 58.8, "Table 5", "zero-shot tool-integrated"),
)


@dataclass(frozen=True)
class Claim:
    """A finding of the paper without a number we can match (or with one): what it says and where."""

    key: str
    text: str
    source: str


CLAIMS: dict[str, Claim] = {c.key: c for c in (
    Claim("rl_gain", "RL (GRPO) improves on Instruct: +5.3 points GSM8K and +4.9 MATH, CoT top-1 greedy "
          "(82.9 -> 88.2, 46.8 -> 51.7)", "Table 5"),
    Claim("maj_not_pass", "RL enhances Maj@K but not Pass@K (Instruct vs RL 7B, temperature 0.7)", "Figure 7"),
    Claim("corpus_rounds", "4 collection iterations; in the 4th, nearly 98% of the data had already been collected "
          "in the 3rd, so collection stopped", "section 2.1, Figure 2"),
    Claim("corpus_size", "final corpus: 35.5M web pages, 120B tokens", "section 2.1, Table 1"),
    Claim("paradigm_order", "GRPO+PS > GRPO+OS > Online RFT > RFT (held-out accuracy during training, "
          "Instruct 1.3B, GSM8K and MATH; online RFT clearly beats RFT later in training)", "Figure 5, section 5.2.1"),
    Claim("iterative", "iterative RL (2 iterations, the reward model retrained with 10% replay) "
          "significantly improves performance, especially at the first iteration", "Figure 6, sections 4.1.4 and 5.2.1"),
    Claim("rm_auc", "reward-model accuracy or AUC: not stated (the RM is initialised from DeepSeekMath-Base 7B, "
          "trained at LR 2e-5 on Math-Shepherd-style labels)", "section 4.2"),
)}

# Figure 5's order, in our method names (benchmarks/paradigm.py METHODS); exact rewards, then learned RMs
PARADIGM_ORDER = ("grpo_ps", "grpo_os", "online_rft", "rft")
PARADIGM_ORDER_RM = ("grpo_ps_rm", "grpo_os_rm", "online_rft", "rft")
CORPUS_ITERATIONS = 4
CORPUS_LAST_OVERLAP = 0.98  # "nearly 98%" (section 2.1)

"""Schema of params.yaml's ``sft`` section: supervised fine-tuning on CoT / PoT / TIR solutions (paper 3)."""

from __future__ import annotations

from pydantic import field_validator

from stages.schema.base import DataPath, Fraction, PosInt, Section
from stages.schema.train import DeepSpeedParams, LauncherParams, TrainLoopParams


class SftFormatMix(Section):
    """Shares of the solution formats in the SFT data (must sum to 1). Paper 3.1 trains on CoT, PoT and
    tool-integrated solutions without giving counts per format: the default shares are ours."""

    cot: Fraction = 0.4
    """Chain-of-thought solutions."""
    pot: Fraction = 0.2
    """Program-of-thought solutions (a def solution() program), kept only if the sandbox reproduces the answer."""
    tir: Fraction = 0.4
    """Tool-integrated solutions (text, code, output, answer), kept only if the sandbox reproduces the answer."""


class SftParams(Section):
    """Section ``sft``: supervised fine-tuning of the pretrained model on CoT / PoT / tool-integrated solutions."""

    SECTION = "sft"

    enabled: bool = True
    """false: no fine-tuning; data/models/sft passes the pretrained model through (a model_ref.json), e.g. to run
    GRPO from an instruct model."""
    problems: DataPath
    """SFT problems: a JSONL file or a directory of them (the tiny default's data/corpus/problems/sft.jsonl; the
    ingest stage's data/ingest/sft in real mode); rows need question, answer and at least one of cot / pot / tir."""
    formats: SftFormatMix = SftFormatMix()
    """Which solution format each training problem gets: drawn per problem with these shares, renormalised over
    the formats the problem has."""
    verify_programs: bool = True
    """Execute PoT / TIR programs in the sandbox and drop those that do not reproduce the gold answer."""
    val_problems: PosInt = 2000
    """Problems held out from the SFT file for the validation loss (best-checkpoint selection; not in the paper)."""
    pack: bool = True
    """Pack several examples per sequence (attention never crosses examples; paper 3.2 packs to 4K tokens); false =
    one example per row."""
    train: TrainLoopParams = TrainLoopParams(steps=500, micro_batch_size=1, grad_accum=4, seq_len=4096, lr=5.0e-5,
                                             schedule="constant", warmup_steps=0, eval_every=50,
                                             deepspeed=DeepSpeedParams(zero_stage=3))
    """The training loop. Paper 3.2: 500 steps at a batch of 256 examples packed to 4K tokens, constant LR 5e-5; a batch
    of 256 = 1 sequence x 4 accumulation steps x 64 ranks (ours, as the ZeRO stage 3 and eval_every)."""
    launcher: LauncherParams = LauncherParams()
    """How the stage's ranks start: in this process, or under torchrun / the deepspeed launcher (multi-GPU)."""

    @field_validator("formats")
    @classmethod
    def _check_formats(cls, v: SftFormatMix) -> SftFormatMix:
        total = v.cot + v.pot + v.tir
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"format shares cot + pot + tir must sum to 1, they sum to {total:g}")
        return v

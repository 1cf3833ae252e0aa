"""Schema of params.yaml's ``sft`` section: supervised fine-tuning on CoT / PoT / TIR solutions (paper 3)."""

from __future__ import annotations

from pydantic import field_validator

from stages.schema.base import DataPath, Fraction, PosInt, Section
from stages.schema.train import LauncherParams, TrainLoopParams


class SftFormatMix(Section):
    """Shares of the solution formats in the SFT data (must sum to 1)."""

    cot: Fraction
    """Chain-of-thought solutions."""
    pot: Fraction
    """Program-of-thought solutions (a def solution() program), kept only if the sandbox reproduces the answer."""
    tir: Fraction
    """Tool-integrated solutions (text, code, output, answer), kept only if the sandbox reproduces the answer."""


class SftParams(Section):
    """Section ``sft``: supervised fine-tuning of the pretrained model on CoT / PoT / tool-integrated solutions."""

    SECTION = "sft"

    enabled: bool
    """false: no fine-tuning; data/models/sft passes the pretrained model through (a model_ref.json), e.g. to run
    GRPO from an instruct model."""
    problems: DataPath
    """SFT problems: a JSONL file or a directory of them (the tiny default's data/corpus/problems/sft.jsonl; the
    ingest stage's data/ingest/sft in real mode); rows need question, answer and at least one of cot / pot / tir."""
    formats: SftFormatMix
    """Which solution format each training problem gets: drawn per problem with these shares, renormalised over
    the formats the problem has."""
    verify_programs: bool
    """Execute PoT / TIR programs in the sandbox and drop those that do not reproduce the gold answer."""
    val_problems: PosInt
    """Problems held out from the SFT file for the validation loss (best-checkpoint selection)."""
    pack: bool
    """Pack several examples per sequence (attention never crosses examples); false = one example per row."""
    train: TrainLoopParams
    """The training loop (paper: constant LR 5e-5, 500 steps, batch 256, 4K packing)."""
    launcher: LauncherParams
    """How the stage's ranks start: in this process, or under torchrun / the deepspeed launcher (multi-GPU)."""

    @field_validator("formats")
    @classmethod
    def _check_formats(cls, v: SftFormatMix) -> SftFormatMix:
        total = v.cot + v.pot + v.tir
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"format shares cot + pot + tir must sum to 1, they sum to {total:g}")
        return v

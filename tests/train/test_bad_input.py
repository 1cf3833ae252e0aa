"""Bad input to the training stages: one-line errors, before any training."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.base_model import train_tokenizer
from stages.core.errors import PipelineError
from stages.params import parse_params, resolve
from stages.pretrain import pretrain
from stages.sft import sft
from stages.train import checkpoint as ck
from tests.train.conftest import pretrain_params, sft_params

ROOT = Path(__file__).resolve().parents[2]


def _one_line(e: pytest.ExceptionInfo[PipelineError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400
    return msg


def _run_pretrain(world, tmp_path, p=None, base=None):
    return pretrain(p or pretrain_params(world), base_dir=base or world["model"], out_dir=tmp_path / "out",
                    ckpt_root=tmp_path / "ck", plots_dir=tmp_path / "plots")


def test_tokenizer_model_mismatch(tiny_world, tmp_path) -> None:
    bad = tmp_path / "mismatch"
    shutil.copytree(tiny_world["model"], bad)
    big = train_tokenizer([tiny_world["math"].read_text(), tiny_world["general"].read_text()] * 3, 700)
    big.save_pretrained(bad)  # a tokenizer with more ids than the model embeds
    with pytest.raises(PipelineError, match="tokenizer has .* tokens but the model embeds only") as e:
        _run_pretrain(tiny_world, tmp_path, base=bad)
    _one_line(e)
    with pytest.raises(PipelineError, match="tokenizer has"):
        sft(sft_params(tiny_world), init_dir=bad, out_dir=tmp_path / "o", ckpt_root=tmp_path / "c", plots_dir=tmp_path / "p")


def test_mixture_ratios_must_sum_to_one() -> None:
    raw = resolve(ROOT / "params.yaml")
    raw["pretrain"]["mixture"][0]["ratio"] = 0.5
    with pytest.raises(PipelineError, match=r"pretrain\.mixture: .*sum to 1, they sum to 0\.7") as e:
        parse_params(raw, "params.yaml")
    _one_line(e)
    raw["pretrain"]["mixture"] = []
    with pytest.raises(PipelineError, match=r"pretrain\.mixture"):
        parse_params(raw, "params.yaml")


def test_sft_format_shares_must_sum_to_one() -> None:
    raw = resolve(ROOT / "params.yaml")
    raw["sft"]["formats"]["tir"] = 0.5
    with pytest.raises(PipelineError, match=r"sft\.formats: .*sum to 1"):
        parse_params(raw, "params.yaml")


def test_empty_source(tiny_world, tmp_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    p = pretrain_params(tiny_world, mixture=[{"path": str(tiny_world["math"]), "ratio": 0.5}, {"path": str(empty), "ratio": 0.5}])
    with pytest.raises(PipelineError, match="empty.jsonl: mixture source has no rows with text") as e:
        _run_pretrain(tiny_world, tmp_path, p)
    _one_line(e)


def test_held_out_rows_leave_nothing(tiny_world, tmp_path) -> None:
    with pytest.raises(PipelineError, match="after the 5000 held-out rows"):
        _run_pretrain(tiny_world, tmp_path, pretrain_params(tiny_world, eval_docs=5000))


def test_context_length_above_the_models(tiny_world, tmp_path) -> None:
    with pytest.raises(PipelineError, match=r"pretrain\.train\.seq_len: 512 is above the model's context length") as e:
        _run_pretrain(tiny_world, tmp_path, pretrain_params(tiny_world, train={"seq_len": 512}))
    _one_line(e)


def test_corrupt_checkpoint_at_stage_level(tiny_world, tmp_path) -> None:
    p = pretrain_params(tiny_world, train={"steps": 4, "checkpoint_every": 2})
    _run_pretrain(tiny_world, tmp_path, p)
    run_dir = next((tmp_path / "ck").iterdir())
    latest = ck.latest_checkpoint(run_dir)
    (latest / "state.pt").write_bytes(b"garbage")
    with pytest.raises(PipelineError, match="corrupt checkpoint") as e:
        _run_pretrain(tiny_world, tmp_path, p)
    _one_line(e)


def test_missing_sft_problems(tiny_world, tmp_path) -> None:
    with pytest.raises(PipelineError, match="file not found"):
        sft(sft_params(tiny_world, problems=str(tmp_path / "none.jsonl")), init_dir=tiny_world["model"],
            out_dir=tmp_path / "o", ckpt_root=tmp_path / "c", plots_dir=tmp_path / "p")


def test_cli_prints_one_line_and_exits_2(tiny_world, tmp_path) -> None:
    """``python -m stages.pretrain`` (the deepspeed/torchrun entry) in a project whose base model is missing."""
    raw = resolve(ROOT / "params.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    out = subprocess.run([sys.executable, "-m", "stages.pretrain", "--params", "params.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out.stderr[-1500:]
    lines = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "data/models/base" in lines[0], out.stderr[-1500:]

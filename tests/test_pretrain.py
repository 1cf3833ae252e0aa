"""The pretrain stage end to end on a tiny world: loss falls, held-out perplexity drops, the output is a HF
directory that transformers loads, curves and metrics are written, a re-run resumes instead of retraining."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stages import pretrain as stage
from stages.core import paths
from tests.train.conftest import build_tiny_world, pretrain_params


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_tiny_world(tmp_path_factory.mktemp("tiny_world"))


def test_pretrain_lowers_heldout_perplexity_and_exports(tiny_world, tmp_path) -> None:
    p = pretrain_params(tiny_world, train={"steps": 24, "lr": 1e-2, "warmup_steps": 3, "schedule": "multistep",
                                           "eval_every": 12, "checkpoint_every": 12})
    kw = dict(base_dir=tiny_world["model"], out_dir=tmp_path / "out", ckpt_root=tmp_path / "ck", plots_dir=tmp_path / "plots")
    m = stage.pretrain(p, **kw)
    assert m["train_loss_last"] < m["train_loss_first"] - 1.0
    assert m["perplexity_after"] < 0.5 * m["perplexity_before"], m
    assert m["steps_run"] == 24 and m["skipped_steps"] == 0 and m["precision"] == "fp32"
    assert sum(m["mixture_tokens"].values()) == 24 * 4 * 64
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert len(tok) == model.get_input_embeddings().weight.shape[0]
    assert json.loads((tmp_path / "out" / "pipeline.json").read_text())["stage"] == "pretrain"
    header = (tmp_path / "plots" / "train.tsv").read_text().splitlines()[0].split("\t")
    assert header[:3] == ["step", "loss", "lr"] and (tmp_path / "plots" / "loss.png").stat().st_size > 1000
    lrs = [float(x.split("\t")[1]) for x in (tmp_path / "plots" / "lr.tsv").read_text().splitlines()[1:]]
    assert max(lrs) == 1e-2 and lrs[-1] == 1e-3  # 10% of peak in the last 10% of steps

    before = {k: v.clone() for k, v in model.state_dict().items()}
    again = stage.pretrain(p, **kw)  # same params and inputs: the finished checkpoint is reused
    assert again["steps_run"] == 0 and again["eval_loss_after"] == m["eval_loss_after"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(before[k], reloaded[k]) for k in before)


def test_run_writes_metrics_with_wall_time(tiny_world, tmp_path, monkeypatch) -> None:
    """``run()`` reads the project's artifact paths and writes data/metrics/pretrain.json (its timings, wall_s, in data/timings/pretrain.json)."""
    shutil.copytree(tiny_world["model"], tmp_path / paths.BASE_MODEL)
    (tmp_path / "data" / "corpus").mkdir(parents=True)
    shutil.copy(tiny_world["math"], tmp_path / "data" / "corpus" / "math_corpus.jsonl")
    shutil.copy(tiny_world["general"], tmp_path / "data" / "corpus" / "general.jsonl")
    p = pretrain_params(tiny_world, mixture=[{"path": "data/corpus/math_corpus.jsonl", "ratio": 0.8},
                                             {"path": "data/corpus/general.jsonl", "ratio": 0.2}], train={"steps": 2})
    monkeypatch.chdir(tmp_path)
    m = stage.run(p)
    saved = json.loads((tmp_path / paths.metrics_file("pretrain")).read_text())
    assert saved["steps"] == 2 and "wall_s" not in saved  # timings: data/timings (no DVC output)
    assert json.loads((tmp_path / paths.timings_file("pretrain")).read_text())["wall_s"] == m["wall_s"] > 0
    assert (tmp_path / paths.TIMINGS / "pretrain" / "steps.tsv").read_text().startswith("step\ttokens_per_s\n")
    assert (tmp_path / paths.PRETRAIN_MODEL / "config.json").is_file()
    assert (tmp_path / paths.plots_dir("pretrain") / "train.tsv").is_file()
    assert len(list((tmp_path / paths.CHECKPOINTS / "pretrain").iterdir())) == 1

"""The sft stage end to end on a tiny world: the format mix, program verification in the sandbox, the
best-validation checkpoint as the exported model, curves and metrics."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from stages import sft as stage
from stages.core import paths
from tests.train.conftest import build_tiny_world, sft_params


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_tiny_world(tmp_path_factory.mktemp("tiny_world"))


def test_format_mix_follows_shares() -> None:
    modes = stage.assign_formats(3000, {"cot": 0.5, "pot": 0.3, "tir": 0.2}, seed=0)
    share = {m: modes.count(m) / 3000 for m in stage.FORMATS}
    assert share == pytest.approx({"cot": 0.5, "pot": 0.3, "tir": 0.2}, abs=0.03)
    assert stage.assign_formats(50, {"cot": 1.0, "pot": 0.0, "tir": 0.0}, seed=1) == ["cot"] * 50


def test_programs_are_kept_only_when_the_sandbox_reproduces_the_answer(tiny_world) -> None:
    rows = [json.loads(x) for x in tiny_world["problems"].read_text().splitlines()[:6]]
    bad_pot = dict(rows[1], pot=rows[1]["pot"].replace("return ", "return 1 + "))
    bad_tir_out = dict(rows[3], tir=rows[3]["tir"].replace("```output\n", "```output\n1"))  # claims a wrong output
    bad_tir_ans = dict(rows[5], tir=rows[5]["tir"].replace("\\boxed{", "\\boxed{1"))  # right code, wrong answer
    keep = stage.verify_programs([rows[0], bad_pot, rows[2], bad_tir_out, rows[4], bad_tir_ans],
                                 ["pot", "pot", "tir", "tir", "cot", "tir"], workers=2)
    assert keep == [True, False, True, False, True, False]


def test_sft_keeps_the_best_checkpoint(tiny_world, tmp_path) -> None:
    p = sft_params(tiny_world, train={"steps": 8, "lr": 1e-2, "eval_every": 2, "checkpoint_every": 4})
    kw = dict(init_dir=tiny_world["model"], out_dir=tmp_path / "out", ckpt_root=tmp_path / "ck", plots_dir=tmp_path / "plots")
    m = stage.sft(p, **kw)
    assert m["val_loss_best"] < m["val_loss_before"]
    assert m["val_loss_best"] == min(e for e in [m["val_loss_best"], m["val_loss_last"]])
    assert m["train_examples"] == sum(m["kept"].values()) and m["val_problems"] == 16
    assert m["drawn"]["pot"] > 0 and m["drawn"]["tir"] > 0
    best = load_file(str(tmp_path / "ck" / next((tmp_path / "ck").iterdir()).name / "best" / "model.safetensors"))
    out = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(best[k], out[k]) for k in best)
    assert json.loads((tmp_path / "out" / "pipeline.json").read_text())["best_step"] == m["best_step"]
    evals = (tmp_path / "plots" / "eval.tsv").read_text().splitlines()[1:]
    assert [int(x.split("\t")[0]) for x in evals] == [2, 4, 6, 8]
    assert (tmp_path / "plots" / "loss.png").is_file()


def test_verified_run_writes_metrics(tiny_world, tmp_path, monkeypatch) -> None:
    shutil.copytree(tiny_world["model"], tmp_path / paths.PRETRAIN_MODEL)
    p = sft_params(tiny_world, verify_programs=True, train={"steps": 2})
    monkeypatch.chdir(tmp_path)
    m = stage.run(p)
    saved = json.loads((tmp_path / paths.timings_file("sft")).read_text())  # timings: no DVC output
    assert saved["wall_s"] == m["wall_s"] > 0 and "wall_s" not in json.loads(paths.metrics_file("sft").read_text())
    assert sum(m["dropped_unverified"].values()) == 0  # generated programs are all correct
    assert (tmp_path / paths.SFT_MODEL / "model.safetensors").is_file()


def test_formats_are_drawn_among_those_each_row_has(tiny_world: dict, tmp_path, monkeypatch) -> None:
    """A real SFT set mixes rows with one format (GSM8K / MATH: cot; PAL: pot) and generated rows with three: every
    row trains on a format it has, with the shares renormalised over its formats."""
    rows = [json.loads(x) for x in tiny_world["problems"].read_text().splitlines()[:60]]
    mixed = [{k: v for k, v in r.items() if k not in ("pot", "tir")} if i % 3 == 0 else
             {k: v for k, v in r.items() if k not in ("cot", "tir")} if i % 3 == 1 else r for i, r in enumerate(rows)]
    have = [stage.row_formats(r) for r in mixed]
    modes = stage.assign_formats(len(mixed), {"cot": 0.5, "pot": 0.3, "tir": 0.2}, 0, have)
    assert all(m in h for m, h in zip(modes, have, strict=True))
    assert modes[0::3] == ["cot"] * 20 and modes[1::3] == ["pot"] * 20 and len(set(modes[2::3])) > 1
    assert stage.assign_formats(3, {"cot": 0.0, "pot": 1.0, "tir": 0.0}, 0, [["cot"], ["pot"], ["cot", "pot"]]) == \
        [None, "pot", "pot"]  # a row whose formats all have share 0 is not trained on
    f = tmp_path / "mixed.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in mixed))
    from stages.core.modeling import load_tokenizer

    p = sft_params(tiny_world, problems=str(f), val_problems=6)
    train, val, counts = stage.build_examples(p, stage.load_sft_rows(f), load_tokenizer(tiny_world["model"]))
    assert counts["rows_with_format"] == {"cot": 36, "pot": 36, "tir": 18}  # the 54 training rows
    assert sum(counts["kept"].values()) == len(train) and len(val) == 6
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(Exception, match="has no solution"):
        stage.load_sft_rows(bad)


def test_disabled_stage_passes_its_input_model_through(tiny_world: dict, tmp_path, monkeypatch) -> None:
    """sft.enabled false (GRPO from an instruct model): data/models/sft is a model_ref.json to the pretrained model,
    which every loader follows; the plots exist (dvc outputs)."""
    from stages.core.modeling import load_model, resolve_model

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_world["model"], tmp_path / paths.PRETRAIN_MODEL)
    m = stage.run(sft_params(tiny_world, enabled=False))
    assert m["enabled"] is False and json.loads(paths.metrics_file("sft").read_text())["enabled"] is False
    assert resolve_model(paths.SFT_MODEL) == str(paths.PRETRAIN_MODEL)
    assert load_model(paths.SFT_MODEL).config.hidden_size == 64
    assert {f.name for f in paths.plots_dir("sft").iterdir()} == {"train.tsv", "lr.tsv", "eval.tsv", "loss.png"}

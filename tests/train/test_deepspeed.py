"""The same loop under DeepSpeed (CPU accelerator, one process, gloo): ZeRO-2 and ZeRO-3 match the plain
loop for 5 steps (to 1e-4), a ZeRO-3 run exports a HF directory that loads with the same logits, and a
DeepSpeed run resumes from its checkpoint."""

from __future__ import annotations

import importlib
import socket
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from stages.core.modeling import load_model, load_tokenizer
from stages.train.data import PackedMixture
from stages.train.ds_config import deepspeed_config
from stages.train.loop import full_state_dict, train
from tests.train.conftest import loop_params, pretrain_params


@pytest.fixture
def ds_env(monkeypatch: pytest.MonkeyPatch):
    """A world of one CPU process; the env vars vanish after the test so later tests run the plain loop."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    deepspeed = pytest.importorskip("deepspeed")
    ds_torch = importlib.import_module("deepspeed.comm.torch")  # (the package attribute .torch is torch itself)

    # the shared-memory all-reduce kernel only speeds up multi-rank CPU runs; skip its one-off JIT build (~4 min)
    monkeypatch.setattr(ds_torch, "build_shm_op", lambda: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    return deepspeed


def _setup(world: dict[str, Path]):
    tok = load_tokenizer(world["model"])
    model = load_model(world["model"])
    return model, PackedMixture([(world["math"], 0.75), (world["general"], 0.25)], tok, 64, 0, skip_first_rows=10)


def _ds(stage: int) -> dict[str, object]:
    return {"enabled": True, "zero_stage": stage, "offload_optimizer": False}


def test_config_is_generated_from_params() -> None:
    cfg = deepspeed_config(loop_params(micro_batch_size=3, grad_accum=4, max_grad_norm=0.5, deepspeed=_ds(3)), bf16=True)
    assert cfg["train_micro_batch_size_per_gpu"] == 3 and cfg["gradient_accumulation_steps"] == 4
    assert cfg["gradient_clipping"] == 0.5 and cfg["bf16"] == {"enabled": True}
    assert cfg["zero_optimization"]["stage"] == 3
    off = deepspeed_config(loop_params(deepspeed={"enabled": True, "zero_stage": 2, "offload_optimizer": True}), bf16=False)
    assert off["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_matches_plain_loop(ds_env, tiny_world, tmp_path, stage) -> None:
    p = dict(steps=5, checkpoint_every=0)
    model, data = _setup(tiny_world)
    plain = train(model, data, loop_params(**p), tmp_path / "plain")
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model, data = _setup(tiny_world)
    ds = train(model, data, loop_params(**p, deepspeed=_ds(stage)), tmp_path / "ds")
    assert ds.zero_stage == stage and ds.steps_run == 5
    assert [h["loss"] for h in ds.history] == pytest.approx([h["loss"] for h in plain.history], abs=1e-4)
    assert [h["grad_norm"] for h in ds.history] == pytest.approx([h["grad_norm"] for h in plain.history], abs=1e-4)
    got = full_state_dict(model, stage)
    assert max(float((ref[k] - got[k]).abs().max()) for k in got) < 1e-4


def test_zero3_stage_exports_a_loadable_hf_dir(ds_env, tiny_world, tmp_path) -> None:
    from stages.pretrain import pretrain

    kw = dict(base_dir=tiny_world["model"], ckpt_root=tmp_path / "ck", plots_dir=tmp_path / "plots")
    m3 = pretrain(pretrain_params(tiny_world, train={"steps": 5, "deepspeed": _ds(3)}), out_dir=tmp_path / "z3", **kw)
    m0 = pretrain(pretrain_params(tiny_world, train={"steps": 5}), out_dir=tmp_path / "plain", **kw)
    assert m3["steps_run"] == 5 and m3["eval_loss_after"] == pytest.approx(m0["eval_loss_after"], abs=1e-4)
    z3 = AutoModelForCausalLM.from_pretrained(tmp_path / "z3").eval()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    ids = torch.randint(3, 300, (2, 40))
    with torch.no_grad():
        a, b = z3(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
    assert (tmp_path / "z3" / "tokenizer.json").is_file()


class _Crash(Exception):
    pass


def test_deepspeed_run_resumes(ds_env, tiny_world, tmp_path) -> None:
    p = loop_params(steps=6, checkpoint_every=2, deepspeed=_ds(2))
    model, data = _setup(tiny_world)
    train(model, data, p, tmp_path / "a")
    ref = full_state_dict(model, 2)

    def crash(step: int) -> None:
        if step == 3:
            raise _Crash

    model, data = _setup(tiny_world)
    with pytest.raises(_Crash):
        train(model, data, p, tmp_path / "b", fault_hook=crash)
    model, data = _setup(tiny_world)
    res = train(model, data, p, tmp_path / "b")
    assert (res.start_step, res.steps_run) == (2, 4)
    got = full_state_dict(model, 2)
    assert max(float((ref[k] - got[k]).abs().max()) for k in got) < 1e-5

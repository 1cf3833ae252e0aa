"""The training loop: loss falls, accumulation is token-exact, bf16 runs, non-finite steps are skipped,
checkpoints resume exactly, a corrupt checkpoint is a one-line error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from stages.core.errors import PipelineError
from stages.core.modeling import load_model, load_tokenizer
from stages.train import checkpoint as ck
from stages.train.data import PackedMixture
from stages.train.loop import train
from tests.train.conftest import loop_params


def _setup(world: dict[str, Path], seq_len: int = 64):
    tok = load_tokenizer(world["model"])
    model = load_model(world["model"])
    data = PackedMixture([(world["math"], 0.75), (world["general"], 0.25)], tok, seq_len, 0, skip_first_rows=10)
    return model, data


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_loss_falls(tiny_world, tmp_path) -> None:
    model, data = _setup(tiny_world)
    res = train(model, data, loop_params(steps=30, lr=1e-2, warmup_steps=3, checkpoint_every=0), tmp_path)
    first, last = res.history[0]["loss"], sum(h["loss"] for h in res.history[-5:]) / 5
    assert last < first - 1.0, (first, last)
    assert res.steps_run == 30 and res.skipped_steps == 0 and res.tokens == 30 * 4 * 64
    assert all(h["grad_norm"] > 0 for h in res.history)


def test_accumulation_is_token_weighted(tiny_world, tmp_path) -> None:
    """2 micro-batches of 2 rows give the same update as 1 micro-batch of 4 rows."""
    out = []
    for mbs, acc in [(4, 1), (2, 2)]:
        model, data = _setup(tiny_world)
        train(model, data, loop_params(steps=3, micro_batch_size=mbs, grad_accum=acc, checkpoint_every=0), tmp_path / f"{mbs}")
        out.append(_weights(model))
    assert _max_diff(*out) < 1e-5


def test_bf16_autocast_trains(tiny_world, tmp_path) -> None:
    model, data = _setup(tiny_world)
    res = train(model, data, loop_params(steps=8, lr=1e-2, precision="bf16", checkpoint_every=0), tmp_path)
    assert res.precision == "bf16"
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert res.history[-1]["loss"] < res.history[0]["loss"]


def test_non_finite_step_is_skipped_and_counted(tiny_world, tmp_path) -> None:
    model, data = _setup(tiny_world)
    snaps: dict[int, dict[str, torch.Tensor]] = {}
    poison = {"on": False}

    def hook(step: int) -> None:
        snaps[step] = _weights(model)
        poison["on"] = step == 2

    handle = model.lm_head.register_forward_hook(lambda m, i, o: o * float("nan") if poison["on"] else o)
    res = train(model, data, loop_params(steps=5, checkpoint_every=0), tmp_path, fault_hook=hook)
    handle.remove()
    assert res.skipped_steps == 1
    assert _max_diff(snaps[2], snaps[3]) == 0.0  # the poisoned step changed nothing
    assert _max_diff(snaps[3], snaps[4]) > 0.0  # later steps train again
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert len(res.history) == 5 and res.history[2]["grad_norm"] != res.history[2]["grad_norm"]  # nan logged


class _Crash(Exception):
    pass


def test_resume_runs_only_the_remaining_steps_and_matches(tiny_world, tmp_path) -> None:
    p = loop_params(steps=6, checkpoint_every=2, log_every=3)  # the resume falls inside a logged row's loss window
    model, data = _setup(tiny_world)
    full = train(model, data, p, tmp_path / "a")
    ref = _weights(model)

    def crash(step: int) -> None:
        if step == 3:
            raise _Crash

    model, data = _setup(tiny_world)
    with pytest.raises(_Crash):
        train(model, data, p, tmp_path / "b", fault_hook=crash)
    assert ck.latest_checkpoint(tmp_path / "b").name == "step-00000002"
    model, data = _setup(tiny_world)  # a fresh process would start from the base weights
    res = train(model, data, p, tmp_path / "b")
    assert (res.start_step, res.steps_run) == (2, 4)
    assert _max_diff(ref, _weights(model)) < 1e-5
    assert [h["step"] for h in res.history] == [3, 6]
    assert [h["loss"] for h in res.history] == pytest.approx([h["loss"] for h in full.history], abs=1e-5)
    again = train(*_setup(tiny_world), p, tmp_path / "b")  # finished: nothing left to run
    assert again.steps_run == 0


def test_corrupt_checkpoint_is_a_one_line_error(tiny_world, tmp_path) -> None:
    p = loop_params(steps=2, checkpoint_every=2)
    train(*_setup(tiny_world), p, tmp_path)
    ckpt = ck.latest_checkpoint(tmp_path)
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])  # truncated
    with pytest.raises(PipelineError, match="corrupt checkpoint") as e:
        train(*_setup(tiny_world), p, tmp_path)
    assert "\n" not in str(e.value) and str(ckpt) in str(e.value)
    f.write_bytes(b"\0" * ck.json.loads((ckpt / "manifest.json").read_text())["files"]["model.safetensors"])  # right size, garbage
    with pytest.raises(PipelineError, match="corrupt checkpoint"):
        train(*_setup(tiny_world), p, tmp_path)
    shutil.rmtree(ckpt)
    assert train(*_setup(tiny_world), p, tmp_path).steps_run == 2  # deleted as the message says: starts over


def test_incomplete_checkpoint_is_ignored(tiny_world, tmp_path) -> None:
    p = loop_params(steps=4, checkpoint_every=2)
    train(*_setup(tiny_world), p, tmp_path)
    (ck.step_dir(tmp_path, 4) / "manifest.json").unlink()  # as if killed while writing step 4
    res = train(*_setup(tiny_world), p, tmp_path)
    assert (res.start_step, res.steps_run) == (2, 2)


def test_run_hash_changes_with_params_and_inputs(tiny_world, tmp_path) -> None:
    h = ck.run_hash({"lr": 1}, [tiny_world["math"]])
    assert h == ck.run_hash({"lr": 1}, [tiny_world["math"]])
    assert h != ck.run_hash({"lr": 2}, [tiny_world["math"]])
    copy = tmp_path / "m.jsonl"
    copy.write_text(tiny_world["math"].read_text() + '{"text": "x"}\n')
    assert h != ck.run_hash({"lr": 1}, [copy])
    assert len(ck.fingerprint_path(tiny_world["model"])) == 64

"""GRPO killed with SIGKILL mid-run, then run again: it resumes from its last checkpoint and ends with the weights of
an uninterrupted run (to 1e-5), in plain PyTorch and under DeepSpeed (ZeRO-2, CPU accelerator, one process: the
optimizer's moments come back from the engine's checkpoint). Only the killed run is a separate process; the
reference and the resumed run run here. ~20 s (plain) and ~35 s (DeepSpeed) on the shared 2-core machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stages.core import paths
from stages.core.modeling import load_model, load_tokenizer
from stages.rl.data import load_prompts
from stages.train import checkpoint as ck

from .test_grpo_deepspeed import ds_env  # noqa: F401 (fixture)
from .test_grpo_stage import rl_train, tiny_params

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
# mu = 2 and two minibatches: the update takes several optimizer steps per GRPO step, so the AdamW moments matter
OVER = dict(steps=STEPS, checkpoint_every=1, questions_per_step=2, rollout__group_size=3, rollout__max_new_tokens=8, optim__mu=2,
            optim__minibatches=2, optim__micro_batch_size=3, advantage__skip_zero_std_groups=False)


def _train(over: dict, ckpt: Path | None) -> tuple[dict[str, torch.Tensor], dict]:
    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    torch.manual_seed(0)
    _, _, info = rl_train(model, tok, rows, tiny_params(**over), ckpt_dir=ckpt)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, info


def _kill_after_checkpoint(project: Path, ckpt: Path, over: dict, at_least: int) -> int:
    env = {**os.environ, "PROJECT_ROOT": str(ROOT), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "rl" / "_grpo_kill_runner.py"), str(project),
                             str(ckpt), json.dumps(over), "1.0"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            latest = ck.latest_checkpoint(ckpt)
            if latest is not None and ck.verify_manifest(latest) >= at_least:
                break
            if proc.poll() is not None:
                pytest.fail(f"the run ended before it was killed: {proc.stderr.read()[-2000:]}")
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint in time")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return ck.verify_manifest(ck.latest_checkpoint(ckpt))


def _check(project: Path, over: dict) -> None:
    ref, _ = _train(over, None)
    ckpt = project / "checkpoints" / "grpo" / "killed"
    done = _kill_after_checkpoint(project, ckpt, over, at_least=2)
    assert 2 <= done < STEPS
    got, info = _train(over, ckpt)
    assert info["resumed_from_step"] == done
    assert max(float((ref[k] - got[k]).abs().max()) for k in ref) < 1e-5
    start = load_model(paths.SFT_MODEL).state_dict()
    assert any(not torch.equal(start[k], got[k]) for k in start)  # the run trained


@pytest.mark.slow  # ~15 s: .ci/slow heavy-suite (the README suite stays under 10 min)
def test_sigkill_then_rerun_resumes_exactly(project) -> None:
    _check(project, OVER)


@pytest.mark.slow  # ~15 s: .ci/slow heavy-suite (the README suite stays under 10 min)
def test_sigkill_then_rerun_resumes_exactly_under_deepspeed(ds_env, project) -> None:  # noqa: F811
    over = {**OVER, "deepspeed": dict(enabled=True, zero_stage=2, offload_optimizer=False)}
    _check(project, over)
    state = torch.load(ck.latest_checkpoint(project / "checkpoints" / "grpo" / "killed") / "state.pt",
                       weights_only=False)
    assert state["updaters"] == ["policy"]
    ds_dir = ck.latest_checkpoint(project / "checkpoints" / "grpo" / "killed") / "policy" / "ds" / "state"
    assert any("optim_states" in f.name for f in ds_dir.iterdir())  # the ZeRO optimizer state is in the checkpoint

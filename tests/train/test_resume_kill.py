"""SIGKILL mid-run, run again: only the remaining steps run, and the final weights equal an
uninterrupted run's (to 1e-5). Each run is a separate process, as after a real crash."""

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
from safetensors.torch import load_file

from stages.train import checkpoint as ck
from tests.train.conftest import loop_params

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys, time, torch
torch.set_num_threads(1)
from safetensors.torch import save_file
from stages.core.modeling import load_model, load_tokenizer
from stages.params import TrainLoopParams
from stages.train.data import PackedMixture
from stages.train.loop import train
cfg = json.loads(sys.argv[1])
tok = load_tokenizer(cfg["model"])
model = load_model(cfg["model"])
data = PackedMixture([(cfg["math"], 0.75), (cfg["general"], 0.25)], tok, 64, 0, skip_first_rows=10)
p = TrainLoopParams.model_validate(cfg["params"])
res = train(model, data, p, cfg["run_dir"], fault_hook=lambda s: time.sleep(cfg["sleep"]))
save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, cfg["out"])
print(json.dumps({"start_step": res.start_step, "steps_run": res.steps_run}))
"""


def _cmd(world, run_dir: Path, out: Path, sleep: float) -> list[str]:
    cfg = {"model": str(world["model"]), "math": str(world["math"]), "general": str(world["general"]),
           "params": loop_params(steps=12, checkpoint_every=2).model_dump(), "run_dir": str(run_dir),
           "out": str(out), "sleep": sleep}
    return [sys.executable, "-c", SCRIPT, json.dumps(cfg)]


def _run(cmd: list[str]) -> dict[str, int]:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three fresh processes: ~55 s on the shared 2-core machine
def test_sigkill_then_rerun_resumes_exactly(tiny_world, tmp_path) -> None:
    full = _run(_cmd(tiny_world, tmp_path / "ref", tmp_path / "ref.safetensors", 0.0))
    assert full == {"start_step": 0, "steps_run": 12}

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(tiny_world, run_dir, tmp_path / "killed.safetensors", 0.4), cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        latest = ck.latest_checkpoint(run_dir)
        if latest is not None and ck.verify_manifest(latest) >= 4:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = ck.verify_manifest(ck.latest_checkpoint(run_dir))
    assert 4 <= done < 12, done

    resumed = _run(_cmd(tiny_world, run_dir, tmp_path / "killed.safetensors", 0.0))
    assert resumed == {"start_step": done, "steps_run": 12 - done}
    a, b = load_file(str(tmp_path / "ref.safetensors")), load_file(str(tmp_path / "killed.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert not torch.equal(a["model.embed_tokens.weight"], load_file(str(tiny_world["model"] / "model.safetensors"))["model.embed_tokens.weight"])

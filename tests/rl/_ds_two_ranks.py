"""Run by tests/rl/test_grpo_deepspeed.py under torchrun (2 CPU ranks, gloo) and as one plain process: two steps
of GRPO on scripted rollouts; prints one JSON line (world size, per-step grad norms, weight checksum)."""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch

if __name__ == "__main__":
    sys.path.insert(0, os.environ["PROJECT_ROOT"])
    torch.set_num_threads(1)
    if os.environ.get("WORLD_SIZE", "1") != "1":
        os.environ["DS_ACCELERATOR"] = "cpu"
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build (speed-up only)
    os.chdir(sys.argv[1])
    from stages import grpo
    from stages.core import paths
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.data import load_prompts
    from tests.rl.test_grpo_stage import tiny_params
    from tests.rl.test_paradigm import ScriptedGenerator, _texts

    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    grpo.rollout_generator = lambda *a, **k: ScriptedGenerator(tok, rows, _texts)
    ds = os.environ.get("WORLD_SIZE", "1") != "1"
    p = tiny_params(steps=2, questions_per_step=3, micro_batch_size=3, checkpoint_every=0,
                    deepspeed=dict(enabled=ds, zero_stage=2, offload_optimizer=False))
    h, _, info = grpo.train_grpo(model, tok, rows, p, ckpt_dir=None)
    out = {"rank": int(os.environ.get("RANK", "0")), "world": info["world_size"],
           "grad_norm": [r["grad_norm"] for r in h], "steps": [r["optimizer_steps"] for r in h],
           "checksum": float(sum(v.double().sum() for v in model.state_dict().values()))}
    print("RESULT " + json.dumps(out), flush=True)

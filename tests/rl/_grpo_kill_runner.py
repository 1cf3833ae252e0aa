"""Run by tests/rl/test_resume_kill.py in a process of its own (the one that gets SIGKILLed): GRPO on the test
project's tiny model, a checkpoint after every step, a pause after each step so the test can kill it mid-run.

    python _grpo_kill_runner.py PROJECT CKPT_DIR PARAMS_JSON PAUSE_S
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

import torch

if __name__ == "__main__":
    sys.path.insert(0, os.environ["PROJECT_ROOT"])
    torch.set_num_threads(1)
    over = json.loads(sys.argv[3])
    if over.get("deepspeed", {}).get("enabled"):
        os.environ["DS_ACCELERATOR"] = "cpu"
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # multi-rank speed-up only
    os.chdir(sys.argv[1])
    from pathlib import Path

    from stages.core import paths
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.data import load_prompts
    from tests.rl.test_grpo_stage import rl_train, tiny_params

    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    torch.manual_seed(0)
    pause = float(sys.argv[4])
    rl_train(model, tok, rows, tiny_params(**over), ckpt_dir=Path(sys.argv[2]),
                    on_step=lambda row: time.sleep(pause))

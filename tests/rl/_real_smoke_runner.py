"""Runs one stage in a process of its own for tests/rl/test_real_mode_smoke.py: vLLM may spawn worker processes
(hence the ``__main__`` guard) and DeepSpeed initialises a process group.

    python tests/rl/_real_smoke_runner.py STAGE PARAMS [MODEL]      (STAGE: sft | grpo | evaluate)

Prints ``RESULT {json}`` with the stage's wall time. DeepSpeed runs on the CPU accelerator (one process, gloo);
its shared-memory all-reduce kernel only speeds up multi-rank CPU runs, so its one-off JIT build is skipped.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

if __name__ == "__main__":
    sys.path.insert(0, os.environ["PROJECT_ROOT"])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    from stages.params import load_params

    stage, params_path = sys.argv[1], sys.argv[2]
    P = load_params(params_path)
    t0 = time.perf_counter()
    if stage == "sft":
        from stages import sft

        sft.run(P.sft)
    elif stage == "grpo":
        from stages import grpo

        grpo.run(P.grpo)
    elif stage == "evaluate":
        from stages.evaluate import stage as evaluate

        evaluate.run(P.evaluate, sys.argv[3])
    else:
        raise SystemExit(f"unknown stage {stage}")
    print("RESULT " + json.dumps({"stage": stage, "wall_s": round(time.perf_counter() - t0, 2)}), flush=True)

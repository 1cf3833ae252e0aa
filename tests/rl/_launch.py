"""Run tests/rl/_ds_two_ranks.py as one plain process and as two torchrun ranks (gloo, CPU), for the tests that
compare the two (tests/rl/test_grpo_deepspeed.py, tests/rl/test_recipes_two_ranks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stages.core.dist import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "rl" / "_ds_two_ranks.py"


def _results(cmd: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]


def one_and_two_ranks(project: Path, mode: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the plain process's RESULT, the two ranks' RESULTs) of ``_ds_two_ranks.py <project> <mode>``; one thread per
    process, no torchrun variables inherited from the caller."""
    env = {**os.environ, "PROJECT_ROOT": str(ROOT), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    (one,) = _results([sys.executable, str(SCRIPT), str(project), mode], env)
    two = _results([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port()), str(SCRIPT), str(project), mode], env)
    return one, two

"""Dynamic sampling and the curriculum on two ranks (torchrun, gloo, DeepSpeed ZeRO-2 on the CPU accelerator) equal
one process: the ranks gather each round's per-group figures, so they keep the same groups, draw the same extra and
curriculum questions and apply the same update (tests/rl/_ds_two_ranks.py ``recipes``). Slow: two torchrun ranks
and one process (7 min at load 7 on the shared 2-core machine); .ci/run runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_grpo_deepspeed import _free_port


@pytest.mark.slow
def test_dynamic_sampling_and_curriculum_two_ranks_equal_one_process(project):
    pytest.importorskip("deepspeed")
    root = Path(__file__).resolve().parents[2]
    script = root / "tests" / "rl" / "_ds_two_ranks.py"
    env = {**os.environ, "PROJECT_ROOT": str(root), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)

    def results(cmd: list[str]) -> list[dict]:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]

    (one,) = results([sys.executable, str(script), str(project), "recipes"])
    two = results([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   str(_free_port()), str(script), str(project), "recipes"])
    assert any(r["ds_rounds"] > 1 for r in one["rows"])  # a planted all-equal group was refilled
    assert sorted(r["rank"] for r in two) == [0, 1] and all(r["world"] == 2 for r in two)
    assert sorted(two[0]["questions"] + two[1]["questions"]) == one["questions"]  # the ranks split one sampling
    for r in two:
        assert r["rows"] == one["rows"]  # same rounds, kept groups, shortfall, curriculum draws
        assert r["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
        assert r["checksum"] == pytest.approx(one["checksum"], abs=1e-4)

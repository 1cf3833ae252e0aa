"""Importing a module only defines things (issue 30 item 5, GUIDE: "importing a module has no side effects beyond
definitions"): every module of flows/ and stages/, imported one after the other in a fresh interpreter, leaves the
environment as it was, starts no thread and no process, and never exits the interpreter, also with the variables
a pipeline run sets for its stage commands (``DSM_STAGE_SERVER``, ``DVC_STAGE``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import importlib, json, os, pkgutil, sys, threading
try:  # torch's inductor config sets TORCHINDUCTOR_CACHE_DIR when imported: torch's doing, imported first
    import torch._inductor.config  # noqa: F401
except ImportError:
    pass
import flows, stages
names = sorted(m.name for pkg in (flows, stages) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."))
before = dict(os.environ)
problems = []
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as e:  # an optional dependency (vllm, ray ...) not installed here
        continue
    changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
    kids = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            kids += f.read().split()
    if changed or threading.active_count() != 1 or kids:
        problems.append(f"{name}: environment {changed}, threads {threading.active_count()}, processes {kids}")
        before = dict(os.environ)
print(json.dumps({"imported": len(names), "problems": problems}))
"""


def test_importing_any_module_has_no_side_effects() -> None:
    env = dict(os.environ, DSM_STAGE_SERVER="@dsm-no-such-server", DVC_STAGE="data", PYTHONPATH=str(ROOT))
    for k in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_UI_URL", "DO_NOT_TRACK", "DS_ACCELERATOR"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, "-m", "flows.data"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines, f"the interpreter exited during the imports:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    res = json.loads(lines[-1])
    assert res["imported"] > 90 and res["problems"] == [], res

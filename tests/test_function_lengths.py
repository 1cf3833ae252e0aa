"""No function in stages/ or flows/ over 60 lines (the code's shape: a function reads on one screen), but the few
named here, each with its reason; a new long function fails this test, and so does a listed one that got short (take
it off the list)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60
LONG = {
    "stages/core/vllm_backend.py:__init__": "one engine's construction (device, dtype, memory, in process or not), straight-line",
    "stages/core/_sandbox_zygote.py:user": "the pre-forked sandbox child: its setup before the request, then the run",
    "stages/core/_sandbox_zygote.py:_build_template": "the sandboxes' root file system (the allow-list's mounts), built once",
    "stages/core/_sandbox_zygote.py:init": "the sandbox's PID-1 setup (namespaces, limits), in the kernel's order",
    "stages/core/_sandbox_zygote.py:run_program": "one program's run as __main__ in the sandboxed child",
    "stages/core/sandbox.py:_drive": "the parent's loop over one child's pipes and its deadline",
    "flows/pipeline.py:main": "the pipeline command: names, params, inputs, servers, the run, the summary",
    "stages/reward_model.py:run": "the stage in its order: sample, label, split, train, evaluate, write",
}


def long_functions() -> dict[str, int]:
    """``path:name`` -> lines, for every function over :data:`MAX_LINES` lines in stages/ and flows/."""
    out = {}
    for pkg in ("stages", "flows"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                    if n > MAX_LINES:
                        out[f"{f.relative_to(ROOT)}:{node.name}"] = n
    return out


def test_no_new_long_function() -> None:
    found = long_functions()
    new = {k: v for k, v in found.items() if k not in LONG}
    assert not new, f"functions over {MAX_LINES} lines (split them, or add to LONG with the reason): {new}"
    gone = sorted(set(LONG) - set(found))
    assert not gone, f"no longer over {MAX_LINES} lines, take them off LONG: {gone}"

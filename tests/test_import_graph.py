"""The code's shape. No import circles in stages/: the graph of every ``import`` in the package's modules, those inside
functions included (a circle held apart by an import in a function is still a circle), has no cycle.

Edges: ``import a.b.c`` and ``from a.b import c`` (c a module) point at that module; ``from a.b import name`` (name
not a module) points at ``a.b``. Importing a module always runs its parent packages first, so an edge from a module
to one of its own parent packages counts only when it reads a name the package defines. ``if TYPE_CHECKING:``
blocks are left out (they never run).

No function in stages/ or flows/ over 60 lines (a function reads on one screen), but the few named in ``LONG``, each
with its reason; a new long function fails, and so does a listed one that got short (take it off the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str = "stages") -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package``."""
    out = {}
    for f in sorted((ROOT / package).rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` imports (rules in the module docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                if f"{src}.{a.name}" in mods:
                    out.add(f"{src}.{a.name}")
                elif src in mods:
                    out.add(src)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_stages_has_no_import_cycle() -> None:
    mods = modules("stages")
    graph = {m: imports(m, f, mods) for m, f in mods.items()}
    assert sum(len(v) for v in graph.values()) > 200  # the scan sees the package's imports
    found = cycles(graph)
    assert not found, f"import cycles in stages/: {found}"


def test_the_scan_finds_a_cycle_held_apart_by_a_function_level_import(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("import b\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from a import x\n    return x\n")
    mods = {"a": a, "b": b}
    assert cycles({m: imports(m, f, mods) for m, f in mods.items()}) == [["a", "b"]]
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import x\n")
    assert cycles({m: imports(m, f, mods) for m, f in mods.items()}) == []


# ---- function lengths

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

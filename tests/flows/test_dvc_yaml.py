"""dvc.yaml is exact: each stage's code deps are precisely the project modules its flow imports,
its params name schema sections, and its cmd runs the flow module of the same name."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

from stages.params import Params

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "stages")
# Files a module runs as a separate script rather than importing (invisible to the import scan).
RUNS_AS_SCRIPT = {
    "stages/core/sandbox.py": ["stages.core._sandbox_zygote"],
    "stages/core/_answers_pool.py": ["stages.core._answers_worker"],
}

# Packages whose modules are found at run time (a registry imports every module in them): the whole directory is
# the dependency (dvc.yaml lists the directory, so a module added there needs no dvc.yaml edit). A string
# "package.module:name" in a scanned file (a reward source's ``build``) counts as an import of that module.
DISCOVERED = {"stages/rl/sources/__init__.py"}
_BY_PATH = re.compile(r"^((?:flows|stages)(?:\.\w+)+):\w+$")

# How a stage is launched, not what it computes (like DVC itself): the fork server flows/__init__.py hands the
# command to, the shared Prefect API server, interrupt handling, the rank launcher of training stages and the
# dvc.yaml reader of the command lines; editing them must not re-run every stage.
LAUNCHER_ONLY = {"flows/_stage_server.py", "flows/_servers.py", "flows/_process.py", "flows/_launch.py", "flows/_dvc.py"}
# Validates the whole params file before a stage runs (it can refuse to run, never change what a stage computes):
# each stage depends on its own section's schema module, not on every section's (stages/params.py docstring).
VALIDATION_ONLY = {"stages/params.py", "stages/preflight.py"}


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def import_closure(module: str) -> set[str]:
    """Project files (relative paths) imported, transitively, by ``module`` (including itself)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        mod = todo.pop()
        for m in _with_parents(mod):
            f = _module_file(m)
            if f is None or str(f.relative_to(ROOT)) in seen or str(f.relative_to(ROOT)) in LAUNCHER_ONLY | VALIDATION_ONLY:
                continue
            seen.add(str(f.relative_to(ROOT)))
            todo.extend(RUNS_AS_SCRIPT.get(str(f.relative_to(ROOT)), []))
            if str(f.relative_to(ROOT)) in DISCOVERED:
                todo.extend(f"{m}.{g.stem}" for g in sorted(f.parent.glob("*.py")) if g.name != "__init__.py")
            pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
            for node in ast.walk(ast.parse(f.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                        src = ".".join(base + ([node.module] if node.module else []))
                    else:
                        src = node.module or ""
                    names = [src] + [f"{src}.{a.name}" for a in node.names]
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _BY_PATH.match(node.value):
                    names = [_BY_PATH.match(node.value).group(1)]  # type: ignore[union-attr]
                for n in names:
                    if n.split(".")[0] in PACKAGES and _module_file(n) is not None:
                        todo.append(n)
    return seen


def _stages() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    out = {}
    for name, st in doc["stages"].items():
        out[name] = st["do"] if "foreach" in st or "matrix" in st else st
    return out


def test_every_stage_runs_its_own_flow() -> None:
    for name, st in _stages().items():
        assert st["cmd"].split()[:3] == ["python", "-m", f"flows.{name}"], (name, st["cmd"])
        assert (ROOT / "flows" / f"{name}.py").is_file()


def as_declared(files: set[str]) -> set[str]:
    """The closure as dvc.yaml lists it: a DISCOVERED package as its directory."""
    dirs = {str(Path(d).parent) for d in DISCOVERED}
    return {f for f in files if str(Path(f).parent) not in dirs} | {d for d in dirs if any(
        str(Path(f).parent) == d for f in files)}


def test_code_deps_equal_the_flow_import_closure() -> None:
    for name, st in _stages().items():
        declared = {d if isinstance(d, str) else next(iter(d)) for d in st.get("deps", [])}
        code = {d for d in declared if d.endswith(".py") or d.split("/")[0] in PACKAGES}
        expected = as_declared(import_closure(f"flows.{name}"))
        assert code == expected, f"{name}: missing {sorted(expected - code)}, extra {sorted(code - expected)}"


def test_params_name_schema_sections() -> None:
    sections = set(Params.model_fields)
    for name, st in _stages().items():
        for p in st.get("params", []):
            key = p if isinstance(p, str) else next(iter(p))
            assert key.split(".")[0] in sections, (name, key)
        assert name in sections or "@" in name or name in {"evaluate"}, f"{name} has no params section"


def test_stage_order_follows_the_data_flow() -> None:
    names = list(_stages())
    order = ["data", "testsets", "ingest", "corpus", "base_model", "pretrain", "sft", "reward_model", "grpo", "evaluate",
             "report"]
    present = [n for n in order if n in names]
    assert [n for n in names if n in order] == present


if __name__ == "__main__":
    # Print the code deps dvc.yaml should list for a stage: python tests/flows/test_dvc_yaml.py sft
    import sys

    for stage in sys.argv[1:]:
        print(f"{stage}:")
        for f in sorted(as_declared(import_closure(f"flows.{stage}"))):
            print(f"      - {f}")

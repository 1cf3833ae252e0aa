"""dvc.yaml is exact: each stage's code deps are precisely the project modules its flow imports (written by
``python tests/flows/test_dvc_yaml.py --write``, checked current here), its params name schema sections, the schema
module holding a default is a code dep of every stage that reads it, and its cmd runs the flow module of the same
name."""

from __future__ import annotations

import ast
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from stages.params import Params
from stages.schema.base import Section

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

# How a stage is launched, not what it computes (like DVC itself): the package's (empty) __init__, the command line,
# checks and Prefect logging every flow shares (flows/_common.py), the pipeline's fork server, the shared Prefect API
# server, interrupt handling, the rank launcher of training stages and the dvc.yaml reader of the command lines;
# editing them must not re-run every stage (issue 30).
LAUNCHER_ONLY = {"flows/__init__.py", "flows/_common.py", "flows/_stage_server.py", "flows/_servers.py",
                 "flows/_process.py", "flows/_launch.py", "flows/_dvc.py"}
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


def code_deps(stage: str) -> list[str]:
    """The code deps dvc.yaml lists for ``stage``: its flow's import closure (:func:`as_declared`), sorted."""
    return sorted(as_declared(import_closure(f"flows.{stage}")))


def with_generated_deps(text: str) -> str:
    """dvc.yaml's text with each stage's code deps (its ``deps:`` items under flows/ or stages/) replaced by
    :func:`code_deps`, at the head of the list; every other line (data deps, comments) kept as it is."""
    lines, out, stage, i = text.splitlines(keepends=True), [], None, 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if m := re.match(r"^  (\w+):\s*$", line):
            stage = m.group(1)
        elif (m := re.match(r"^(\s+)deps:\s*$", line)) and stage is not None:
            item = m.group(1) + "  - "
            while i < len(lines) and lines[i].startswith(item) and lines[i][len(item):].startswith(PACKAGES):
                i += 1
            out.extend(f"{item}{f}\n" for f in code_deps(stage))
    return "".join(out)


def test_code_deps_are_generated_from_the_flow_import_closure() -> None:
    text = (ROOT / "dvc.yaml").read_text()
    assert with_generated_deps(text) == text, "dvc.yaml's code deps are stale: python tests/flows/test_dvc_yaml.py --write"
    for name, st in _stages().items():
        declared = {d if isinstance(d, str) else next(iter(d)) for d in st.get("deps", [])}
        code = {d for d in declared if d.endswith(".py") or d.split("/")[0] in PACKAGES}
        assert code == set(code_deps(name)), name


def _schema_modules(t: Any, into: set[str]) -> set[str]:
    """Modules declaring a field of the schema class ``t`` or of any class below it (bases included)."""
    if isinstance(t, type) and issubclass(t, Section):
        for c in t.__mro__:
            if isinstance(c, type) and issubclass(c, Section) and c.__dict__.get("__annotations__"):
                into.add(c.__module__.replace(".", "/") + ".py")
        for f in t.model_fields.values():
            _schema_modules(f.annotation, into)
    for a in typing.get_args(t):
        _schema_modules(a, into)
    return into


# Stages that import a schema module for its types (a function's annotation, a helper they call) without reading
# its defaults: editing that module re-runs them too (a superset: never a stage missed).
IMPORTS_WITHOUT_READING = {"stages/schema/corpus.py": {"ingest"}, "stages/schema/testsets.py": {"ingest"}}


def test_a_default_reruns_the_stages_that_read_it() -> None:
    """A default lives in its schema module (stages/schema/base.py's rules); that module is a code dep of every stage
    whose section reads it, and of no other (but :data:`IMPORTS_WITHOUT_READING`): editing a default re-runs exactly
    its readers. tests/flows/test_dvc_repro.py checks it with DVC itself."""
    readers: dict[str, set[str]] = {}
    stage_deps = {name: set(code_deps(name)) for name in _stages()}
    for name in stage_deps:
        for mod in _schema_modules(Params.model_fields[name].annotation, set()):
            readers.setdefault(mod, set()).add(name)
    for mod in sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "stages" / "schema").glob("*.py")):
        deps = {name for name, files in stage_deps.items() if mod in files}
        if mod == "stages/schema/__init__.py":
            continue
        assert readers.get(mod, set()) <= deps, f"{mod}: read by {readers[mod] - deps} without being a code dep"
        assert deps - readers.get(mod, set()) == IMPORTS_WITHOUT_READING.get(mod, set()), (mod, deps, readers.get(mod))


def dvc_reads() -> dict[str, str]:
    """The params keys dvc.yaml reads: ``value`` for what it interpolates (``${corpus.crawl_path}``, a foreach's
    collection), ``group`` for what a ``params:`` entry tracks; a params file names every one of them."""
    out: dict[str, str] = {}
    doc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for st in doc["stages"].values():
        body = st.get("do", st)
        texts = [st.get("foreach", "")] + [d if isinstance(d, str) else next(iter(d)) for d in body.get("deps", [])]
        for ref in re.findall(r"\$\{\s*([\w.]+)\s*\}", " ".join(texts)):
            if ref.split(".")[0] not in ("item", "key"):
                out[ref] = "value"
        for p in body.get("params", []):
            key = p if isinstance(p, str) else next(iter(p))
            if "${" not in key:
                out.setdefault(key, "group")
    return dict(sorted(out.items()))


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
    # python tests/flows/test_dvc_yaml.py --write: write every stage's code deps into dvc.yaml
    # python tests/flows/test_dvc_yaml.py STAGE...: print the code deps of these stages
    if sys.argv[1:] == ["--write"]:
        path = ROOT / "dvc.yaml"
        text = path.read_text()
        new = with_generated_deps(text)
        path.write_text(new)
        print("dvc.yaml: code deps " + ("rewritten" if new != text else "already current"))
    for stage in (a for a in sys.argv[1:] if a != "--write"):
        print(f"{stage}:")
        for f in code_deps(stage):
            print(f"      - {f}")

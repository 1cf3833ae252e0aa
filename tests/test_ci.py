"""The CI scripts: every group of .ci/slow names test files that exist and hold tests its marker selects; a group
covers what its tests executed (every process traced), so a change runs the groups it can reach and a docs-only
change runs none; and .ci/run runs the core, then the changed groups."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def slow():
    loader = importlib.machinery.SourceFileLoader("ci_slow", str(ROOT / ".ci" / "slow"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("ci_slow", loader))
    sys.modules["ci_slow"] = mod  # dataclasses resolve their annotations through it
    loader.exec_module(mod)
    yield mod
    sys.modules.pop("ci_slow", None)


def test_every_group_names_test_files_its_marker_selects(slow) -> None:
    assert {"dvc-graphs", "robustness", "heavy-suite", "vllm", "real-graph", "two-ranks"} <= set(slow.GROUPS)
    by_marker: dict[str, dict[str, str]] = {}  # marker: {file: group}
    for name, g in slow.GROUPS.items():
        for marker, files in [(g.marker, g.tests), *([g.more] if g.more else [])]:
            assert files, f"{name}: no test files"
            for f in files:
                assert (ROOT / f).is_file(), f"{name}: {f} does not exist"
            if g.venv != ".venv":  # vllm's tests skip at import without vllm: their markers are checked as text
                assert all("vllm" in (ROOT / f).read_text() for f in files), name
            else:
                by_marker.setdefault(marker, {}).update(dict.fromkeys(files, name))
    for marker, files in by_marker.items():  # one collection per marker
        out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", marker,
                              *files], capture_output=True, text=True, cwd=ROOT).stdout
        collected = {line.split("::")[0] for line in out.splitlines() if "::" in line}
        for f in set(files) - collected:
            pytest.fail(f"{files[f]}: -m {marker!r} selects nothing in {f}")


def test_the_trace_records_every_process_a_group_starts(slow, tmp_path: Path) -> None:
    """The .pth line .ci/slow installs runs .ci/import_trace.py: a process and its forked child (ending in os._exit,
    as the stage server's forks do) each write the project modules they imported."""
    site = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True)
    slow._install_trace(tmp_path / "venv")
    line = (site / "dsm_import_trace.pth").read_text()
    trace = tmp_path / "trace"
    trace.mkdir()
    env = {**os.environ, "DSM_IMPORT_TRACE": str(trace), "DSM_IMPORT_TRACE_HOOK": str(ROOT / ".ci" / "import_trace.py")}
    code = line + "import os, stages.core.errors\nif os.fork() == 0:\n    import stages.core.paths\n    os._exit(0)\nos.wait()\n"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    files = slow.measured(trace, slow.GROUPS["two-ranks"])
    assert {"stages/core/errors.py", "stages/core/paths.py", "stages/__init__.py", ".ci/slow", "pyproject.toml"} <= set(files)
    assert "dvc.yaml" not in files and not any(f.startswith("docs/") for f in files)
    (trace / "1.txt").write_text("tests.flows._project\n")  # a test copied the project: its graph is covered
    assert {"dvc.yaml", "params.yaml", "tests/flows/_project.py"} <= set(slow.measured(trace, slow.GROUPS["two-ranks"]))


def test_changed_groups_follow_the_record(slow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "passed.json"
    monkeypatch.setattr(slow, "RECORD", record)
    assert slow.changed() == list(slow.GROUPS)  # nothing recorded: every group
    covers = ["stages/rl/losses.py", "pyproject.toml"]
    record.write_text(json.dumps({n: {"covers": covers, "covers_sha256": slow.digest(covers)} for n in slow.GROUPS}))
    assert slow.changed() == []
    rec = json.loads(record.read_text())
    rec["two-ranks"]["covers_sha256"] = "0" * 64  # a file it covers changed since it passed
    record.write_text(json.dumps(rec))
    assert slow.changed() == ["two-ranks"]
    assert slow.digest(covers) != slow.digest(["stages/rl/advantages.py", "pyproject.toml"])
    # a module added beside a covered one (a package that discovers its modules) changes the digest
    monkeypatch.setattr(slow, "ROOT", tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = slow.digest(["pkg/a.py"])
    (tmp_path / "pkg" / "b.py").write_text("y = 1\n")
    assert slow.digest(["pkg/a.py"]) != before


def test_ci_run_runs_the_core_then_the_changed_groups() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    named = set(re.findall(r"tests/[\w/]+\.py", text))
    assert named, "no test file named in .ci/run"
    for f in named:
        assert (ROOT / f).is_file(), f".ci/run names {f}, which does not exist"
    assert ".ci/slow --changed" in text and "CI_ALL" in text and ".ci/check_pipeline.py" in text
    assert "timeout" not in text, "CI stops no check on the clock"

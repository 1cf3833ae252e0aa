"""The CI scripts: every group of .ci/slow names test files that exist and hold tests its marker selects; a group
covers what its tests can execute, so a change runs the groups it can break and a docs-only change runs none; and
.ci/run runs the core, then the changed groups."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
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


def test_a_group_covers_what_its_tests_execute(slow) -> None:
    cov = {name: set(slow.covers(name)) for name in slow.GROUPS}
    for name, files in cov.items():
        assert "pyproject.toml" in files and ".ci/slow" in files and "tests/conftest.py" in files, name
        assert not any(f.startswith("docs/") or f.endswith(".md") for f in files), name
        assert set(slow.GROUPS[name].tests) <= files
    assert "stages/core/vllm_backend.py" in cov["vllm"]
    for name in ("two-ranks", "gpu-scale", "vllm", "heavy-suite"):  # the RL groups run the loss
        assert "stages/rl/losses.py" in cov[name], name
    # a test that copies the project runs its graph: every stage's flow, dvc.yaml and the params files
    for name in ("dvc-graphs", "rl-experiments", "real-graph", "launcher"):
        assert {"dvc.yaml", "params.yaml", "flows/grpo.py", "flows/pipeline.py"} <= cov[name], name
    assert "dvc.yaml" not in cov["two-ranks"]  # no graph there


def test_changed_groups_follow_the_record(slow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "passed.json"
    monkeypatch.setattr(slow, "RECORD", record)
    assert slow.changed() == list(slow.GROUPS)  # nothing recorded: every group
    record.write_text(json.dumps({n: {"covers_sha256": slow.digest(n)} for n in slow.GROUPS}))
    assert slow.changed() == []
    rec = json.loads(record.read_text())
    rec["two-ranks"]["covers_sha256"] = "0" * 64  # its files changed since it passed
    record.write_text(json.dumps(rec))
    assert slow.changed() == ["two-ranks"]


def test_ci_run_runs_the_core_then_the_changed_groups() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    named = set(re.findall(r"tests/[\w/]+\.py", text))
    assert named, "no test file named in .ci/run"
    for f in named:
        assert (ROOT / f).is_file(), f".ci/run names {f}, which does not exist"
    assert ".ci/slow --changed" in text and "CI_ALL" in text and ".ci/check_pipeline.py" in text
    assert "timeout" not in text, "CI stops no check on the clock"

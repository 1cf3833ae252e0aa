"""The CI scripts name real tests: every check of .ci/slow (which .ci/run starts while CI time is left) has an idle
time and test files that exist and hold slow tests, and .ci/run's own pytest steps name files that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _slow(*args: str) -> str:
    return subprocess.run(["bash", str(ROOT / ".ci" / "slow"), *args], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout.strip()


def test_every_slow_check_has_minutes_and_slow_tests() -> None:
    names = _slow("--list").split()
    assert {"dvc-graphs", "robustness", "heavy-suite", "vllm"} <= set(names)
    files = {name: _slow("--tests", name).split() for name in names}
    for name in names:
        assert int(_slow("--minutes", name)) > 0, name
        assert files[name] or name == "vllm", f"{name}: no test files"
        for f in files[name]:
            assert (ROOT / f).is_file(), f"{name}: {f} does not exist"
    every = sorted({f for fs in files.values() for f in fs})
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", "slow", *every],
                         capture_output=True, text=True, cwd=ROOT).stdout
    collected = {line.split("::")[0] for line in out.splitlines() if "::" in line}
    for name, fs in files.items():
        for f in fs:
            assert f in collected, f"{name}: {f} holds no test marked slow (`-m slow` selects nothing there)"


def test_ci_run_names_existing_test_files() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    named = set(re.findall(r"tests/[\w/]+\.py", text))
    assert named, "no test file named in .ci/run"
    for f in named:
        assert (ROOT / f).is_file(), f".ci/run names {f}, which does not exist"
    assert "$(.ci/slow --list)" in text, ".ci/run no longer starts the checks of .ci/slow"


def _check_pipeline():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_pipeline", ROOT / ".ci" / "check_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pipeline_check_scales_budgets_by_the_measured_machine_speed() -> None:
    cp = _check_pipeline()
    ref = {"python": 0.5, "torch": 0.2}
    assert cp.speed_factor([{"python": 0.4, "torch": 0.1}], ref) == 1.0  # a faster machine never tightens them
    assert cp.speed_factor([{"python": 1.0, "torch": 0.3}, {"python": 0.6, "torch": 0.5}], ref) == 2.5  # the worst
    assert cp.speed_factor([{"python": 9.0}], {}) == 1.0  # no reference: no scaling
    assert all(v > 0 for v in cp.REFERENCE_S.values()), "REFERENCE_S must hold the reference machine's times"
    measured = cp.calibrate(repeats=1)
    assert set(measured) == set(cp.REFERENCE_S) and all(v > 0 for v in measured.values())

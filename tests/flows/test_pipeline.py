"""``python -m flows.pipeline`` as a command line (flows/pipeline.py): --help lists the stages, unknown names are
refused before anything starts, named stages run with their upstream stages (``--only``: not), ``--params FILE``
becomes params.yaml, and the closing git hint is a command that works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.flows._project import GIT, env, make_project, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("pipeline-cli") / "proj")


def test_help_lists_every_stage_with_its_description(project: Path) -> None:
    out = run([sys.executable, "-m", "flows.pipeline", "--help"], project)
    text = out.stdout
    for name in ("data", "corpus", "base_model", "pretrain", "sft", "reward_model", "grpo", "evaluate@sft"):
        assert re.search(rf"^  {re.escape(name)}\s+\S", text, re.M), f"{name} not listed:\n{text}"
    assert "--params FILE" in text and "--only" in text and "usage: python -m flows.pipeline" in text


def test_unknown_stage_is_refused_before_anything_starts(project: Path) -> None:
    t0 = time.perf_counter()
    out = run([sys.executable, "-m", "flows.pipeline", "sft", "evalute"], project, check=False)
    took = time.perf_counter() - t0
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: unknown stage 'evalute'; did you mean evaluate")
    assert not (project / ".prefect" / "servers").exists()  # no server was started
    assert took < 30, took  # the interpreter and the command line only (a few seconds on an idle machine)


@pytest.mark.parametrize("stage", ["data", "corpus", "base_model", "pretrain", "sft", "reward_model", "grpo",
                                   "evaluate"])
def test_every_stage_help_names_its_command(stage: str) -> None:
    out = subprocess.run([sys.executable, "-m", f"flows.{stage}", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m flows.{stage} [-h] [--params FILE]"), out.stdout[:200]
    assert f"`dvc repro {stage}`" in " ".join(out.stdout.split())
    if stage == "evaluate":
        assert "--model NAME" in out.stdout


def test_named_stages_run_with_their_upstream_stages(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.pipeline import plan

    monkeypatch.chdir(project)
    assert plan(["sft"]) == ["data", "testsets@generated", "corpus", "base_model", "pretrain", "sft"]
    assert plan(["evaluate@pretrain", "base_model"]) == ["data", "testsets@generated", "corpus", "base_model",
                                                          "pretrain", "evaluate@pretrain"]
    assert plan(["grpo", "sft"], only=True) == ["sft", "grpo"]
    assert plan([])[:4] == ["data", "testsets@generated", "corpus", "base_model"] and plan([])[-1] == "report" \
        and len(plan([])) == 14


def test_run_then_the_closing_git_hint_works(project: Path) -> None:
    out = run([sys.executable, "-m", "flows.pipeline", "data"], project, env(), timeout=900)
    assert re.search(r"^data\s+ran\s", out.stdout, re.M), out.stdout[-2000:]
    hint = [x for x in out.stdout.splitlines() if x.startswith("to record this run in git: ")]
    assert len(hint) == 1, out.stdout[-2000:]
    cmd = hint[0].removeprefix("to record this run in git: ").split(" (`dvc push`")[0]
    assert cmd.startswith("git add dvc.lock data/metrics && git commit"), cmd  # details: DVC-cached
    done = subprocess.run(cmd.replace("git commit", " ".join(GIT) + " commit", 1), shell=True, cwd=project,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    status = run(["git", "status", "--porcelain"], project).stdout
    assert status == "", status  # everything the run changed is recorded
    again = run([sys.executable, "-m", "flows.pipeline", "data"], project, env(), timeout=900)
    assert re.search(r"^data\s+skipped\s", again.stdout, re.M) and "to record this run" not in again.stdout


def test_params_file_becomes_params_yaml_unless_it_has_edits(project: Path, tmp_path: Path) -> None:
    from flows.pipeline import adopt_params

    other = tmp_path / "other.yaml"
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["data"]["seed"] = 11
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    cwd = os.getcwd()
    os.chdir(project)
    try:
        (project / "params.yaml").write_text((project / "params.yaml").read_text() + "# an edit\n")
        with pytest.raises(Exception, match="params.yaml has uncommitted edits"):
            adopt_params(str(other))
        run(["git", "checkout", "params.yaml"], project)
        assert adopt_params(str(other)) is True
        assert yaml.safe_load((project / "params.yaml").read_text())["data"]["seed"] == 11
        assert adopt_params(str(other)) is False  # already the run's params
    finally:
        run(["git", "checkout", "params.yaml"], project)
        os.chdir(cwd)

"""``python -m flows.pipeline`` as a command line (flows/pipeline.py): --help lists the stages, unknown names are
refused before anything starts, named stages run with their upstream stages (``--only``: not), ``--params FILE``
runs with FILE's values and never touches params.yaml, a run holds the project (DVC's lock) from start to end, the closing git hint is a command that works, and every
stage command's --help answers without importing torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from stages.core.errors import PipelineError
from stages.params import resolve
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


STAGES = ["data", "testsets", "ingest", "corpus", "base_model", "pretrain", "sft", "reward_model", "grpo", "evaluate",
          "report"]
HELP = r"""
import contextlib, io, json, runpy, sys
out = {}
for stage in sys.argv[1:]:
    sys.argv = [f"flows/{stage}.py", "--help"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        runpy.run_module(f"flows.{stage}", run_name="__main__", alter_sys=True)
    out[stage] = buf.getvalue()
print(json.dumps({"help": out, "torch": "torch" in sys.modules}))
"""


def test_every_stage_help_names_its_command_without_importing_torch() -> None:
    out = subprocess.run([sys.executable, "-c", HELP, *STAGES], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k not in ("DSM_STAGE_SERVER", "DVC_STAGE")})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["torch"] is False  # --help imports prefect and the params schema, not the stages (issue 35)
    for stage, text in res["help"].items():
        assert text.startswith(f"usage: python -m flows.{stage} [-h] [--params FILE]"), text[:200]
        assert f"`dvc repro {stage}`" in " ".join(text.split())
    assert "--model NAME" in res["help"]["evaluate"]
    assert "--name NAME" in res["help"]["testsets"] and "--name NAME" in res["help"]["ingest"]


def test_named_stages_run_with_their_upstream_stages(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.pipeline import plan

    monkeypatch.chdir(project)
    assert plan(["sft"]) == ["data", "testsets@generated", "corpus", "base_model", "pretrain", "sft"]
    assert plan(["evaluate@pretrain", "base_model"]) == ["data", "testsets@generated", "corpus", "base_model",
                                                          "pretrain", "evaluate@pretrain"]
    assert plan(["grpo", "sft"], only=True) == ["sft", "grpo"]
    assert plan([])[:4] == ["data", "testsets@generated", "corpus", "base_model"] and plan([])[-1] == "report" \
        and len(plan([])) == 14


@pytest.mark.slow  # ~15 s: .ci/slow heavy-suite (the README suite stays under 10 min)
def test_run_then_the_closing_git_hint_works(project: Path, prefect_api: str) -> None:
    out = run([sys.executable, "-m", "flows.pipeline", "data"], project, env(prefect_api), timeout=900)
    assert re.search(r"^data\s+ran\s", out.stdout, re.M), out.stdout[-2000:]
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:  # the stage's flow run, found by its DVC stage address
        tagged = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["dvc:data"])))
    assert [r.flow_id for r in tagged] and all(r.tags == ["dvc:data"] for r in tagged), tagged
    hint = [x for x in out.stdout.splitlines() if x.startswith("to record this run in git: ")]
    assert len(hint) == 1, out.stdout[-2000:]
    cmd = hint[0].removeprefix("to record this run in git: ").split(" (`dvc push`")[0]
    assert cmd.startswith("git add dvc.lock data/metrics && git commit"), cmd  # details: DVC-cached
    done = subprocess.run(cmd.replace("git commit", " ".join(GIT) + " commit", 1), shell=True, cwd=project,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    status = run(["git", "status", "--porcelain"], project).stdout
    assert status == "", status  # everything the run changed is recorded
    again = run([sys.executable, "-m", "flows.pipeline", "data"], project, env(), timeout=900)  # no API given
    assert re.search(r"^data\s+skipped\s", again.stdout, re.M) and "to record this run" not in again.stdout
    # nothing to do: said at once, and no server started (a no-op costs DVC's status check, not a Prefect start-up)
    assert "pipeline: every stage is up to date or restored from the run-cache (dvc status); nothing to run" in again.stdout, again.stdout[-2000:]
    assert not (project / ".prefect" / "servers" / "api.log").exists()
    # a params edit runs the stage; put back, its earlier outputs come from the run-cache, again with no server
    params = project / "params.yaml"
    original = params.read_text()
    raw = yaml.safe_load(original)
    raw["data"]["problems"]["n_test"] += 1
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    edited = run([sys.executable, "-m", "flows.pipeline", "data"], project, env(prefect_api), timeout=900)
    assert re.search(r"^data\s+ran\s", edited.stdout, re.M), edited.stdout[-2000:]
    params.write_text(original)
    back = run([sys.executable, "-m", "flows.pipeline", "data"], project, env(), timeout=900)
    assert re.search(r"^data\s+restored\s", back.stdout, re.M), back.stdout[-2000:]
    assert "nothing to run" in back.stdout and not (project / ".prefect" / "servers" / "api.log").exists()
    assert run(["git", "status", "--porcelain"], project).stdout == ""  # the same bytes as the recorded run


@pytest.mark.slow  # ~15 s: .ci/slow heavy-suite (the README suite stays under 10 min)
def test_params_file_runs_with_its_values_and_leaves_params_yaml_as_it_was(project: Path, tmp_path: Path,
                                                                          prefect_api: str) -> None:
    """``--params FILE``: DVC records FILE's values (dvc.lock), params.yaml keeps its bytes, uncommitted edits
    included, and the closing hint says how to record the run."""
    other = tmp_path / "other.yaml"
    raw = resolve(project / "params.yaml")
    raw["data"]["seed"] = 11
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    mine = (project / "params.yaml").read_bytes() + b"# an uncommitted edit\n"
    (project / "params.yaml").write_bytes(mine)
    try:
        out = run([sys.executable, "-m", "flows.pipeline", "--only", "data", "--params", str(other)], project,
                  env(prefect_api), timeout=900)
        assert (project / "params.yaml").read_bytes() == mine
        assert not list(project.glob(".params.yaml.swapped-*"))
        lock = yaml.safe_load((project / "dvc.lock").read_text())
        assert lock["stages"]["data"]["params"]["params.yaml"]["data"]["seed"] == 11
        assert f"cp {other} params.yaml first" in out.stdout, out.stdout[-2000:]
    finally:
        run(["git", "checkout", "params.yaml", "dvc.lock", "data"], project, check=False)


def test_a_run_holds_the_project_and_dvc_reads_its_params_file(project: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50: for a run, DVC (in the pipeline's process) reads ``--params FILE`` where it reads params.yaml, which
    is never touched; the run holds the project from its start to its end (another run, a stage by hand, wait), and
    lets it go after."""
    import zc.lockfile
    from dvc.repo import Repo

    from flows import _process
    from flows.pipeline import project as run_project

    def seed() -> int:
        with Repo() as repo:
            (data,) = [s for s in repo.index.stages if s.addressing == "data"]
            return [d for d in data.deps if d.def_path == "params.yaml"][0].read_params()["data"]["seed"]

    monkeypatch.chdir(project)
    other = tmp_path / "other.yaml"
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["data"]["seed"] = 7
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    before = (project / "params.yaml").read_bytes()
    with run_project(str(other)):
        assert seed() == 7 and os.environ[_process.RUN_ENV] == str(os.getpid())
        with pytest.raises(zc.lockfile.LockError):
            zc.lockfile.LockFile(_process.RUN_LOCK)
        assert _process.hold_run_lock("stage data") is None  # a stage command of this run: inside its hold
        monkeypatch.delenv(_process.RUN_ENV)  # a stage command of a plain `dvc repro` meanwhile: refused
        with pytest.raises(PipelineError, match=rf"this project is being run by pid {os.getpid()} \("):
            _process.hold_run_lock("stage data", wait=False)
        assert (project / "params.yaml").read_bytes() == before
    zc.lockfile.LockFile(_process.RUN_LOCK).close()
    assert seed() == 0 and _process.RUN_ENV not in os.environ


def test_the_summary_says_which_precision_made_the_models(tmp_path: Path) -> None:
    """The pipeline's closing lines include the training stages' recorded precision and what chose it."""
    from flows.pipeline import hardware_line

    assert hardware_line(tmp_path) is None
    amx = {"precision": "bf16", "precision_from": "auto: CPU with AMX (AVX512)", "device": "cpu (AVX512, AMX)"}
    for stage, hw in (("pretrain", amx), ("sft", amx), ("grpo", {**amx, "precision": "fp32",
                                                                 "precision_from": "params"})):
        (tmp_path / f"{stage}.json").write_text(json.dumps({"hardware": hw, "wall_s": 1.0}))
    assert hardware_line(tmp_path) == ("precision: pretrain bf16, sft bf16 (auto: CPU with AMX (AVX512)); "
                                       "grpo fp32 (params)")

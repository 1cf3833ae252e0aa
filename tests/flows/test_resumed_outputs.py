"""A resumed run's tracked outputs equal a clean run's (issue 47): in one temporary project the shrunk graph runs
clean up to grpo (tests/flows/test_dvc_determinism.py ``shrink_graph``, a checkpoint after every step) and every
output DVC tracks is hashed (``stages.core.io.output_hashes``); then each training stage (pretrain, sft,
reward_model, grpo) is run again from no checkpoint, SIGKILLed right after its first checkpoint is complete, and
``dvc repro -f -s <stage>`` resumes it from there: every tracked output hashes as after the clean run. How the run got
there (resumed from which step, labels read back) is in data/timings/<stage>.json alone."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import pytest
import yaml

from stages.core.io import output_hashes
from stages.params import resolve
from tests.flows._project import GIT, env, make_project, run
from tests.flows.test_dvc_determinism import shrink_graph

pytestmark = pytest.mark.slow  # the shrunk graph to grpo once and four stages twice: .ci/slow heavy-suite

STAGES = ("pretrain", "sft", "reward_model", "grpo")
CHECKPOINT_EVERY = {"pretrain": {"train": {"checkpoint_every": 1}}, "sft": {"train": {"checkpoint_every": 1}},
                    "reward_model": {"checkpoint_every": 1}, "grpo": {"checkpoint_every": 1}}
"""``runtime:`` (tracked by no stage): a checkpoint after every step, so the first comes before the end."""
KILLED_AT_FIRST_CHECKPOINT = (  # the stage's rank entry (stages.core.cli), SIGKILLed once its first checkpoint is in place
    "import os, runpy, signal, sys\n"
    "from stages.train import checkpoint as ck\n"
    "ck.prune = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # called right after the rename into place\n"
    "stage = sys.argv.pop(1)\n"
    "runpy.run_module(f'stages.{stage}', run_name='__main__')\n")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> tuple[Path, dict[str, str]]:
    proj = make_project(tmp_path_factory.mktemp("resumed") / "proj")
    raw = shrink_graph(resolve(proj / "params.yaml"))
    raw["runtime"] = CHECKPOINT_EVERY
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    run(GIT + ["commit", "-qam", "shrunk graph"], proj)
    run(["dvc", "repro", *STAGES], proj, env(prefect_api))
    return proj, output_hashes(proj)


@pytest.mark.parametrize("stage", STAGES)
def test_kill_9_then_resume_gives_the_clean_bytes(clean: tuple[Path, dict[str, str]], prefect_api: str,
                                                  stage: str) -> None:
    proj, before = clean
    ckpts = proj / "checkpoints" / stage
    shutil.rmtree(ckpts, ignore_errors=True)  # pretrain / sft keep their last one: start from none
    killed = run([sys.executable, "-c", KILLED_AT_FIRST_CHECKPOINT, stage], proj, env(), check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert any(ckpts.rglob("step-*/manifest.json")), f"no checkpoint under {ckpts}"
    run(["dvc", "repro", "-f", "-s", stage], proj, env(prefect_api))
    timings = (proj / "data" / "timings" / f"{stage}.json").read_text()
    assert '"resumed_from_step": 1' in timings, timings  # it resumed (grpo: per iteration; no DVC output)
    after = output_hashes(proj)
    assert {k: v for k, v in after.items() if before.get(k) != v} == {}
    assert after.keys() == before.keys()

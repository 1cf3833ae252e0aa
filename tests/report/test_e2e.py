"""End to end: ``dvc repro -s report`` in a temporary git repo holding a fake run prints the headline results and
the report's path, publishes the summary artifact, and is a no-op the second time; a corrupt metrics file stops
``python -m flows.report`` with one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows._project import copy_sources
from tests.report.fake_run import write_fake_run

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("DSM_STAGE_SERVER", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow  # ~15 s: .ci/slow heavy-suite (the README suite stays under 10 min)
def test_dvc_repro_report_prints_headline_and_path(tmp_path: Path, prefect_api: str) -> None:
    copy_sources(tmp_path)
    write_fake_run(tmp_path, skip=("paradigm", "paradigm_rm", "iterative"))  # the committed comparison results stay
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "init"], cwd=tmp_path, check=True)

    out = _run(["dvc", "repro", "-s", "report"], tmp_path).stdout
    assert "Running stage 'report'" in out
    tail = out[out.index("held-out accuracy per model"):]
    assert re.search(r"^grpo\s+generated\s+0\.550\s+0\.792\s+0\.806\s+0\.700\s+0\.460$", tail, re.M), tail
    assert re.search(r"^report: data/report/index\.html \(open file://\S+/data/report/index\.html", tail, re.M)
    assert (tmp_path / "data/report/index.html").stat().st_size > 100_000
    assert (tmp_path / "data/metrics/report.json").is_file()

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["report-summary"])))
    assert arts and "| grpo | DeepSeekMath-RL 7B | zero-shot | generated | 0.550 ± 0.022 |" in arts[0].data

    again = _run(["dvc", "repro", "-s", "report"], tmp_path).stdout
    assert "Running stage" not in again

    (tmp_path / "data/details/grpo.json").write_text("{not json")
    bad = _run([sys.executable, "-m", "flows.report"], tmp_path, ok=False)
    assert bad.returncode == 2
    # the last line, as for every stage (Prefect's own log of the failed flow run comes before it)
    errors = [x for x in bad.stderr.splitlines() if x.startswith("error:")]
    assert errors == [bad.stderr.strip().splitlines()[-1]], bad.stderr
    assert errors[0].startswith("error: data/details/grpo.json: not valid JSON"), bad.stderr


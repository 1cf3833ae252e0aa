"""DVC experiments on the pipeline: ``dvc exp run -S`` (and ``--queue``) records each stage's headline metrics
(data/metrics/<stage>.json is git-tracked, so the experiment commit holds it), ``dvc exp show`` displays them in a
few columns, ``--dry`` works on a stage, and outputs that DVC caches are byte-identical for identical inputs
(timings live in the metrics and reports, which DVC does not cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.flows._project import GIT, env, make_project, run


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> Path:
    proj = make_project(tmp_path_factory.mktemp("experiments") / "proj")
    run(["dvc", "repro", "corpus"], proj, env(prefect_api))
    run(["git", "add", "-A"], proj)
    run(GIT + ["commit", "-qm", "data and corpus"], proj)
    return proj


def _lock_md5(project: Path) -> dict[str, str]:
    """{stage: md5 of each cached output} from dvc.lock."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    return {f"{name}:{o['path']}": o.get("md5", "") for name, st in lock["stages"].items()
            for o in st.get("outs", []) if not o["path"].startswith(("data/metrics", "data/details", "data/plots"))}


def test_same_inputs_give_byte_identical_cached_outputs(project: Path, prefect_api: str) -> None:
    before = _lock_md5(project)
    run(["dvc", "repro", "-f", "corpus"], project, env(prefect_api))  # data, testsets@generated and corpus run again
    after = _lock_md5(project)
    assert after == before and {k.split(":")[0] for k in before} == {"data", "testsets@generated", "corpus"}, \
        (before, after)
    rounds = json.loads((project / "data" / "corpus" / "reports" / "rounds.json").read_text())
    assert not any(k.endswith("_s") for r in rounds for k in r)  # timings went to the metrics
    assert "train_s" in json.loads((project / "data" / "details" / "corpus.json").read_text())["rounds"][0]
    run(["git", "checkout", "."], project)


def test_exp_run_records_headline_metrics_and_exp_show_is_readable(project: Path, prefect_api: str) -> None:
    out = run(["dvc", "exp", "run", "-n", "seed3", "-S", "data.seed=3", "data"], project, env(prefect_api))
    assert "Ran experiment(s): seed3" in out.stdout, out.stdout[-2000:]
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    exps = [e for rev in shown for e in (rev.get("experiments") or []) if e.get("name") == "seed3"]
    assert exps, json.dumps(shown)[:2000]
    data = exps[0]["revs"][0]["data"]
    metrics = data["metrics"]["data/metrics/data.json"]["data"]
    assert metrics["problems"]["sft"] == 120 and metrics["wall_s"] > 0 and len(json.dumps(metrics)) < 400
    text = run(["dvc", "exp", "show", "--only-changed", "--no-pager", "--md"], project).stdout
    header = text.splitlines()[0]
    assert "data.seed" in header and header.count("|") < 40, header  # a few columns, not hundreds
    run(["dvc", "exp", "remove", "seed3"], project)
    run(["git", "checkout", "."], project)


def test_dry_run_prints_the_commands_and_changes_nothing(project: Path, prefect_api: str) -> None:
    before = run(["git", "status", "--porcelain"], project).stdout
    out = run(["dvc", "exp", "run", "--dry", "-S", "data.seed=5", "data"], project, env(prefect_api))
    assert "> python -m flows.data" in out.stdout, out.stdout[-2000:]
    assert run(["git", "status", "--porcelain"], project).stdout == before
    assert "seed" not in run(["dvc", "exp", "list", "--name-only"], project).stdout


@pytest.mark.slow
def test_queued_experiment_records_its_metrics(project: Path, prefect_api: str) -> None:
    run(["dvc", "exp", "run", "--queue", "-n", "queued4", "-S", "data.seed=4", "data"], project, env(prefect_api))
    run(["dvc", "exp", "run", "--run-all"], project, env(prefect_api), timeout=1200)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    exps = [e for rev in shown for e in (rev.get("experiments") or []) if e.get("name") == "queued4"]
    metrics = exps[0]["revs"][0]["data"]["metrics"]["data/metrics/data.json"]["data"]
    assert metrics["problems"]["sft"] == 120

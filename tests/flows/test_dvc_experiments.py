"""DVC experiments and the run-cache on the pipeline: ``dvc exp run -S`` (and ``--queue``) records each stage's
headline metrics (data/metrics/<stage>.json is git-tracked, so the experiment commit holds it), ``dvc exp show``
displays them in a few columns, ``--dry`` works on a stage; every output DVC tracks is byte-identical for identical
inputs (the timings are in data/timings/, which neither DVC nor git tracks), so a rerun changes nothing and going back
to an earlier params value restores the stage from DVC's run-cache without running it (issue 34)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from tests.flows._project import GIT, ROOT, env, make_project, run, tree_hash

pytestmark = pytest.mark.slow  # dvc exp run and the run-cache on real graphs: ~145 s; .ci/slow dvc-graphs


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> Path:
    proj = make_project(tmp_path_factory.mktemp("experiments") / "proj")
    run(["dvc", "repro", "corpus"], proj, env(prefect_api))
    run(["git", "add", "-A"], proj)
    run(GIT + ["commit", "-qm", "data and corpus"], proj)
    return proj


def _lock_md5(project: Path) -> dict[str, str]:
    """{stage:path: md5} of every output dvc.lock records (cached outputs, metrics, details and plots alike)."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    return {f"{name}:{o['path']}": o.get("md5", "") for name, st in lock["stages"].items() for o in st.get("outs", [])}


def test_same_inputs_change_nothing_that_dvc_or_git_tracks(project: Path, prefect_api: str) -> None:
    lock_before = (project / "dvc.lock").read_text()
    timing_before = (project / "data" / "timings" / "corpus.json").read_bytes()
    run(["dvc", "repro", "-f", "corpus"], project, env(prefect_api))  # data, testsets@generated and corpus run again
    assert (project / "dvc.lock").read_text() == lock_before  # metrics, details and plots included
    assert run(["git", "status", "--porcelain"], project).stdout == ""  # the timings are git-ignored
    assert run(["dvc", "status", "corpus"], project).stdout.strip() == "Data and pipelines are up to date."
    assert (project / "data" / "timings" / "corpus.json").read_bytes() != timing_before  # the stage did run
    rounds = json.loads((project / "data" / "corpus" / "reports" / "rounds.json").read_text())
    assert not any(k.endswith("_s") for r in rounds for k in r)  # timings went to data/timings
    details = json.loads((project / "data" / "details" / "corpus.json").read_text())
    assert "train_s" not in details["rounds"][0] and "wall_s" not in details
    timings = json.loads((project / "data" / "timings" / "corpus.json").read_text())
    assert timings["wall_s"] > 0 and "train_s" in timings["rounds"][0] and len(timings["loadavg"]) == 3


def _outputs(project: Path, stage: str) -> dict[str, str]:
    """{path: tree hash} of ``stage``'s outputs as dvc.yaml names them (outs, metrics, plots)."""
    body = yaml.safe_load((project / "dvc.yaml").read_text())["stages"][stage]
    paths = [next(iter(o)) if isinstance(o, dict) else o for k in ("outs", "metrics", "plots") for o in body.get(k, [])]
    return {p: hashlib.md5((project / p).read_bytes()).hexdigest() if (project / p).is_file() else tree_hash(project / p)
            for p in paths}


def test_going_back_to_an_earlier_value_restores_from_the_run_cache(project: Path, prefect_api: str) -> None:
    """Issue 34: run corpus (cached directory, details, metrics, plots), change a value, run, change it back, run: the
    third run restores every output from the run-cache, byte-identical to the first, without running the command
    (DVC says so, and the timings file the command writes keeps the second run's bytes)."""
    params = project / "params.yaml"
    original = params.read_text()
    first = _outputs(project, "corpus")
    # the corpus, its resolved-params record (data/params/corpus.yaml, issue 44), details, metrics, plots
    assert len(first) == 5 and all((project / p).exists() for p in first), first
    try:
        raw = yaml.safe_load(original)
        raw["corpus"]["seed"] = 1
        params.write_text(yaml.safe_dump(raw, sort_keys=False))
        out = run(["dvc", "repro", "corpus"], project, env(prefect_api)).stdout
        assert "Running stage 'corpus'" in out, out[-2000:]
        second = _outputs(project, "corpus")
        assert second["data/details/corpus.json"] != first["data/details/corpus.json"]  # the value changed results
        timing = (project / "data" / "timings" / "corpus.json").read_bytes()
        params.write_text(original)
        out = run(["dvc", "repro", "corpus"], project, env(prefect_api)).stdout
        assert "Stage 'corpus' is cached - skipping run, checking out outputs" in out, out[-2000:]
        assert "Running stage" not in out, out[-2000:]
        assert (project / "data" / "timings" / "corpus.json").read_bytes() == timing  # the command did not run
        assert _outputs(project, "corpus") == first
        assert run(["git", "status", "--porcelain"], project).stdout == ""
    finally:
        params.write_text(original)
        run(["git", "checkout", "."], project)


def test_no_stage_has_an_uncached_plain_output() -> None:
    """DVC skips the run-cache for a stage with a ``cache: false`` entry under ``outs`` (metrics and plots entries
    are exempt: dvc/stage/__init__.py, ``Stage.run``, ``no_cache_outs``); and no stage may output data/timings/, which
    is git-ignored and changes on every run."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    bad, timing = [], []
    for name, st in stages.items():
        body = st.get("do", st)
        for kind in ("outs", "metrics", "plots"):
            for o in body.get(kind, []):
                path, opts = (next(iter(o.items())) if isinstance(o, dict) else (o, None))
                if kind == "outs" and (opts or {}).get("cache") is False:
                    bad.append(f"{name}: {path}")
                if str(path).startswith("data/timings"):
                    timing.append(f"{name}: {path}")
    assert not bad, f"plain outputs with cache: false deactivate the run-cache: {bad}"
    assert not timing, timing
    assert len(stages) >= 10
    ignored = run(["git", "check-ignore", "data/timings/x.json", "data/details/x.json"], ROOT, check=False).stdout
    assert ignored.split() == ["data/timings/x.json", "data/details/x.json"]


def test_exp_run_records_headline_metrics_and_exp_show_is_readable(project: Path, prefect_api: str) -> None:
    for name, seed in (("seed3", 3), ("seed4", 4)):
        out = run(["dvc", "exp", "run", "-n", name, "-S", f"data.seed={seed}", "data"], project, env(prefect_api))
        assert f"Ran experiment(s): {name}" in out.stdout, out.stdout[-2000:]
        assert [sorted(r.tags) for r in _tagged(f"exp:{name}")] == [["dvc:data", f"exp:{name}"]]
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    for name in ("seed3", "seed4"):
        exps = [e for rev in shown for e in (rev.get("experiments") or []) if e.get("name") == name]
        assert exps, json.dumps(shown)[:2000]
        data = exps[0]["revs"][0]["data"]
        metrics = data["metrics"]["data/metrics/data.json"]["data"]
        assert metrics["problems"]["sft"] == 120 and metrics["crawl"]["pages"] > 0 and len(json.dumps(metrics)) < 400
        assert "wall_s" not in metrics  # timings are no DVC output
    text = run(["dvc", "exp", "show", "--only-changed", "--no-pager", "--md"], project).stdout
    header = text.splitlines()[0]
    assert "data.seed" in header and header.count("|") < 40, header  # a few columns, not hundreds
    # the details are a DVC-cached output of the experiment: its dvc.lock names them, the cache holds them (`dvc exp
    # apply seed4` would check them out with the rest of its outputs)
    rev = next(e for rev in shown for e in (rev.get("experiments") or []) if e.get("name") == "seed4")["revs"][0]["rev"]
    lock = yaml.safe_load(run(["git", "show", f"{rev}:dvc.lock"], project).stdout)
    md5 = next(o["md5"] for o in lock["stages"]["data"]["outs"] if o["path"] == "data/details/data.json")
    details = json.loads((project / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).read_text())
    assert details["problems"]["sft"] == 120 and "wall_s" not in details
    run(["dvc", "exp", "remove", "seed3", "seed4"], project)
    run(["git", "checkout", "."], project)


def test_dry_run_prints_the_commands_and_changes_nothing(project: Path, prefect_api: str) -> None:
    before = run(["git", "status", "--porcelain"], project).stdout
    out = run(["dvc", "exp", "run", "--dry", "-S", "data.seed=5", "data"], project, env(prefect_api))
    assert "> python -m flows.data" in out.stdout, out.stdout[-2000:]
    assert run(["git", "status", "--porcelain"], project).stdout == before
    assert "seed" not in run(["dvc", "exp", "list", "--name-only"], project).stdout


@pytest.mark.slow
def test_queued_experiment_records_its_metrics(project: Path, prefect_api: str) -> None:
    (project / ".prefect" / "params" / "data.yaml").unlink(missing_ok=True)
    run(["dvc", "exp", "run", "--queue", "-n", "queued11", "-S", "data.seed=11", "data"], project, env(prefect_api))
    run(["dvc", "exp", "run", "--run-all"], project, env(prefect_api), timeout=1200)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    exps = [e for rev in shown for e in (rev.get("experiments") or []) if e.get("name") == "queued11"]
    metrics = exps[0]["revs"][0]["data"]["metrics"]["data/metrics/data.json"]["data"]
    assert metrics["problems"]["sft"] == 120
    # it ran in DVC's temporary copy (.dvc/tmp/exps/...), its Prefect state in the project's: the params it logged
    assert yaml.safe_load((project / ".prefect" / "params" / "data.yaml").read_text())["data"]["seed"] == 11
    assert _tagged("dvc:data", "exp:queued11")  # its flow run, found by the stage and the experiment's name


def _tagged(*tags: str) -> list:
    """The flow runs of the test's Prefect API that carry every one of ``tags``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=list(tags))))

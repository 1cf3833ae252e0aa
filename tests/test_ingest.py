"""The testsets and ingest stages: outputs, reports, decontamination of training rows against the test sets, hub
snapshots (fetched with datasets.load_dataset from a local dataset directory: the hub is not reachable here), and
the ingestion of the real GSM8K / MATH / GSM-Hard files (tests/core/test_ingestion.py: the adapters themselves)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages import ingest, testsets
from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.ingestion import convert
from stages.core.io import untimed
from stages.params import resolve
from stages.schema.datasets import DatasetSpec
from stages.schema.ingest import IngestParams
from stages.schema.testsets import TestsetsParams

TEST = [{"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                     "How many clips did Natalia sell altogether in April and May?",
         "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"}]
TRAIN = [
    {"question": "Weng earns $12 an hour for babysitting. Yesterday she did 50 minutes of babysitting. How much did "
                 "she earn?", "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nShe earned 0.2 x 50 = "
                 "$<<0.2*50=10>>10.\n#### 10"},
    {"question": "Homework help please: " + TEST[0]["question"], "answer": "48 + 24 = <<48+24=72>>72\n#### 72"},
]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ds(path: Path | str, adapter: str, **kw: Any) -> dict[str, Any]:
    return {"path": str(path), "hub": None, "adapter": adapter, "fields": {}, "match": {}, "limit": None, **kw}


def _testsets(sets: dict[str, dict[str, Any]]) -> TestsetsParams:
    return TestsetsParams.model_validate({"common": {"exec_timeout_s": 5.0, "exec_workers": 1, "samples": 2},
                                          "datasets": sets})


def _ingest(sets: dict[str, dict[str, Any]], min_overlap: float = 0.7) -> IngestParams:
    return IngestParams.model_validate({
        "common": {"exec_timeout_s": 5.0, "exec_workers": 1, "samples": 2,
                   "decontam": {"testsets": "data/testsets", "ngram": 10, "min_short": 3, "min_overlap": min_overlap}},
        "datasets": sets})


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "raw" / "test.jsonl", TEST)
    _jsonl(tmp_path / "raw" / "train.jsonl", TRAIN)
    return tmp_path


def test_testsets_stage_writes_rows_report_and_metrics(project: Path) -> None:
    m = testsets.run(_testsets({"gsm8k": _ds("raw/test.jsonl", "gsm8k")}), "gsm8k")
    rows = [json.loads(x) for x in paths.testset_file("gsm8k").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["answer"] == "72" and rows[0]["source"] == "gsm8k"
    report = json.loads(paths.report_file("testsets", "gsm8k").read_text())
    assert report["rows_in"] == report["rows_out"] == 1 and report["round_trip"]["rate"] == 1.0
    assert untimed(m) == json.loads(paths.metrics_file("testsets_gsm8k").read_text())
    assert json.loads(paths.timings_file("testsets_gsm8k").read_text())["wall_s"] == m["wall_s"] and "wall_s" not in report
    assert m["rows_out"] == 1 and "skip_samples" not in m and m["gsm8k_calculator"]["rate"] == 1.0
    with pytest.raises(PipelineError, match="unknown test set 'nope'"):
        testsets.run(_testsets({"gsm8k": _ds("raw/test.jsonl", "gsm8k")}), "nope")


def test_ingest_decontaminates_against_the_test_sets(project: Path) -> None:
    testsets.run(_testsets({"gsm8k": _ds("raw/test.jsonl", "gsm8k")}), "gsm8k")
    m = ingest.run(_ingest({"gsm_sft": _ds("raw/train.jsonl", "gsm8k", role="sft")}), "gsm_sft")
    rows = [json.loads(x) for x in paths.ingest_file("sft", "gsm_sft").read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["10"]  # the row quoting the test question is removed
    report = json.loads(paths.report_file("ingest", "gsm_sft").read_text())
    d = report["decontamination"]
    assert d["removed"] == 1 and d["by_testset"] == {"gsm8k": 1} and d["samples"][0]["overlap"] == 1.0
    assert m["rows_out"] == 1 and m["decontamination"]["removed"] == 1
    # the paper's rule (one shared 10-gram) removes the same here; a stock phrase alone removes nothing either way
    again = ingest.run(_ingest({"gsm_sft": _ds("raw/train.jsonl", "gsm8k", role="sft")}, min_overlap=0.0), "gsm_sft")
    assert again["decontamination"]["removed"] == 1


def test_hub_snapshot_fetch_pin_and_warning(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub = {"id": str(project / "raw"), "config": None, "split": "train", "revision": None}
    spec = DatasetSpec.model_validate({**_ds("data/hub/gsm", "gsm8k"), "hub": hub})
    with pytest.raises(PipelineError, match="python -m stages.ingest fetch"):
        convert(spec, "gsm", role="rl", timeout_s=5.0, workers=1, samples=1)
    pin = ingest.fetch(spec, "gsm")  # load_dataset on the directory: train.jsonl is its train split
    assert pin["rows"] == 2 and capsys.readouterr().err.count("not pinned") == 1
    assert json.loads((project / "data/hub/gsm" / ingest.HUB_PIN).read_text())["id"] == hub["id"]
    rows, report = convert(spec, "gsm", role="rl", timeout_s=5.0, workers=1, samples=1)
    assert len(rows) == 2 and "not pinned" in report["warning"]
    pinned = DatasetSpec.model_validate({**_ds("data/hub/gsm", "gsm8k"), "hub": {**hub, "revision": "abc123"}})
    with pytest.raises(PipelineError, match="params ask for"):
        convert(pinned, "gsm", role="rl", timeout_s=5.0, workers=1, samples=1)


def test_fetch_cli_reads_params_and_names_hub_sets(project: Path) -> None:
    import yaml

    from tests.test_params import ROOT  # the committed params.yaml, with a hub data set added

    raw = resolve(ROOT / "params.yaml")
    raw["ingest"]["datasets"]["gsm_rl"] = {**_ds("data/hub/gsm", "gsm8k", role="rl"), "hub": {
        "id": str(project / "raw"), "config": None, "split": "train", "revision": "v1"}}
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    assert ingest.main(["fetch", "nope"]) == 2
    assert ingest.main(["fetch"]) == 0
    assert (project / "data/hub/gsm" / ingest.HUB_PIN).is_file()


def test_real_files_ingest_with_round_trip(shared_data: Path) -> None:
    """The full GSM8K and MATH files (and 200 GSM-Hard programs): every row kept, >= 99.9% of kept responses give
    their gold through the evaluator's extraction. benchmarks/ingest_report.py writes the full report."""
    def run(path: Path, adapter: str, role: str | None, limit: int | None = None) -> dict[str, Any]:
        spec = DatasetSpec.model_validate(_ds(path, adapter, limit=limit))
        return convert(spec, path.stem, role=role, timeout_s=10.0, workers=2, samples=3)[1]

    g = run(shared_data / "gsm8k" / "train.jsonl", "gsm8k", "sft")
    assert g["rows_in"] == 7473 and g["rows_out"] == 7473 and g["round_trip"]["rate"] == 1.0
    assert 0.9 < g["gsm8k_calculator"]["rate"] < 1.0  # a diagnostic: the last annotation is not always the gold
    m = run(shared_data / "math" / "test.jsonl", "math", None)
    assert m["rows_out"] == 5000 and m["round_trip"]["rate"] >= 0.999
    t = run(shared_data / "math" / "train.jsonl", "math", "sft")
    # MATH train: 2 rows with a null answer take the solution's \boxed 2; 2 with answer "" and an empty \boxed{} skip
    assert t["rows_out"] == 7498 and t["skipped"] == {"no_gold": 2} and t["notes"] == {"gold_from_solution": 2}
    h = run(shared_data / "pot_tir" / "pal_gsmhardv2.jsonl", "pal", None, limit=200)
    assert h["by_format"] == {"pot": h["rows_out"]} and h["programs"]["ok"] >= 0.99 * 200


def test_fetch_writes_only_inside_the_project_and_replaces_only_its_own_snapshots(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50: a hub data set's ``path`` outside the project (``../outside/precious``) is refused in one line before
    anything is fetched, and the directory there keeps its file; inside the project, a directory the fetch did not
    make is not replaced either; a snapshot an earlier fetch made is; an explicit data root (DSM_DATA_ROOT) allows a
    path outside."""
    hub = {"id": str(project / "raw"), "config": None, "split": "train", "revision": "v1"}
    outside = project.parent / f"outside-{project.name}" / "precious"
    outside.mkdir(parents=True)
    (outside / "keep.txt").write_text("mine")

    def spec(path: str) -> DatasetSpec:
        return DatasetSpec.model_validate({**_ds(path, "gsm8k"), "hub": hub})

    rel = f"../outside-{project.name}/precious"
    with pytest.raises(PipelineError, match=rf"^ingest.datasets.gsm.path: {rel} is {outside}, outside the project "
                                            rf"\({project}\): .* DSM_DATA_ROOT"):
        ingest.fetch(spec(rel), "gsm", "ingest.datasets.gsm.path")
    assert (outside / "keep.txt").read_text() == "mine" and sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    (project / "mine").mkdir()
    (project / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="is a directory that `python -m stages.ingest fetch` did not make"):
        ingest.fetch(spec("mine"), "gsm")
    assert (project / "mine" / "notes.txt").read_text() == "mine"
    (project / "link").symlink_to(outside)  # a link inside pointing outside: where it resolves decides
    with pytest.raises(PipelineError, match="outside the project"):
        ingest.fetch(spec("link/sub"), "gsm")
    assert ingest.fetch(spec("data/hub/gsm"), "gsm")["rows"] == 2
    assert ingest.fetch(spec("data/hub/gsm"), "gsm")["rows"] == 2  # its own snapshot: replaced
    monkeypatch.setenv("DSM_DATA_ROOT", str(outside.parent))
    with pytest.raises(PipelineError, match="did not make"):  # allowed there, but still not replaced
        ingest.fetch(spec(rel), "gsm")
    assert ingest.fetch(spec(f"{rel}-snapshot"), "gsm")["rows"] == 2
    assert (outside.parent / "precious-snapshot" / ingest.HUB_PIN).is_file()
    assert (outside / "keep.txt").read_text() == "mine"


def test_the_corpus_work_dir_is_checked_before_the_stage_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50: ``corpus.work_dir`` is where the corpus stage writes its working files: inside the project or a data
    root, checked with the stage's other inputs before anything runs (stages/preflight.py)."""
    from stages import preflight
    from stages.params import load_params
    from tests.test_params import ROOT

    monkeypatch.chdir(tmp_path)
    params = load_params(ROOT / "params.yaml")
    params = params.model_copy(update={"corpus": params.corpus.model_copy(update={"work_dir": "/var/tmp/elsewhere"})})
    with pytest.raises(PipelineError, match=r"^corpus.work_dir: /var/tmp/elsewhere is /var/tmp/elsewhere, outside"):
        preflight.check(params, ["corpus"], produced={"data/generated", "data/testsets"})
    monkeypatch.setenv("DSM_DATA_ROOT", "/var/tmp")
    with pytest.raises(PipelineError, match="corpus.crawl_path"):  # past work_dir, on to the inputs
        preflight.check(params, ["corpus"])

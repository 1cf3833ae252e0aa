"""`dvc repro` in a temporary git repository: the first run builds data and base_model, a second
run does nothing (fast), a base_model change re-runs base_model but not data, and the Prefect flow
run directly writes the same outputs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.params import resolve
from tests.flows._project import copy_sources

pytestmark = pytest.mark.slow  # real dvc repro graphs: ~95 s on 2 cores; .ci/slow dvc-graphs

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["data", "base_model"]


def _shrink(raw: dict[str, Any]) -> dict[str, Any]:
    """Tiny sizes so the test takes seconds, not minutes."""
    raw["data"]["problems"].update(n_sft=120, n_rl=60, n_test=40)
    crawl = raw["data"]["crawl"]
    for k, v in list(crawl.items()):
        if k.startswith("n_") and isinstance(v, int) and not isinstance(v, bool):
            crawl[k] = max(1, min(v, max(4, v // 20)))
    raw["base_model"].update(tokenizer_texts=300, vocab_size=400, hidden_size=64, intermediate_size=128,
                             num_layers=1, num_heads=2, num_kv_heads=2)
    return raw


def _run(cmd: list[str], cwd: Path) -> tuple[float, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return time.perf_counter() - t0, proc.stdout + proc.stderr


def _tree_hash(path: Path) -> str:
    h = hashlib.md5()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> Path:
    """A copy of the working tree (tracked + untracked, not ignored) as a fresh git repo."""
    dst = tmp_path_factory.mktemp("proj")
    copy_sources(dst)
    raw = _shrink(resolve(dst / "params.yaml"))
    (dst / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dst, check=True)
    subprocess.run(git + ["commit", "-qm", "init"], cwd=dst, check=True)
    return dst


def test_repro_then_noop_then_partial_rerun(project: Path) -> None:
    _, out = _run(["dvc", "repro", *TARGETS], project)
    for stage in TARGETS:
        assert f"Running stage '{stage}'" in out
    assert (project / "data" / "models" / "base" / "config.json").is_file()
    assert (project / "data" / "metrics" / "data.json").is_file()

    wall, out = _run(["dvc", "repro", *TARGETS], project)
    assert "Running stage" not in out
    assert wall < 5.0, f"no-op dvc repro took {wall:.1f} s"

    params = resolve(project / "params.yaml")
    params["base_model"]["hidden_size"] = 96
    params["base_model"]["intermediate_size"] = 192
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _, status = _run(["dvc", "status", *TARGETS], project)
    # base_model's params section changed; data (upstream, own section unchanged) is up to date
    assert status.startswith("base_model:") and "params.yaml" in status and "base_model" in status.split("modified:")[1]
    assert "data:" not in status

    before = _tree_hash(project / "data" / "generated")
    _run([sys.executable, "-m", "flows.data"], project)
    assert _tree_hash(project / "data" / "generated") == before


def test_runtime_values_and_other_schemas_rerun_nothing(project: Path) -> None:
    """Values under runtime: (checkpoint / logging intervals, workers) and another section's schema module are not
    deps of these stages: editing them leaves data and base_model up to date."""
    _run(["dvc", "repro", *TARGETS], project)
    params = resolve(project / "params.yaml")
    params["runtime"]["corpus"]["workers"] += 1
    params["runtime"]["grpo"]["checkpoint_every"] += 1
    params["runtime"]["pretrain"]["train"]["log_every"] += 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    schema = project / "stages" / "schema" / "grpo.py"
    schema.write_text(schema.read_text().replace('"""Seed for question order', '"""(edited) Seed for question order'))
    _, status = _run(["dvc", "status", *TARGETS], project)
    assert "changed" not in status and "modified" not in status, status


def test_a_default_edit_reruns_the_stages_that_read_it(project: Path) -> None:
    """A value the params file does not name comes from its schema module, a code dep of the stages that read it:
    editing the default re-runs base_model (which records the value in data/params/base_model.yaml) and not data."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["base_model"].pop("rope_theta", None)  # the paper's value, the schema's default
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run(["dvc", "repro", *TARGETS], project)
    record = yaml.safe_load((project / "data" / "params" / "base_model.yaml").read_text())
    assert record["base_model"]["rope_theta"] == 10000.0 and "data" in yaml.safe_load(
        (project / "data" / "params" / "data.yaml").read_text())
    schema = project / "stages" / "schema" / "base_model.py"
    text = schema.read_text()
    assert text.count("rope_theta: PosFloat = 10000.0") == 1
    schema.write_text(text.replace("rope_theta: PosFloat = 10000.0", "rope_theta: PosFloat = 500000.0"))
    try:
        _, status = _run(["dvc", "status", *TARGETS], project)
        assert status.startswith("base_model:") and "stages/schema/base_model.py" in status and "data:" not in status
    finally:
        schema.write_text(text)
    _, status = _run(["dvc", "status", *TARGETS], project)
    assert "changed" not in status and "modified" not in status, status


def test_pipeline_flow_reports_ran_and_skipped(project: Path) -> None:
    """`python -m flows.pipeline` runs each stage through DVC's bookkeeping: after the test above, data
    is up to date and base_model's params changed, so only base_model runs; a second run skips both."""
    def statuses(out: str) -> dict[str, str]:
        rows = [line.split() for line in out.splitlines()]
        return {r[0]: r[1] for r in rows if len(r) == 3 and r[0] in TARGETS}

    _run(["dvc", "repro", *TARGETS], project)  # order-independent start: everything up to date
    params = resolve(project / "params.yaml")
    params["base_model"]["seed"] += 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _, out = _run([sys.executable, "-m", "flows.pipeline", *TARGETS], project)
    assert statuses(out) == {"data": "skipped", "base_model": "ran"}, out[-2000:]
    assert "stage server: ran 1 stage command(s)\n" in out, out[-2000:]  # base_model, forked by the stage server
    _, out = _run([sys.executable, "-m", "flows.pipeline", *TARGETS], project)
    assert statuses(out) == {"data": "skipped", "base_model": "skipped"}, out[-2000:]

"""Multi-rank training stages inside the graph (flows/_launch.py): ``dvc repro pretrain`` with
``runtime.pretrain.launcher.kind: torchrun`` and ``pretrain.launcher.nproc_per_node: 2`` starts two CPU ranks (gloo)
itself, records their outputs, and gives the weights of one process that draws the same batches (micro-batch
doubled) to 1e-6; the stage asserts WORLD_SIZE against its params; every rank's exit status and rank 0's log reach
the Prefect run.

Slow (``-m slow``; .ci/slow launcher runs it): a tiny data -> corpus -> base_model -> pretrain graph, twice pretrain. The first
multi-rank CPU run on a machine builds DeepSpeed's shared-memory all-reduce op (minutes; cached afterwards).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.params import resolve
from tests.flows._project import GIT, env, make_project, run

pytestmark = pytest.mark.slow


def _set(project: Path, *, ranks: int, micro: int) -> None:
    raw = resolve(project / "params.yaml")
    raw["pretrain"]["train"].update(precision="fp32", num_threads=1, micro_batch_size=micro)
    raw["pretrain"]["launcher"]["nproc_per_node"] = ranks
    raw["runtime"]["pretrain"]["launcher"]["kind"] = "torchrun" if ranks > 1 else "none"
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def _artifact_rows(api: str, key: str) -> tuple[list[dict], str]:
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    latest = max(arts, key=lambda a: a.created)
    data = latest.data if isinstance(latest.data, list) else json.loads(latest.data)
    return data, str(latest.flow_run_id)


def _logs(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
    return [x.message for x in logs]


def test_two_torchrun_ranks_started_by_dvc_repro_match_one_process(tmp_path: Path, prefect_api: str) -> None:
    from safetensors.torch import load_file

    project = make_project(tmp_path / "proj")
    e = env(prefect_api, OMP_NUM_THREADS="1")
    _set(project, ranks=2, micro=2)
    run(GIT + ["commit", "-qam", "two ranks"], project)
    out = run(["dvc", "repro", "pretrain"], project, e, timeout=1800)
    assert "Running stage 'pretrain'" in out.stdout
    metrics = yaml.safe_load((project / "data" / "metrics" / "pretrain.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 4
    two = load_file(str(project / "data" / "models" / "pretrain" / "model.safetensors"))
    assert run(["dvc", "status", "pretrain"], project, e).stdout.strip().endswith("up to date.")  # DVC recorded it

    rows, flow_run = _artifact_rows(prefect_api, "pretrain-ranks")
    assert sorted((r["rank"], r["exit_code"]) for r in rows) == [(0, 0), (1, 0)], rows
    logs = _logs(flow_run)
    assert any(m.startswith("[default0]:") for m in logs), logs[:20]  # rank 0's output in the Prefect run
    assert {"rank 0: exit status 0", "rank 1: exit status 0"} <= set(logs)

    # the same batches in one process: micro-batch 4 instead of 2 ranks x 2
    _set(project, ranks=1, micro=4)
    run(["dvc", "repro", "pretrain"], project, e, timeout=1800)
    one = load_file(str(project / "data" / "models" / "pretrain" / "model.safetensors"))
    base = load_file(str(project / "data" / "models" / "base" / "model.safetensors"))
    assert any(not bool((one[k] == base[k]).all()) for k in one)  # training moved the weights
    diff = max(float((two[k] - one[k]).abs().max()) for k in one)
    moved = max(float((one[k] - base[k]).abs().max()) for k in one)
    # fp32 rounding of the two ranks' all-reduced mean against one process's sum (1.7e-6 measured after 4 AdamW steps,
    # where Adam's normalisation magnifies near-zero gradients): far below what training moved, and what a wrong or
    # duplicated batch would give (of the order of the update itself)
    assert diff < 1e-5 and diff < 1e-3 * moved, (diff, moved)

    # inside the stage: the ranks a launch gives must be the ranks the params say (here 1, launched with 2)
    bad = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "stages.pretrain"], cwd=project, env=e, capture_output=True, text=True, timeout=900)
    assert bad.returncode != 0
    assert ("pretrain.launcher: the stage runs as 2 rank(s) (WORLD_SIZE) but nproc_per_node x nnodes = 1"
            in bad.stdout + bad.stderr), (bad.stdout + bad.stderr)[-2000:]

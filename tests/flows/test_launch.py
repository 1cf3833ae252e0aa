"""flows/_launch.py in one process: ``retries`` re-runs a stage's work that failed transiently, never bad input;
the rank commands the launcher block asks for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prefect import flow

from flows._launch import rank_command, run_stage
from stages.core.errors import PipelineError
from stages.schema.train import LauncherParams


def _p(**kw) -> SimpleNamespace:
    base = dict(nproc_per_node=1, nnodes=1, kind="none", rdzv_endpoint=None, hostfile=None, retries=2,
                retry_delay_s=0.0)
    return SimpleNamespace(SECTION="pretrain", launcher=LauncherParams.model_validate({**base, **kw}))


def test_retries_rerun_a_transient_failure_but_not_bad_input(prefect_api: str) -> None:
    calls: list[int] = []

    def flaky(_p: object) -> dict:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("lost a node")
        return {"ok": True}

    def bad(_p: object) -> dict:
        calls.append(1)
        raise PipelineError("pretrain.mixture[0].path: x not found")

    @flow
    def f(fn):
        return run_stage("pretrain", _p(), fn, "params.yaml")

    assert f(flaky) == {"ok": True} and len(calls) == 3  # failed twice, retried twice
    calls.clear()
    with pytest.raises(PipelineError):
        f(bad)
    assert len(calls) == 1  # bad input is not retried


def test_rank_commands() -> None:
    tr = rank_command("sft", _p(kind="torchrun", nproc_per_node=4).launcher, "params.yaml", "/tmp/logs")
    assert tr[1:5] == ["-m", "torch.distributed.run", "--nnodes", "1"] and tr[tr.index("--nproc-per-node") + 1] == "4"
    assert tr[-4:] == ["-m", "stages.sft", "--params", "params.yaml"] and "--local-ranks-filter" in tr
    multi = rank_command("sft", _p(kind="torchrun", nproc_per_node=8, nnodes=2, rdzv_endpoint="node0:29400").launcher,
                         "p.yaml", "/tmp/l")
    assert multi[multi.index("--rdzv-endpoint") + 1] == "node0:29400" and "--rdzv-id" in multi
    ds = rank_command("grpo", _p(kind="deepspeed", nproc_per_node=8, nnodes=2, hostfile="hosts").launcher, "p.yaml", "")
    assert ds[1:5] == ["--num_nodes", "2", "--num_gpus", "8"] and ds[ds.index("--hostfile") + 1] == "hosts"
    assert ds[-4:] == ["--module", "stages.grpo", "--params", "p.yaml"]

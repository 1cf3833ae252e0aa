"""How a training stage's work starts (``<stage>.launcher`` in params): in this process, or as ranks.

``kind: none``: ``stages.<stage>.run(params)`` runs in the stage command's process, as one Prefect task.
``kind: torchrun`` / ``deepspeed``: the stage command (``python -m flows.<stage>``, run by ``dvc repro`` or the
pipeline) starts the ranks itself, ``torchrun --nnodes N --nproc-per-node P ... -m stages.<stage> --params FILE``
or ``deepspeed --num_nodes N --num_gpus P [--hostfile F] --module stages.<stage> --params FILE``, as one Prefect
task, and waits for them; DVC records the outputs rank 0 wrote when the command exits, as for any stage. Rank 0's
output is shown on the console and sent to the Prefect run's log (the other ranks' logs are kept under
``.prefect/ranks/``); every rank reports its exit status (stages/core/cli.py ``cli``), published as the
table artifact ``<stage>-ranks``; a rank that reports none (killed by a signal) is listed as such.

Retries (``runtime.<stage>.launcher.retries``): a run that fails other than by bad input (a rank crash, a lost
node, a transient NCCL error) is retried by Prefect with fresh ranks after ``retry_delay_s``; training resumes
from its last checkpoint. Bad input (a one-line PipelineError, exit status 2 of a rank) is never retried.

Nothing here changes what a stage computes (dvc.yaml does not list it as a code dep).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows._process import free_port
from stages.core.errors import PipelineError

STATUS_ENV = "DSM_RANK_STATUS_DIR"
"""Set for the ranks: the directory where each writes ``rank-<RANK>.json`` (and rank 0 its metrics)."""
USER_ERROR = 2
"""A rank's exit status for bad input (a PipelineError): not retried."""


def _retry_unless_user_error(_task: Any, _run: Any, state: Any) -> bool:
    from flows._common import pipeline_error

    try:
        state.result()
    except BaseException as e:  # noqa: BLE001 - what failed decides
        return pipeline_error(e) is None
    return True


def run_stage(stage: str, p: Any, run_fn: Callable[[Any], dict[str, Any]], params_path: str) -> dict[str, Any]:
    """Run the stage's work as its launcher says; return its metrics."""
    launcher = p.launcher
    opts: dict[str, Any] = {"retries": launcher.retries, "retry_delay_seconds": launcher.retry_delay_s,
                            "retry_condition_fn": _retry_unless_user_error}
    if launcher.kind == "none":
        return _in_process.with_options(name=stage, **opts)(run_fn, p)
    return _ranks.with_options(name=f"{stage}-ranks", **opts)(stage, p, params_path)


@task(cache_policy=NO_CACHE, persist_result=False)
def _in_process(run_fn: Callable[[Any], dict[str, Any]], p: Any) -> dict[str, Any]:
    from stages.core.cli import check_world_size

    check_world_size(p)
    return run_fn(p)



def rank_command(stage: str, launcher: Any, params_path: str, log_dir: str) -> list[str]:
    """The command that starts the stage's ranks on this node."""
    entry = ["--params", params_path]
    if launcher.kind == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(launcher.nnodes),
               "--nproc-per-node", str(launcher.nproc_per_node)]
        if launcher.nnodes == 1 and launcher.rdzv_endpoint is None:
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
        else:
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", str(launcher.rdzv_endpoint),
                    "--rdzv-id", f"dsm-{stage}"]
        cmd += ["--log-dir", log_dir, "--tee", "3", "--local-ranks-filter", "0", "-m", f"stages.{stage}", *entry]
        return cmd
    deepspeed = shutil.which("deepspeed") or str(Path(sys.executable).parent / "deepspeed")
    cmd = [deepspeed, "--num_nodes", str(launcher.nnodes), "--num_gpus", str(launcher.nproc_per_node)]
    if launcher.hostfile is not None:
        cmd += ["--hostfile", launcher.hostfile]
    if launcher.rdzv_endpoint is not None:
        host, _, port = launcher.rdzv_endpoint.rpartition(":")
        cmd += ["--master_addr", host, "--master_port", port]
    else:
        cmd += ["--master_port", str(free_port())]
    return [*cmd, "--module", f"stages.{stage}", *entry]


def _read_statuses(status_dir: Path, world: int) -> list[dict[str, Any]]:
    rows = []
    for r in range(world):
        f = status_dir / f"rank-{r}.json"
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            rows.append({"rank": r, "exit_code": None, "status": "no status (killed by a signal, or never started)"})
    return rows


@task(cache_policy=NO_CACHE, persist_result=False)
def _ranks(stage: str, p: Any, params_path: str) -> dict[str, Any]:
    """Start the ranks, stream rank 0's output to the console and the Prefect log, collect every rank's status."""
    from stages.core import io

    logger = get_run_logger()
    launcher = p.launcher
    logs = Path(os.environ.get("PREFECT_HOME", ".prefect")) / "ranks" / stage
    logs.mkdir(parents=True, exist_ok=True)
    with io.temporary_dir(logs, "status") as status_dir:
        cmd = rank_command(stage, launcher, params_path, str(logs))
        env = {**os.environ, STATUS_ENV: str(status_dir), "PYTHONUNBUFFERED": "1"}
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)  # the launcher sets them per rank
        if launcher.kind == "torchrun" and launcher.nnodes > 1:
            logger.info("other nodes: run %s", " ".join(cmd).replace(sys.executable, "python"))
        logger.info("starting %d rank(s): %s", launcher.world_size, " ".join(cmd))
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        buf = b""
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            buf += chunk
            *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
            for line in lines:
                text = line.decode(errors="replace").strip()
                # rank 0's output, to the console and the Prefect run (progress bars: only when done)
                if text and not (text.endswith("]") and "%|" in text and "100%|" not in text):
                    logger.info("%s", text)
        code = proc.wait()
        rows = _read_statuses(status_dir, launcher.world_size)
        metrics_file = status_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else None
    wall = time.perf_counter() - t0
    create_table_artifact(key=f"{stage.replace('_', '-')}-ranks", table=rows,
                          description=f"{stage}: exit status of each of the {launcher.world_size} ranks "
                                      f"({launcher.kind}; launcher exit status {code}, {wall:.1f} s)")
    for r in rows:
        logger.info("rank %s: exit status %s%s", r["rank"], r.get("exit_code"),
                    f" ({r['status']})" if r.get("status") else "")
    user = [r for r in rows if r.get("exit_code") == USER_ERROR and r.get("error")]
    if user:
        raise PipelineError(str(user[0]["error"]))
    if code != 0 or any(r.get("exit_code") != 0 for r in rows) or metrics is None:
        raise RuntimeError(f"{stage}: the {launcher.kind} launch failed (launcher exit status {code}; ranks: "
                           + ", ".join(f"{r['rank']}={r.get('exit_code')}" for r in rows) + ")")
    return metrics

"""Prefect flow of the ``corpus`` stage (dvc.yaml: corpus). Run: ``python -m flows.corpus``.

Every step of the stage is a set of tasks (:mod:`stages.corpus.tasks`: per shard, per bucket partition, per
domain partition, and single reductions such as training and cluster resolution), each submitted as a
Prefect task to the task runner named by ``corpus.task_runner``: ``local`` (a thread pool of
``corpus.workers`` threads in this process), ``dask`` (a ``distributed.LocalCluster`` of ``corpus.workers``
single-threaded worker processes speaking TLS with credentials made for the run, or the scheduler at
``corpus.address``) or ``ray`` (a local Ray, or the cluster at ``corpus.address``). Install the engines with
``pip install -e .[distributed]`` (Dask) or ``.[ray]``. The tasks are the same whatever the runner, so the outputs are too (tests/corpus/test_distributed.py).
On a multi-machine cluster the crawl, seed and problem paths must be reachable from every worker (absolute
paths on a shared file system, or fsspec URLs for the crawl and seed), and so must the working directory.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: the pipeline's stage server, or Prefect's settings, first
    from flows._common import begin

    begin("corpus")

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows._common import log_section, main, publish_metrics
from stages.core.errors import PipelineError
from stages.schema.corpus import CorpusParams


@task(cache_policy=NO_CACHE, persist_result=False)
def shard_task(fn: Callable[..., Any], kwargs: dict[str, Any], index: int) -> Any:
    """Run one shard's step (``fn(**kwargs)``); ``index`` only names the task run."""
    return fn(**kwargs)


def prefect_map(fn: Callable[..., Any], items: list[dict[str, Any]], max_in_flight: int | None = None) -> list[Any]:
    """A :data:`stages.corpus.MapFn` that submits each item as a Prefect task and returns the results in order.

    At most ``max_in_flight`` tasks are submitted at a time (None: all): the next is submitted when the oldest has
    finished and its future is dropped, so the driver holds the submission state (serialised context, task
    spec, future) of a bounded number of tasks whatever the shard count."""

    t = shard_task.with_options(name=fn.__name__, task_run_name=f"{fn.__name__}[{{index}}]")
    window = max_in_flight or max(1, len(items))
    results: list[Any] = []
    pending: deque[Any] = deque()
    for i, kw in enumerate(items):
        if len(pending) >= window:
            results.append(pending.popleft().result())
        pending.append(t.submit(fn, kw, i))
    while pending:
        results.append(pending.popleft().result())
    return results


def make_task_runner(p: CorpusParams) -> Any:
    """The task runner named by ``corpus.task_runner``."""

    if p.task_runner == "local":
        return ThreadPoolTaskRunner(max_workers=p.workers)
    try:
        if p.task_runner == "dask":
            from prefect_dask import DaskTaskRunner

            if p.address:
                return DaskTaskRunner(address=p.address)
            # a cluster of its own: TLS with a key and certificate made for this run (distributed's
            # Security.temporary()), required of every connection, so another user of the machine can neither submit
            # code to its scheduler on 127.0.0.1 nor talk to its workers
            return DaskTaskRunner(cluster_kwargs={"n_workers": p.workers, "threads_per_worker": 1, "processes": True,
                                                  "dashboard_address": None, "security": True})
        from prefect_ray import RayTaskRunner

        return RayTaskRunner(address=p.address) if p.address else RayTaskRunner()
    except ImportError:
        extra = "distributed" if p.task_runner == "dask" else "ray"
        raise PipelineError(f"corpus.task_runner: {p.task_runner} needs prefect-{p.task_runner} "
                            f"(pip install -e '.[{extra}]'); or set task_runner: local") from None


@flow(name="corpus-shards")
def corpus_shards_flow(p: CorpusParams) -> dict[str, Any]:
    """The stage itself, inside the chosen task runner."""
    from stages import corpus

    return corpus.run(p, map_fn=partial(prefect_map, max_in_flight=p.max_in_flight), log=get_run_logger().info)


@flow(name="corpus")
def corpus_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Build the math corpus: classifier, iterative recall, domain discovery, dedup, decontamination."""
    p = CorpusParams.from_file(params_path)
    log_section("corpus", p)
    metrics = corpus_shards_flow.with_options(task_runner=make_task_runner(p))(p)
    publish_metrics("corpus", metrics)
    create_table_artifact(key="corpus-rounds", table=metrics["rounds"], description="corpus: one row per recall round")
    return metrics


if __name__ == "__main__":
    raise SystemExit(main(corpus_flow, "corpus"))

"""Prefect flow of the ``corpus`` stage (dvc.yaml: corpus). Run: ``python -m flows.corpus``.

The shard work (prepare, training texts, scoring, writing) runs as one Prefect task per shard,
submitted to the task runner named by ``corpus.task_runner``: local threads by default, or a Dask /
Ray cluster (``pip install prefect-dask`` / ``prefect-ray``; ``corpus.address`` joins an existing one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows._common import log_section, main, publish_metrics
from stages import corpus
from stages.core.errors import PipelineError
from stages.schema.corpus import CorpusParams


@task(cache_policy=NO_CACHE, persist_result=False)
def shard_task(fn: Callable[..., Any], kwargs: dict[str, Any], index: int) -> Any:
    """Run one shard's step (``fn(**kwargs)``); ``index`` only names the task run."""
    return fn(**kwargs)


def prefect_map(fn: Callable[..., Any], items: list[dict[str, Any]]) -> list[Any]:
    """A :data:`stages.corpus.MapFn` that submits each shard as a Prefect task and waits for all, in order."""
    t = shard_task.with_options(name=fn.__name__, task_run_name=f"{fn.__name__}[{{index}}]")
    futures = [t.submit(fn, kw, i) for i, kw in enumerate(items)]
    return [f.result() for f in futures]


def make_task_runner(p: CorpusParams) -> Any:
    """The task runner named by ``corpus.task_runner``."""
    if p.task_runner == "local":
        return ThreadPoolTaskRunner(max_workers=p.workers)
    try:
        if p.task_runner == "dask":
            from prefect_dask import DaskTaskRunner

            if p.address:
                return DaskTaskRunner(address=p.address)
            return DaskTaskRunner(cluster_kwargs={"n_workers": p.workers, "threads_per_worker": 1})
        from prefect_ray import RayTaskRunner

        return RayTaskRunner(address=p.address) if p.address else RayTaskRunner()
    except ImportError:
        raise PipelineError(f"corpus.task_runner: {p.task_runner} needs the prefect-{p.task_runner} package "
                            f"(pip install prefect-{p.task_runner}); or set task_runner: local") from None


@flow(name="corpus-shards")
def corpus_shards_flow(p: CorpusParams) -> dict[str, Any]:
    """The stage itself, inside the chosen task runner."""
    return corpus.run(p, map_fn=prefect_map, log=get_run_logger().info)


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

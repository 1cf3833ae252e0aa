"""The corpus stage's driver memory step by step: the flow run in this process (``flows.corpus.corpus_flow``, no
``python -m`` entry point, so no whole-file params validation and none of its imports) against a Dask scheduler
and workers started as processes of their own, printing this process's RSS after each mapped step of
:func:`stages.corpus.run` and its peak (corpus_scale.Sampler, every 0.2 s).

    python benchmarks/corpus_driver.py --crawl /tmp/corpus-scale/crawl-9500.jsonl --shards 2
    python benchmarks/corpus_driver.py --crawl /tmp/corpus-scale/crawl-9500.jsonl --shards 31

(crawls from ``benchmarks/corpus_scale.py generate``). Same pages, more shards = more tasks: what the driver keeps
per task shows as growth between the two. Needs ``dvc repro data testsets`` in this checkout (the problem splits
and the benchmarks). Set ``PREFECT_API_URL`` to a running ``prefect server start`` to keep the API server out of
the process (without it Prefect's temporary server runs inside it: 253 MB instead of 184 MB at 10k / 2 shards).
Prints a JSON line at the end; docs/results/corpus.md (Scale) has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.corpus_scale import Sampler, point_at, start_cluster  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crawl", required=True, help="a crawl JSONL (seed corpus: seed-<n>.jsonl beside it, else the default's)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    import psutil
    import yaml

    me = psutil.Process()

    def rss() -> float:
        return me.memory_info().rss / 2**20

    start = rss()
    crawl = Path(args.crawl).resolve()
    seed = crawl.with_name(crawl.name.replace("crawl-", "seed-"))
    from stages.params import resolve
    params = resolve(ROOT / "params.yaml")
    point_at(params["corpus"], crawl, seed if seed.is_file() else ROOT / params["corpus"]["seed_path"], args.shards)
    proj = Path(tempfile.mkdtemp(prefix="corpus-driver-"))
    sched, work, addr = start_cluster(args.workers, dict(os.environ), proj / "log.txt")
    params["runtime"]["corpus"].update(task_runner="dask", workers=args.workers, address=addr)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    os.chdir(proj)
    try:
        import flows.corpus as fc
        import stages.corpus as sc

        ready = rss()
        steps: list[dict[str, Any]] = []
        build = sc._build

        def logged_build(p: Any, mp: Any, *a: Any, **k: Any) -> Any:
            def logged(fn: Any, items: list[dict[str, Any]]) -> list[Any]:
                out = mp(fn, items)
                steps.append({"step": fn.__name__, "tasks": len(items), "rss_mb": round(rss(), 1)})
                print(f"{fn.__name__:24s} {len(items):4d} tasks  driver {rss():6.1f} MB", flush=True)
                return out
            return build(p, logged, *a, **k)

        sc._build = logged_build  # stages.corpus is not pickled with the tasks (they live in stages.corpus.tasks)
        sampler = Sampler(os.getpid())  # .driver: this process's peak RSS
        sampler.start()
        t = time.perf_counter()
        fc.corpus_flow(str(proj / "params.yaml"))
        sampler.stop.set()
        sampler.join()
        row = {"crawl": str(crawl), "shards": args.shards, "workers": args.workers, "tasks": sum(s["tasks"] for s in steps),
               "rss_start_mb": round(start, 1), "rss_ready_mb": round(ready, 1),
               "rss_peak_mb": round(max(sampler.driver / 2**20, ready), 1),
               "wall_s": round(time.perf_counter() - t, 1), "load": [round(x, 2) for x in os.getloadavg()]}
        print(json.dumps(row), flush=True)
    finally:
        for proc in (sched, work):
            proc.terminate()
        subprocess.run(["rm", "-rf", str(proj)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The corpus stage's driver memory step by step: the flow run in this process (``flows.corpus.corpus_flow``, no
``python -m`` entry point, so no whole-file params validation and none of its imports) against a Dask scheduler
and workers started as processes of their own, printing this process's RSS after each mapped step of
:func:`stages.corpus.run` and its peak (sampled every 0.1 s).

    python benchmarks/corpus_driver.py --crawl /tmp/corpus-scale/crawl-9500.jsonl --shards 2
    python benchmarks/corpus_driver.py --crawl /tmp/corpus-scale/crawl-9500.jsonl --shards 31

(crawls from ``benchmarks/corpus_scale.py generate``). Same pages, more shards = more tasks: what the driver keeps
per task shows as growth between the two. Needs ``dvc repro data testsets`` in this checkout (the problem splits
and the benchmarks). Set ``PREFECT_API_URL`` to a running ``prefect server start`` to keep the API server out of
the process. Prints a JSON line at the end; docs/corpus.md (Scale) has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crawl", required=True, help="a crawl JSONL (seed corpus: seed-<n>.jsonl beside it, else the default's)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    import psutil
    import yaml

    sys.path.insert(0, str(ROOT))
    me = psutil.Process()

    def rss() -> float:
        return me.memory_info().rss / 2**20

    crawl = Path(args.crawl).resolve()
    seed = crawl.with_name(crawl.name.replace("crawl-", "seed-"))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    c = params["corpus"]
    c.update(crawl_path=str(crawl), n_shards=args.shards, problems_dir=str(ROOT / "data" / "generated" / "problems"),
             seed_path=str(seed if seed.is_file() else ROOT / c["seed_path"]))
    c["decontam"]["testsets"] = str(ROOT / c["decontam"]["testsets"])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    addr = f"tcp://127.0.0.1:{port}"
    dask = str(Path(sys.executable).parent / "dask")
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([dask, "worker", addr, "--nworkers", str(args.workers), "--nthreads", "1",
                               "--no-dashboard", "--memory-limit", "0"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    params["runtime"]["corpus"].update(task_runner="dask", workers=args.workers, address=addr)
    proj = Path(tempfile.mkdtemp(prefix="corpus-driver-"))
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    os.chdir(proj)
    try:
        start = rss()
        from distributed import Client

        import flows.corpus as fc
        import stages.corpus as sc

        with Client(addr, timeout=120) as client:
            client.wait_for_workers(args.workers, timeout=300)
        ready = rss()
        peak = [ready]
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
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.1)
        threading.Thread(target=sample, daemon=True).start()
        t = time.perf_counter()
        fc.corpus_flow(str(proj / "params.yaml"))
        done.set()
        row = {"crawl": str(crawl), "shards": args.shards, "workers": args.workers, "tasks": sum(s["tasks"] for s in steps),
               "rss_start_mb": round(start, 1), "rss_ready_mb": round(ready, 1), "rss_peak_mb": round(peak[0], 1),
               "wall_s": round(time.perf_counter() - t, 1), "load": [round(x, 2) for x in os.getloadavg()]}
        print(json.dumps(row), flush=True)
    finally:
        for p in procs:
            p.terminate()
        subprocess.run(["rm", "-rf", str(proj)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

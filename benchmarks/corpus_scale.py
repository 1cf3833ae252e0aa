"""The corpus stage at 10k, 100k and 300k+ pages, on today's code and on another checkout, on 1 and 2 workers.

    python benchmarks/corpus_scale.py generate [--pages 300000] [--dir /tmp/corpus-scale]
    git archive main | tar -x -C /tmp/maincode        # today's code, for the comparison
    python benchmarks/corpus_scale.py run --code main=/tmp/maincode new=. [--sizes 9500 95000 285000] [--workers 1 2]
    python benchmarks/corpus_scale.py table        # benchmarks/results/corpus_scale.json -> markdown

``generate`` writes one crawl per size with stages/data/crawl.py: the default's page mix, with domains,
contamination and base pages scaled with the page count (so every size has the default's pages per domain
and domain discovery has the same work to do), the default's seed corpus size and test problems. ``run`` runs ``python -m flows.corpus`` of the checkout at ``--code`` in a subprocess, with the
default params except: the crawl, ``task_runner: dask`` with ``workers`` single-threaded worker processes (a
``distributed.LocalCluster`` started by prefect-dask's DaskTaskRunner), one shard per ``--shard-pages``
pages. A sampler reads the RSS of the flow process (the driver: Prefect client, the stage's loop) and of
each Dask worker process every 0.2 s (the Prefect API server the flow starts is reported apart; with
``PREFECT_API_URL`` set, the flows report to that server instead and start none). Pages/s per
worker = input pages / stage wall time (``metrics.wall_s``, Prefect and cluster start-up excluded) / workers.

Results are appended to benchmarks/results/corpus_scale.json (one row per run, with the load average before
and after; the machine is shared, so compare rows taken under similar load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "corpus_scale.json"


def generate(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from stages.core.io import read_jsonl
    from stages.data import crawl
    from stages.params import CrawlParams, resolve

    base = resolve(ROOT / "params.yaml")["data"]["crawl"]
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    test = read_jsonl(ROOT / "data" / "generated" / "problems" / "test.jsonl")
    made = {}
    for pages in args.pages:
        scale = pages / base["n_pages"]
        cp = {**base, "n_pages": pages, "n_math_domains": max(3, round(base["n_math_domains"] * scale)),
              "n_general_domains": max(6, round(base["n_general_domains"] * scale)),
              "n_contaminated": round(base["n_contaminated"] * scale)}
        t = time.perf_counter()
        m = crawl.generate(CrawlParams(**cp), seed=0, test_problems=test, crawl_path=out / f"crawl-{pages}.jsonl",
                           seed_path=out / f"seed-{pages}.jsonl")
        print(f"generated {m['pages']} pages in {time.perf_counter() - t:.0f} s", flush=True)
        made[pages] = {"params": cp, "metrics": m}
        (out / f"generated-{pages}.json").write_text(json.dumps(made[pages], indent=1))


class Sampler(threading.Thread):
    """Peak RSS of a process and, separately, of its descendants (Dask workers vs the Prefect server)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop = pid, threading.Event()
        self.driver = self.worker = self.server = 0
        self.workers_seen: set[int] = set()

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self.stop.is_set():
            try:
                self.driver = max(self.driver, root.memory_info().rss)
                for c in root.children(recursive=True):
                    try:
                        cmd = " ".join(c.cmdline())
                        rss = c.memory_info().rss
                    except psutil.Error:
                        continue
                    if "uvicorn" in cmd or "prefect" in cmd and "server" in cmd:
                        self.server = max(self.server, rss)
                    elif "multiprocessing" in cmd or "distributed" in cmd or "dask" in cmd:
                        self.worker = max(self.worker, rss)
                        self.workers_seen.add(c.pid)
            except psutil.Error:
                pass
            time.sleep(0.2)


def start_cluster(workers: int, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    """A Dask scheduler and ``workers`` single-threaded workers as their own processes (as on a real cluster)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    addr = f"tcp://127.0.0.1:{port}"
    dask = str(Path(sys.executable).parent / "dask")
    sched = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], env=env,
                             stdout=open(log.with_name("scheduler.txt"), "w"), stderr=subprocess.STDOUT)
    work = subprocess.Popen([dask, "worker", addr, "--nworkers", str(workers), "--nthreads", "1", "--no-dashboard",
                             "--memory-limit", "0"], env=env, stdout=open(log.with_name("workers.txt"), "w"),
                            stderr=subprocess.STDOUT)
    from distributed import Client

    with Client(addr, timeout=300) as client:
        client.wait_for_workers(workers, timeout=600)
    return sched, work, addr


def point_at(c: dict[str, Any], crawl: Path, seed: Path, n_shards: int) -> None:
    """Point a params file's ``corpus`` section at a generated crawl and seed corpus, in ``n_shards`` shards, reading
    this checkout's problem splits and test sets (the data and testsets stages' outputs) by absolute path."""
    c.update(crawl_path=str(crawl), seed_path=str(seed), problems_dir=str(ROOT / "data" / "generated" / "problems"),
             n_shards=n_shards)
    dec = c.get("decontam") or {}
    if dec.get("testsets") and not Path(dec["testsets"]).is_absolute():
        dec["testsets"] = str(ROOT / dec["testsets"])


def run_one(code: Path, label: str, crawl: Path, seed: Path, pages: int, workers: int, shard_pages: int,
            external: bool = False) -> dict[str, Any]:
    import yaml

    params = yaml.safe_load((code / "params.yaml").read_text())
    c = params["corpus"]
    n_shards = max(1, -(-pages // shard_pages))
    point_at(c, crawl, seed, n_shards)
    target = c if "task_runner" in c else params.setdefault("runtime", {}).setdefault("corpus", {})  # older layouts
    target.update(task_runner="dask", workers=workers, address=None)
    proj = Path(tempfile.mkdtemp(prefix=f"scale-{label}-", dir=os.environ.get("SCALE_TMP", "/tmp")))
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONUNBUFFERED": "1", "PREFECT_HOME": str(proj / ".prefect")}
    cluster = None
    if external:
        cluster = start_cluster(workers, env, proj / "log.txt")
        target["address"] = cluster[2]
        (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # PREFECT_API_URL from the caller's environment (a running `prefect server start`) when set: under heavy load the
    # temporary server a flow starts for itself timed out (measured here at load average 25)
    load0 = os.getloadavg()
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flows.corpus", "--params", str(proj / "params.yaml")], cwd=proj, env=env,
                            stdout=open(proj / "log.txt", "w"), stderr=subprocess.STDOUT)
    s = Sampler(proc.pid)
    s.start()
    cs = [Sampler(c.pid) for c in cluster[:2]] if cluster else []
    for x in cs:
        x.start()
    rc = proc.wait()
    wall = time.perf_counter() - t
    for x in [s, *cs]:
        x.stop.set()
        x.join()
    if cluster:
        for c in cluster[:2]:
            c.terminate()
            c.wait(timeout=60)
    row: dict[str, Any] = {"code": label, "pages": pages, "workers": workers, "shards": n_shards, "rc": rc,
                           "process_wall_s": round(wall, 1), "load_before": [round(x, 2) for x in load0],
                           "load_after": [round(x, 2) for x in os.getloadavg()],
                           "driver_peak_mb": round(s.driver / 2**20), "worker_peak_mb": round(s.worker / 2**20),
                           "prefect_server_peak_mb": round(s.server / 2**20), "worker_processes_seen": len(s.workers_seen),
                           "scheduler": "external" if cluster else "in the driver (LocalCluster)"}
    if cluster:  # the scheduler process, and the largest worker process under the `dask worker` launcher
        row["scheduler_peak_mb"] = round(cs[0].driver / 2**20)
        row["worker_peak_mb"] = round(cs[1].worker / 2**20)
    mf = proj / "data" / "details" / "corpus.json"  # every result (data/metrics: the headline)
    if not mf.is_file():
        mf = proj / "data" / "metrics" / "corpus.json"  # checkouts before the metrics / details split
    tf = proj / "data" / "timings" / "corpus.json"  # the timings (issue 34: no DVC output)
    if rc == 0 and mf.is_file():
        m = {**json.loads(mf.read_text()), **(json.loads(tf.read_text()) if tf.is_file() else {})}
        row.update(stage_wall_s=m["wall_s"], timings_s=m["timings_s"], pages_in=m["pages_in"],
                   pages_per_s_per_worker=round(m["pages_in"] / m["wall_s"] / workers, 1), math_pages=m["math_pages"],
                   final=m.get("final"), duplicates_removed=m["duplicates_removed"])
    else:
        row["log_tail"] = (proj / "log.txt").read_text()[-2000:]
    subprocess.run(["rm", "-rf", str(proj)], check=False)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--pages", type=int, nargs="*", default=[9_500, 95_000, 285_000],
                   help="base pages of each crawl (+5%% near-duplicates, + contaminated pages)")
    g.add_argument("--dir", default="/tmp/corpus-scale")
    r = sub.add_parser("run")
    r.add_argument("--code", nargs="+", required=True, help="label=checkout: whose flows.corpus runs (with its own params.yaml)")
    r.add_argument("--sizes", type=int, nargs="*", default=[9_500, 95_000, 285_000], help="generated crawls (base pages)")
    r.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    r.add_argument("--shard-pages", type=int, default=10_000)
    r.add_argument("--dir", default="/tmp/corpus-scale")
    r.add_argument("--external-scheduler", action="store_true",
                   help="a `dask scheduler` and `dask worker` processes of their own (LocalCluster runs the scheduler in "
                        "the driver process, so the driver's memory then includes the scheduler's per-task state)")
    sub.add_parser("table")
    args = ap.parse_args()
    if args.cmd == "generate":
        generate(args)
        return 0
    if args.cmd == "table":
        rows = json.loads(RESULTS.read_text())["runs"]
        print("| code | pages | shards | workers | scheduler | stage s (prepare / dedup / rounds / write) | pages/s/worker | "
              "driver MB | worker MB | scheduler MB | load before / after |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for x in sorted(rows, key=lambda x: (x["pages"], x["workers"], "scheduler" in x and x["scheduler"] == "external",
                                             x["code"])):
            t = x.get("timings_s", {})
            ext = x.get("scheduler") == "external"
            print(f"| {x['code']} | {x.get('pages_in', x['pages'])} | {x['shards']} | {x['workers']} | {'own process' if ext else 'in driver'} | "
                  f"{x.get('stage_wall_s')} ({t.get('prepare')} / {t.get('dedup')} / {t.get('rounds')} / {t.get('write')}) | "
                  f"{x.get('pages_per_s_per_worker')} | {x['driver_peak_mb']} | {x['worker_peak_mb']} | "
                  f"{x.get('scheduler_peak_mb', '-')} | {x['load_before'][0]:.0f} / {x['load_after'][0]:.0f} |")
        return 0
    d = Path(args.dir)
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"runs": []}
    for size in args.sizes:
        crawl = d / f"crawl-{size}.jsonl"
        pages = sum(1 for _ in open(crawl, "rb"))
        for w in args.workers:
            for spec in args.code:
                label, code = spec.split("=", 1)
                row = run_one(Path(code).resolve(), label, crawl, d / f"seed-{size}.jsonl", pages, w, args.shard_pages,
                              args.external_scheduler)
                print(json.dumps(row), flush=True)
                data["runs"].append(row)
                RESULTS.parent.mkdir(parents=True, exist_ok=True)
                RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

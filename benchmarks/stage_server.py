"""Stage commands per second through the pipeline's stage server (flows/_stage_server.py), this checkout against
another, and what the server's credential check (issue 46: ``SO_PEERCRED``, the peer's ancestry) costs per request.

    git archive <rev> | tar -x -C /tmp/base     # the version to compare against
    python benchmarks/stage_server.py --baseline /tmp/base [--n 20] [--pairs 6]

Each run starts a checkout's stage server (preloading ``flows.data``) and times ``--n`` sequential
``python -m flows.data --help`` commands forwarded to it (a new client interpreter each, what DVC runs); the two
checkouts alternate, in alternating order, ``--pairs`` times, with this interpreter. Writes
benchmarks/results/stage_server.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = r'''
import json, os, shutil, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, os.getcwd())
from flows._common import begin
begin(None)
from pathlib import Path
from flows._stage_server import StageServer
s = StageServer(["flows.data"], tempfile.mkdtemp(prefix="dsm-stage-bench-")).start()
t0 = time.monotonic()
while "ready:" not in Path(s.log).read_text() and time.monotonic() - t0 < 120:
    time.sleep(0.05)
times = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    assert subprocess.run([sys.executable, "-m", "flows.data", "--help"], capture_output=True).returncode == 0
    times.append(time.perf_counter() - t)
s.stop()
ran = sum(x.startswith("ran ") for x in Path(s.log).read_text().splitlines())
shutil.rmtree(s.dir)
print(json.dumps({"median_ms": 1000 * statistics.median(times), "ran_in_server": ran}))
'''


def check_cost_us(n: int = 2000) -> float:
    """Microseconds of the server's check of one connection (peer credentials, then its ancestry)."""
    from flows._stage_server import _descends_from, peer

    a, _b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t = time.perf_counter()
        for _ in range(n):
            who = peer(a)
            assert who is not None and who[1] == os.getuid() and _descends_from(child.pid, os.getpid())
        return 1e6 * (time.perf_counter() - t) / n
    finally:
        child.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="root of the checkout to compare against")
    ap.add_argument("--n", type=int, default=20, help="stage commands per run")
    ap.add_argument("--pairs", type=int, default=6)
    args = ap.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    load0 = os.getloadavg()
    got: dict[str, list[float]] = {k: [] for k in trees}
    for i in range(args.pairs):
        for k in (("baseline", "this") if i % 2 == 0 else ("this", "baseline")):
            out = subprocess.run([sys.executable, "-c", RUN, str(args.n)], cwd=trees[k], capture_output=True, text=True,
                                 timeout=1800)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            if res["ran_in_server"] != args.n:
                sys.exit(f"{k}: the server ran {res['ran_in_server']} of {args.n} commands")
            got[k].append(res["median_ms"])
            print(f"{k:9} {res['median_ms']:.1f} ms per stage command", flush=True)
    ratios = [t / b for b, t in zip(got["baseline"], got["this"], strict=True)]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    out = {"baseline": str(args.baseline), "n": args.n, "pairs": args.pairs, "cpu": f"{os.cpu_count()} x {cpu}",
           "load_average_start": [round(x, 2) for x in load0],
           "load_average_end": [round(x, 2) for x in os.getloadavg()],
           "ms_per_command": {k: [round(x, 1) for x in v] for k, v in got.items()},
           "median_ratio_this_over_baseline": round(statistics.median(ratios), 3),
           "ratios": [round(r, 3) for r in ratios], "credential_check_us": round(check_cost_us(), 1)}
    path = ROOT / "benchmarks" / "results" / "stage_server.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"this / baseline: median {out['median_ratio_this_over_baseline']} of {out['ratios']}; the credential check "
          f"{out['credential_check_us']} us per request; wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""What DVC and Prefect cost on top of the stages' own work.

All of it runs in a throw-away copy of the project (the files ``git ls-files -co --exclude-standard``
lists, i.e. the working tree with uncommitted changes and without data/, committed into a fresh git
repository in a temporary directory), so /work/main/data, .prefect and .dvc/cache are never touched.

1. The whole pipeline from scratch (``--runner``: ``pipeline`` = ``python -m flows.pipeline``, the main
   command: one Prefect server and one stage server for the run; ``pipeline-no-stage-server``: the same with
   every stage process importing its libraries itself; ``dvc`` = plain ``dvc repro``): its wall time minus the
   sum of the stages' own ``wall_s`` (each stage's data/timings/*.json) is the orchestration overhead
   (interpreter and import start-up, Prefect flow engine and API server start, DVC hashing and caching; plain
   ``dvc repro`` shares one API server across its stages like the pipeline, flows/_servers.py; the stage server is the pipeline's alone). Default: a REDUCED params set (below: every stage runs, on less data and fewer steps);
   ``--full``: params.yaml as it is (the full default; about 15 min on a quiet 2-core CPU).
2. No-op ``dvc repro`` right after: median of ``--repeats`` runs (nothing to do: DVC only hashes).
3. Start-up of ``python -m flows.data``: time from launch to the flow's first stage log line
   (``params.data: ...``, logged right before ``stages.data.run``), and total minus the stage's
   wall_s, with and without a shared Prefect server (``prefect server start`` + PREFECT_API_URL; the
   server's own start time is reported apart). Interpreter start-up and ``import flows.data`` are
   timed too, to split the start-up into its parts.

    python benchmarks/orchestration.py                 # reduced pipeline; JSON to benchmarks/results/orchestration.json
    python benchmarks/orchestration.py --runner pipeline-no-stage-server --out /tmp/o.json   # A/B
    python benchmarks/orchestration.py --full          # full default repro (long)
    python benchmarks/orchestration.py --skip-repro    # only the flow start-up figures
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "orchestration.json"
sys.path.insert(0, str(ROOT))

from flows._process import free_port  # noqa: E402

BIN = Path(sys.executable).parent

# The reduced params set: params.yaml with these values replaced. Every stage still runs and writes its
# metrics; the model sizes are kept; data, steps and evaluation problems shrink.
REDUCED: dict[str, Any] = {
    "data": {"problems": {"n_sft": 400, "n_rl": 200, "n_test": 40},
             "crawl": {"n_pages": 2000, "n_seed_pages": 300, "n_contaminated": 20}},
    "base_model": {"tokenizer_texts": 1000},
    "corpus": {"recall": {"rounds": 2}},
    "pretrain": {"eval_docs": 20, "eval_tokens": 4096,
                 "train": {"steps": 10, "warmup_steps": 2, "eval_every": 5, "micro_batch_size": 4, "seq_len": 128}},
    "sft": {"val_problems": 20,
            "train": {"steps": 10, "warmup_steps": 2, "eval_every": 5, "micro_batch_size": 4, "seq_len": 256}},
    "grpo": {"steps": 2, "questions_per_step": 2, "group_size": 4, "max_new_tokens": 24, "micro_batch_size": 8,
             "log_completions_every": 1},
    "evaluate": {"common": {"limit": 20, "sample_limit": 10, "max_new_tokens": 48, "maj_subsets": 16}},
    "runtime": {"pretrain": {"train": {"checkpoint_every": 5, "log_every": 1}},
                "sft": {"train": {"checkpoint_every": 5, "log_every": 1}}, "grpo": {"checkpoint_every": 1}},
}


def _merge(base: dict[str, Any], upd: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in upd.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def make_clone(dest: Path) -> None:
    """Copy the working tree's tracked and untracked-not-ignored files to ``dest``; commit them there."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in files:
        src = ROOT / rel
        if not rel or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "benchmark snapshot"], cwd=dest, check=True)


def write_reduced_params(clone: Path) -> None:
    import yaml

    f = clone / "params.yaml"
    data = _merge(yaml.safe_load(f.read_text()), REDUCED)
    for m in data["evaluate"]["models"].values():  # fewer samples per problem for pass@k / maj@k
        m["n_samples"] = min(m["n_samples"], 4)
    f.write_text("# REDUCED params set of benchmarks/orchestration.py\n" + yaml.safe_dump(data, sort_keys=False))


def _env(clone: Path, api_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env["PREFECT_HOME"] = str(clone / ".prefect")
    env["PYTHONUNBUFFERED"] = "1"
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def sh(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None) -> tuple[float, str, int]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return time.perf_counter() - t0, p.stdout, p.returncode


def stage_walls(clone: Path) -> dict[str, float]:
    """{timings file stem: its wall_s} over data/timings/*.json (data/metrics/*.json in checkouts before issue 34)."""
    out = {}
    where = clone / "data" / "timings"
    for f in sorted((where if where.is_dir() else clone / "data" / "metrics").glob("*.json")):
        try:
            w = json.loads(f.read_text()).get("wall_s")
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(w, (int, float)):
            out[f.stem] = float(w)
    return out


def time_to_line(cmd: list[str], cwd: Path, env: dict[str, str], marker: str, timeout: float) -> dict[str, Any]:
    """Launch ``cmd``; seconds until an output line contains ``marker``, and until exit."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first: list[float] = []
    lines: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not first and marker in line:
                first.append(time.perf_counter() - t0)

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    th.join(5)
    return {"to_marker_s": round(first[0], 3) if first else None, "total_s": round(time.perf_counter() - t0, 3),
            "rc": rc, "tail": "".join(lines[-5:])}



def start_server(clone: Path, timeout: float = 120.0) -> tuple[subprocess.Popen[bytes], str, float]:
    """``prefect server start`` on a free local port; returns (process, API URL, seconds until healthy)."""
    port = free_port()
    env = _env(clone, None)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_SERVER_UI_ENABLED"] = "false"
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=clone, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url, time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.25)
    stop_server(proc)
    raise RuntimeError("prefect server did not become healthy in time")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server started by :func:`start_server` (its own process group, nothing else)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def flow_startup(clone: Path, api_url: str | None, repeats: int) -> dict[str, Any]:
    """Start-up of ``python -m flows.data`` (to its first stage log line) and its overhead over the stage's wall_s."""
    env = _env(clone, api_url)
    runs = []
    for _ in range(repeats):
        r = time_to_line([sys.executable, "-m", "flows.data"], clone, env, "params.data", timeout=600)
        w = stage_walls(clone).get("data")
        r["stage_wall_s"] = w
        r["overhead_s"] = round(r["total_s"] - w, 3) if w is not None and r["rc"] == 0 else None
        runs.append(r)
    ok = [r for r in runs if r["to_marker_s"] is not None]
    return {"runs": [{k: v for k, v in r.items() if k != "tail" or r["rc"] != 0} for r in runs],
            "median": round(statistics.median(r["to_marker_s"] for r in ok), 3) if ok else None,
            "overhead_median_s": round(statistics.median(r["overhead_s"] for r in ok if r["overhead_s"] is not None), 3)
            if any(r["overhead_s"] is not None for r in ok) else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="repro with params.yaml unchanged (the full default)")
    ap.add_argument("--skip-repro", action="store_true", help="only interpreter / import / flow start-up figures")
    ap.add_argument("--skip-startup", action="store_true", help="only the repro figures (no flow start-up runs)")
    ap.add_argument("--runner", choices=["pipeline", "pipeline-no-stage-server", "dvc"], default="pipeline",
                    help="what runs the stages (module docstring)")
    ap.add_argument("--server", choices=["none", "shared"], default="none",
                    help="the repro without PREFECT_API_URL (each stage starts a temporary server: plain `dvc repro`) "
                         "or with one shared server")
    ap.add_argument("--repeats", type=int, default=3, help="runs of the no-op repro and of each start-up figure")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for the repro")
    ap.add_argument("--keep", action="store_true", help="keep the temporary project copy (its path is printed)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orchestration-bench-"))
    clone = tmp / "project"
    clone.mkdir()
    result: dict[str, Any] = {"benchmark": "orchestration", "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "loadavg_before": [round(x, 2) for x in os.getloadavg()],
                              "note": "shared 2-core machine: timings are noisy; the load average is recorded"}
    server = None
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every phase, so an interrupted run keeps what it measured
        out_path.write_text(json.dumps(result, indent=2) + "\n")

    try:
        make_clone(clone)
        mode = "full default" if args.full else "reduced"
        if not args.full:
            write_reduced_params(clone)
            result["reduced_params"] = REDUCED
        env = _env(clone, None)
        w, out, rc = sh([sys.executable, "-c", "from stages.params import load_params; load_params('params.yaml')"], clone, env)
        if rc != 0:
            print(out)
            raise SystemExit("params of the copy do not validate")
        # start-up parts: interpreter, imports
        interp = [sh([sys.executable, "-c", "pass"], clone, env)[0] for _ in range(args.repeats)]
        imports = [sh([sys.executable, "-c", "import flows.data"], clone, env)[0] for _ in range(args.repeats)]
        result["python_startup_s"] = round(statistics.median(interp), 3)
        result["import_flows_data_s"] = round(statistics.median(imports), 3)
        if not args.skip_repro:
            api = None
            if args.server == "shared":
                server, api, srv_s = start_server(clone)
                result["server_start_s"] = round(srv_s, 2)
            cmd = {"dvc": [str(BIN / "dvc"), "repro"], "pipeline": [sys.executable, "-m", "flows.pipeline"],
                   "pipeline-no-stage-server": [sys.executable, "-m", "flows.pipeline", "--no-stage-server"]}[args.runner]
            print(f"{' '.join(cmd[-3:])} ({mode} params, server={args.server}) in {clone} ...", flush=True)
            wall, out, rc = sh(cmd, clone, _env(clone, api), timeout=args.timeout)
            walls = stage_walls(clone)
            stage_sum = sum(walls.values())
            result["repro"] = {"mode": mode, "runner": args.runner, "server": args.server, "rc": rc, "wall_s": round(wall, 2),
                               "stage_wall_s": {k: round(v, 2) for k, v in walls.items()},
                               "stage_wall_sum_s": round(stage_sum, 2), "overhead_s": round(wall - stage_sum, 2),
                               "n_stages": len(walls),
                               "orchestration_fraction": round((wall - stage_sum) / wall, 4) if rc == 0 else None,
                               "overhead_per_stage_s": round((wall - stage_sum) / max(len(walls), 1), 2)}
            if rc != 0:
                result["repro"]["tail"] = out[-3000:]
                print(out[-3000:])
            print(f"repro: {wall:.1f} s, stages {stage_sum:.1f} s, overhead {wall - stage_sum:.1f} s", flush=True)
            save()
            if rc == 0:
                noops, outs = [], []
                for _ in range(args.repeats):
                    w, o, r = sh([str(BIN / "dvc"), "repro"], clone, _env(clone, api))
                    noops.append(w)
                    outs.append(o)
                up = all(("didn't change" in o or "up to date" in o.lower()) and "Running stage" not in o for o in outs)
                result["noop_repro_s"] = {"runs": [round(x, 3) for x in noops], "median": round(statistics.median(noops), 3),
                                          "was_noop": up}
                print(f"no-op repro: median {statistics.median(noops):.2f} s (nothing ran: {up})", flush=True)
                save()
            if server is not None:
                stop_server(server)
                server = None
        if args.skip_startup:
            return 0 if result.get("repro", {}).get("rc", 0) == 0 else 1
        # flow start-up, without then with a shared server
        startup: dict[str, Any] = {}
        startup["no server (temporary server per flow)"] = flow_startup(clone, None, args.repeats)
        result["flow_startup"] = startup
        save()
        server, api, srv_s = start_server(clone)
        result["server_start_s"] = round(srv_s, 2)
        startup["shared server (PREFECT_API_URL)"] = flow_startup(clone, api, args.repeats)
        stop_server(server)
        server = None
        result["flow_startup"] = startup
        for k, v in startup.items():
            print(f"python -m flows.data, {k}: first stage line after {v['median']} s; overhead over the stage "
                  f"{v['overhead_median_s']} s", flush=True)
    finally:
        if server is not None:
            stop_server(server)
        result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        save()
        if args.keep:
            print(f"kept {clone}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"python start-up {result['python_startup_s']} s; import flows.data {result['import_flows_data_s']} s")
    if "repro" in result:
        r = result["repro"]
        print(f"repro ({r['mode']}): wall {r['wall_s']} s, stages {r['stage_wall_sum_s']} s, overhead {r['overhead_s']} s "
              f"= {r['orchestration_fraction']} of the repro")
    print(f"wrote {out_path}")
    return 0 if result.get("repro", {}).get("rc", 0) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Temporary copies of the project for tests that run ``dvc repro`` or the flows as commands.

A copy holds the working tree's tracked and untracked-not-ignored files, tiny params (``shrink``) and a fresh git
repository with one commit (DVC needs git).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from stages.params import resolve

ROOT = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def shrink(raw: dict[str, Any]) -> dict[str, Any]:
    """Tiny sizes so a stage takes seconds."""
    raw["data"]["problems"].update(n_sft=120, n_rl=60, n_test=40)
    crawl = raw["data"]["crawl"]
    for k, v in list(crawl.items()):
        if k.startswith("n_") and isinstance(v, int) and not isinstance(v, bool):
            crawl[k] = max(1, min(v, max(4, v // 20)))
    raw["base_model"].update(tokenizer_texts=300, vocab_size=400, hidden_size=64, intermediate_size=128,
                             num_layers=1, num_heads=2, num_kv_heads=2)
    raw["corpus"]["recall"]["rounds"] = 2
    for sec in ("pretrain", "sft"):
        raw[sec]["train"].update(steps=4, warmup_steps=1, eval_every=2, micro_batch_size=2, seq_len=128)
    raw["pretrain"].update(eval_docs=4, eval_tokens=512)
    raw["sft"]["val_problems"] = 8
    return raw


RUN_OUTPUTS = ("dvc.lock", "data/", "checkpoints/", ".prefect/", ".dvc/tmp/", ".dvc/cache/")
"""What a run of the pipeline writes into the checkout (DVC's lock and outputs, the metrics / details / plots git
would record, checkpoints, Prefect's state): never copied into a test project, which starts as a fresh clone would,
whether or not the checkout ran the pipeline before the tests (issue 35)."""


def source_files(root: Path = ROOT) -> list[str]:
    """The checkout's files a test project copies: tracked and untracked-not-ignored (work in progress counts), less
    :data:`RUN_OUTPUTS`."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.split("\0")
    return [rel for rel in files if rel and not (rel == RUN_OUTPUTS[0] or rel.startswith(RUN_OUTPUTS[1:]))
            and (root / rel).is_file()]


def copy_sources(dst: Path, root: Path = ROOT) -> Path:
    """Copy :func:`source_files` into ``dst``."""
    for rel in source_files(root):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst / rel)
    return dst


def make_project(dst: Path, *, tiny: bool = True) -> Path:
    """A copy of the working tree in ``dst`` (:func:`copy_sources`) as a fresh git repository (params shrunk when
    ``tiny``)."""
    dst.mkdir(parents=True, exist_ok=True)
    copy_sources(dst)
    if tiny:
        raw = shrink(resolve(dst / "params.yaml"))
        (dst / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dst, check=True)
    subprocess.run(GIT + ["commit", "-qm", "init"], cwd=dst, check=True)
    return dst


def env(api_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a command in a project copy: this interpreter's bin first; PREFECT_API_URL only when
    given (without it the project's own server is used, started on demand)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME", "DVC_STAGE",
                                                          "DSM_STAGE_SERVER", "PYTHONPATH")}
    e["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    e["PYTHONUNBUFFERED"] = "1"
    if api_url:
        e["PREFECT_API_URL"] = api_url
    e.update(extra)
    return e


def run(cmd: list[str], cwd: Path, e: dict[str, str] | None = None, *, check: bool = True, timeout: float = 900
        ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=e or env(), capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def tree_hash(path: Path) -> str:
    """md5 of every file's relative path and bytes under ``path`` (empty string when absent)."""
    if not path.exists():
        return ""
    h = hashlib.md5()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def set_key(raw: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return raw


def processes_in(project: Path) -> list[str]:
    """Processes (other than this one) whose working directory or command line is inside ``project``."""
    out = []
    root = str(project.resolve())
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                state = f.read().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd == root or cwd.startswith(root + "/") or root in cmd):
            out.append(f"{pid}: {cmd.strip()[:160]}")
    return out


def wait_gone(project: Path, timeout: float = 10.0) -> list[str]:
    """Wait until no process runs in ``project``; return those still running after ``timeout``."""
    t0 = time.monotonic()
    left = processes_in(project)
    while left and time.monotonic() - t0 < timeout:
        time.sleep(0.2)
        left = processes_in(project)
    return left


def temporaries(project: Path) -> list[str]:
    """Temporary paths of stages/core/io.py (``.<name>.<pid>.<random>.tmp``, ``.<name>.old-<pid>``) left anywhere
    under the project's data/ and checkpoints/."""
    out = []
    for root in ("data", "checkpoints"):
        base = project / root
        if base.is_dir():
            out += [str(p.relative_to(project)) for p in base.rglob(".*") if p.name.endswith(".tmp") or ".old-" in p.name]
    return out


def start(cmd: list[str], cwd: Path, e: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own (a signal to its group reaches it and its children, like a Ctrl-C in
    a terminal), output to ``log``."""
    f = open(log, "wb")  # noqa: SIM115 (closed when the process ends)
    return subprocess.Popen(cmd, cwd=cwd, env=e, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None,
             log: Path | None = None) -> None:
    t0 = time.monotonic()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:] if log else ''}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.1)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass

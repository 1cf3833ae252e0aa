"""Issue 28's attacks on the code sandbox and fourteen more (benchmarks/sandbox_attacks.py, which also runs them
through main's sandbox and bubblewrap for docs/results/sandbox.md's table), each through this sandbox with the
pipeline's limits: every one must be contained, and leave the caller and the zygote working.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.sandbox_attacks import ATTACKS, ExecutorRunner, host_setup, pth_trial
from stages.core import sandbox
from tests.core.test_sandbox_hostile import assert_clean


@pytest.fixture(scope="module")
def host():
    with host_setup() as h:
        yield h


@pytest.fixture(scope="module")
def this():
    return ExecutorRunner("this", sandbox.get_executor())


def _active(*mechs: str) -> None:
    rep = sandbox.isolation_report()
    off = [m for m in mechs if rep["mechanisms"].get(m) is False]  # (a sandbox without the mechanism: runs)
    if off:
        pytest.skip(f"not active here: {off} ({[rep['reasons'].get(m) for m in off]})")


NEEDS = {  # the mechanisms an attack's containment rests on (absent without root: reported, skipped here)
    "answers": ("allowlist_fs",), "proc_paths": ("allowlist_fs", "proc_hidepid"), "fifo": ("allowlist_fs",),
    "inodes": ("inode_cap",), "cpu": ("cpu_limit",), "kernel_knobs": ("proc_hidepid",), "links": ("allowlist_fs",),
    "signals": ("pidns",), "fork_bomb": ("cgroup_pids",),
}


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.key for a in ATTACKS])
def test_attack_is_contained(attack, host, this):
    _active(*NEEDS.get(attack.key, ()))
    contained, evidence = attack.trial(this, host)
    assert contained, f"{attack.key} ({attack.technique}): {evidence}"
    assert_clean(sandbox.run_python("print(1)"))


def test_a_directory_that_a_pth_file_names_is_not_shown(host):
    _active("allowlist_fs")
    contained, evidence = pth_trial(
        lambda py: sandbox.SandboxExecutor(python=py, preload=["math"], prefork=1), host.secret)
    assert contained, evidence


def test_the_report_lists_what_is_shown_and_what_is_not(tmp_path):
    """The allow-list in the isolation report: system trees and the Python installation, never the checkout's
    root or anything above it; a hidden path inside the allow-list is covered."""
    _active("allowlist_fs")
    rep = sandbox.isolation_report()
    from tests.core.test_sandbox_hostile import ROOT

    root = str(ROOT)
    for p in rep["exposed_paths"]:
        assert not (root == p or root.startswith(p.rstrip("/") + "/")), p  # nothing holding the checkout
    assert "/usr" in rep["exposed_paths"]
    secret = tmp_path / "site" / "hidden-data"
    secret.mkdir(parents=True)
    (secret / "f.txt").write_text("x")
    tmp_path.chmod(0o755)
    (tmp_path / "site").chmod(0o755)
    secret.chmod(0o755)
    ex = sandbox.SandboxExecutor(expose=[str(tmp_path / "site")], hide=[str(secret)], preload=["math"], prefork=1)
    try:
        r = ex.report()
        assert r["hidden_paths"] == [str(secret)]
        res, _ = ex.run(f"import os\nprint(os.listdir({str(tmp_path / 'site')!r}), os.listdir({str(secret)!r}))")
        assert res.ok and res.stdout == "['hidden-data'] []\n", res.stderr
    finally:
        ex.close()


def test_paths_that_params_files_name_are_hidden(tmp_path, monkeypatch):
    """Every absolute path a params file names is hidden from the programs, even inside the allow-list."""
    import yaml

    from stages.schema import base

    monkeypatch.setattr(base, "_NAMED_PATHS", set())
    data = tmp_path / "models" / "ckpt"
    data.mkdir(parents=True)
    inside = sorted(sandbox.isolation_report()["exposed_paths"])[-1]  # a directory the sandbox shows
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"base_model": {"checkpoint": str(data)}, "x": [inside, "relative/path"]}))
    base.read_params_file(params)
    assert {str(data), inside, "relative/path"} - base.named_paths() == {"relative/path"}
    assert os.path.realpath(inside) in sandbox.protected()  # inside the allow-list: hidden
    assert str(data) not in sandbox.protected()  # outside it: never shown anyway (no zygote restart for it)


def test_without_the_allow_list_programs_run_on_a_read_only_host_and_it_is_reported():
    """A host where the zygote cannot build the sandbox's root: the host's tree read-only (no nodev, no minimal
    /dev: they live in the allow-list's root), reported, never silent."""
    _active("allowlist_fs")
    ex = sandbox.SandboxExecutor(disable=["allowlist_fs"], preload=["math"], prefork=1)
    try:
        rep = ex.report()
        assert {"allowlist_fs", "nodev", "minimal_dev"} <= set(rep["inactive"]) and rep["fatal"] is None
        assert rep["reasons"]["nodev"] == "needs allowlist_fs"
        res, _ = ex.run("import os\ntry:\n    open('/usr/x', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
                        "print(open('/dev/null').read() == '', os.getcwd())")
        assert res.ok and res.stdout == "30\nTrue /tmp\n", res.stderr  # EROFS
    finally:
        ex.close()


def test_each_program_runs_under_its_own_cpu_quota():
    """The CPU limit is a cgroup quota per program (what the [cpu] attack's figure depends on the machine's load to
    show): while a program runs, its cgroup holds cpus x the 100 ms period; the parent weighs one process per CPU."""
    import threading
    import time

    _active("cpu_limit")
    rep = sandbox.isolation_report()
    if rep["cpu_limit"] != "cgroup":
        pytest.skip(f"no cpu cgroup here: programs are pinned to CPUs instead ({rep['reasons'].get('cpu_limit')})")
    parent = next(d for d in rep["cgroups"] if "/cpu/" in d or "/cpu," in d)
    assert int(open(os.path.join(parent, "cpu.shares")).read()) == 1024 * len(os.sched_getaffinity(0))
    seen: dict[str, int] = {}

    def watch(stop: threading.Event) -> None:
        while not stop.is_set():
            for e in os.scandir(parent):
                if e.is_dir():
                    try:
                        busy = open(os.path.join(e.path, "cgroup.procs")).read().split()
                        quota = int(open(os.path.join(e.path, "cpu.cfs_quota_us")).read())
                    except OSError:
                        continue
                    if len(busy) >= 2:  # the sandbox's PID 1 and the program
                        seen[e.name] = quota
            time.sleep(0.02)

    for cpus, quota in ((1.0, 100_000), (0.5, 50_000)):
        seen.clear()
        stop = threading.Event()
        t = threading.Thread(target=watch, args=(stop,))
        t.start()
        r = sandbox.run_python("import time\ntime.sleep(0.6)", cpus=cpus)
        stop.set()
        t.join()
        assert r.ok and quota in seen.values(), (cpus, seen)

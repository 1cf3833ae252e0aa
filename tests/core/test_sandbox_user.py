"""The code sandbox as an ordinary user (issue 46): run as a second, non-root local user (tests/other_user.py), the
zygote isolates through an unprivileged user namespace as bubblewrap does: the file-system allow-list, PID / network /
IPC namespaces, a private /tmp with its inode cap, no capability left, processes capped per program; the gold answer
a user keeps in their checkout stays out of reach. Without a user namespace the allow-list is gone (the gold is read),
which is what the pipeline refuses to run model-written code in (stages.core.sandbox.require_isolation)."""

from __future__ import annotations

import json

import pytest

PROBE = r'''
import json, os
from stages.core import sandbox

secret = os.path.join(os.getcwd(), "data", "testsets", "secret.jsonl")  # the user's own checkout
os.makedirs(os.path.dirname(secret), exist_ok=True)
with open(secret, "w") as f:
    f.write('{"answer": "gold-%d"}\n' % os.getpid())
os.chmod(secret, 0o644)
READ = "print(open(%r).read())" % secret
FACTS = """
import os, json, socket
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"uid": os.getuid(), "cap_eff": int(status["CapEff"], 16), "cap_bnd": int(status["CapBnd"], 16),
                  "root": sorted(os.listdir("/")), "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
                  "hostname": socket.gethostname(), "tmp": os.listdir("/tmp")}))
"""
FORKS = """
import os, time
n = 0
try:
    while n < 200:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""
out = {}
ex = sandbox.SandboxExecutor(preload=["math"], prefork=1)
rep = ex.report()
out["privileges"], out["inactive"], out["reasons"] = rep["privileges"], rep["inactive"], rep["reasons"]
r, _ = ex.run(READ)
out["gold"] = [r.status, "gold-" in r.stdout]
r, _ = ex.run(FACTS)
out["facts"] = json.loads(r.stdout) if r.ok else r.stderr
r, _ = ex.run(FORKS, max_procs=8, timeout_s=10)
out["forks"] = int(r.stdout) if r.ok else r.stderr
ex.close()
ex = sandbox.SandboxExecutor(disable=["userns"], preload=["math"], prefork=1)
rep = ex.report()
out["without"] = {"privileges": rep["privileges"], "missing": [m for m in sandbox.REQUIRED if not rep["mechanisms"][m]]}
r, _ = ex.run(READ)
out["without"]["gold"] = [r.status, "gold-" in r.stdout]
ex.close()
print(json.dumps(out))
'''


def test_without_root_the_sandbox_isolates_through_a_user_namespace(other_user) -> None:
    res = other_user.python_code(PROBE)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.splitlines()[-1])
    if out["privileges"] != "user namespace":
        pytest.skip(f"no unprivileged user namespace on this kernel: {out['privileges']}")
    # everything but what needs root or a delegated cgroup (the uid of its own, the pids and memory cgroups)
    assert set(out["inactive"]) <= {"uid", "cgroup_pids", "cgroup_memory"}, out["reasons"]
    assert out["gold"] == ["error", False]  # the finding: print(open('<checkout>/data/testsets/...').read())
    facts = out["facts"]
    assert isinstance(facts, dict), facts
    assert facts["uid"] == other_user.uid and facts["cap_eff"] == 0 and facts["cap_bnd"] == 0
    assert not set(facts["root"]) - {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp",
                                     "usr"} - {other_user.python.split("/")[1]}, facts["root"]
    assert len(facts["pids"]) == 1 and facts["hostname"] == "sandbox" and facts["tmp"] == []
    assert out["forks"] in (6, 7), out["forks"]  # RLIMIT_NPROC 8 per program (its own user namespace), as root
    # without a user namespace: the reduced mode, in which the gold answer is read
    assert out["without"]["privileges"] == "none: disabled by configuration"
    assert out["without"]["missing"] == ["allowlist_fs", "pidns", "netns"]
    assert out["without"]["gold"] == ["ok", True]


@pytest.mark.slow  # every attack of benchmarks/sandbox_attacks.py as that user: ~15 s; .ci/slow robustness
def test_every_attack_is_contained_without_root(other_user) -> None:
    code = r'''
import json
from benchmarks.sandbox_attacks import ATTACKS, ExecutorRunner, host_setup
from stages.core import sandbox

out = {}
with host_setup() as h:
    ex = sandbox.SandboxExecutor()
    out["privileges"] = ex.report()["privileges"]
    runner = ExecutorRunner("this", ex)
    for a in ATTACKS:
        out[a.key] = a.trial(runner, h)
    runner.close()
print("RESULT " + json.dumps(out))
'''
    res = other_user.python_code(code, timeout=600)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    assert res.returncode == 0 and line, res.stderr[-2000:]
    out = json.loads(line[-1][7:])
    if out.pop("privileges") != "user namespace":
        pytest.skip("no unprivileged user namespace on this kernel")
    escaped = {k: ev for k, (ok, ev) in out.items() if not ok}
    assert not escaped, escaped

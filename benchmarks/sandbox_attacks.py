"""The red-team table of docs/results/sandbox.md: issue 28's attacks on the code sandbox and fourteen more, each through
several sandboxes side by side.

    python benchmarks/sandbox_attacks.py [--bwrap] [--only KEY ...] [--out FILE]
    python benchmarks/sandbox_attacks.py --merge ROOT.json USER.json   # side by side: root and an ordinary user

As root and as an ordinary user (issue 46): run it once as root with ``--out root.json`` and once as another user from
a copy of the checkout that user owns (the attacks plant their host-side objects in it), with an interpreter it can
run, ``--out user.json``; ``--merge`` writes the two side by side into benchmarks/results/sandbox_attacks.json.

Sandboxes: ``this`` (this checkout's stages/core/sandbox.py) and ``bwrap`` (Debian's bubblewrap as a field engineer
would set it up, :class:`BwrapRunner`). Every attack is a plain Python program (it runs unchanged in all of them) plus
what the host does meanwhile (a FIFO reader, a socket listener, a planted secret) and a judge that says, from the
program's report and the host's observations, whether the attack was contained. The pipeline's own limits apply
(``run_python`` / ``run_pot``: 10 s, 512 MB, 64 MB disk, 32 processes) unless an attack says otherwise.
tests/core/test_sandbox_attacks.py runs every attack through ``this`` and asserts containment; this script prints the
table and writes benchmarks/results/sandbox_attacks.json.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import _sandbox_zygote as zygote  # noqa: E402

PIPELINE_LIMITS = {"timeout_s": 10.0, "memory_mb": 512, "disk_mb": 64, "max_procs": 32}


@dataclass
class Outcome:
    """What a program did, in any sandbox."""

    status: str
    stdout: str
    stderr: str
    wall_s: float

    def report(self) -> dict:
        """The program's last ``RESULT {json}`` line ({} when there is none)."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("RESULT "):
                with contextlib.suppress(ValueError):
                    return json.loads(line[7:])
        return {}


class ExecutorRunner:
    """A version of stages/core/sandbox.py (its SandboxExecutor); limits it does not know are left out."""

    def __init__(self, name: str, executor: Any) -> None:
        self.name, self.ex = name, executor
        self.params = set(inspect.signature(executor.run).parameters)

    def run(self, code: str, **kw: Any) -> Outcome:
        r, _ = self.ex.run(code, **{k: v for k, v in kw.items() if k in self.params})
        return Outcome(r.status, r.stdout, r.stderr + (f"\n[sandbox_error] {r.sandbox_error}" if r.sandbox_error
                                                        else ""), r.wall_s)

    def close(self) -> None:
        self.ex.close()


class BwrapRunner:
    """bubblewrap (``bwrap``), set up as a field engineer would for untrusted Python: every namespace
    (``--unshare-all``), uid/gid 65534 in a user namespace, no capabilities, the same read-only allow-list as
    the project's sandbox (``/usr``, merged-/usr symlinks, the Python installation, the same /etc entries),
    ``--proc``, ``--dev``, a ``--tmpfs /tmp``, an empty environment, ``--die-with-parent``, ``--new-session``,
    and the project's own seccomp allow-list (plus what exec'ing a new interpreter needs: execve, arch_prctl,
    set_tid_address). Limits bwrap has no option for are set as rlimits before it starts (address space: the
    interpreter's ~400 MB + ``memory_mb``; CPU seconds; file size; open files; processes, which count per
    host uid); the wall-clock timeout kills bwrap, whose children die with it. No cgroup, so no memory cap
    for the process tree, no pids cap beyond RLIMIT_NPROC, no CPU quota; bwrap 0.8's tmpfs has no size
    option (``--size`` came in 0.9), so /tmp is as large as the host's memory allows."""

    name = "bwrap"

    def __init__(self, python: str = sys.executable, exe: str = "bwrap") -> None:
        self.exe = shutil.which(exe)
        if self.exe is None:
            raise RuntimeError("bwrap not found (Debian: apt-get install bubblewrap)")
        self.python = python
        pydirs, _ = zygote.python_installation()
        plan = zygote.plan_fs(pydirs, [], [])
        args = ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
                "--die-with-parent", "--new-session", "--clearenv", "--proc", "/proc", "--dev", "/dev",
                "--tmpfs", "/tmp", "--chdir", "/tmp", "--hostname", "sandbox"]
        for b in plan["binds"]:
            args += ["--ro-bind", b, b]
        for link, target in plan["links"].items():
            args += ["--symlink", target, link]
        for e in plan["etc"]:
            args += ["--ro-bind", f"/etc/{e}", f"/etc/{e}"]
        # a new interpreter starts in each sandbox: its binary, a venv's pyvenv.cfg, a shared libpython
        extra = {os.path.dirname(os.path.realpath(python)), os.path.join(sys.prefix, "pyvenv.cfg"),
                 os.path.dirname(python)}
        extra |= {str(p) for p in Path(sys.base_prefix, "lib").glob("libpython*.so*")}
        for p in sorted(e for e in extra if os.path.exists(e)):
            if not any(p == b or p.startswith(b.rstrip("/") + "/") for b in plan["binds"]):
                args += ["--ro-bind", p, p]
        self.args = args
        fprog, arr = zygote.build_seccomp(allow_exec=True)
        self.filter = bytes(memoryview(arr).cast("B"))[: fprog.len * 8]

    def _limits(self, timeout_s: float, memory_mb: int, disk_mb: int, max_procs: int) -> Callable[[], None]:
        import math
        import resource

        def apply() -> None:
            cpu = max(1, math.ceil(timeout_s))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_AS, ((400 + memory_mb) << 20,) * 2)
            resource.setrlimit(resource.RLIMIT_FSIZE, (disk_mb << 20,) * 2)
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
            resource.setrlimit(resource.RLIMIT_NPROC, (max_procs + 4,) * 2)  # per host uid: bwrap and its init too
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        return apply

    def run(self, code: str, timeout_s: float = 10.0, memory_mb: int = 512, disk_mb: int = 64, max_procs: int = 32,
            **_: Any) -> Outcome:
        r, w = os.pipe()
        os.write(w, self.filter)  # small: fits the pipe buffer
        os.close(w)
        t0 = time.monotonic()
        try:
            p = subprocess.Popen([self.exe, *self.args, "--seccomp", str(r), self.python, "-I", "-B", "-c", code],
                                 pass_fds=[r], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env={"PATH": os.defpath},
                                 preexec_fn=self._limits(timeout_s, memory_mb, disk_mb, max_procs))
        finally:
            os.close(r)
        try:
            out, err = p.communicate(timeout=timeout_s)
            status = "ok" if p.returncode == 0 else ("killed" if p.returncode < 0 else "error")
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            status = "timeout"
        return Outcome(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.monotonic() - t0)

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------------------
@dataclass
class Host:
    """What the host holds that an attacker wants: the checkout (``root``), a directory in it where the host
    side of an attack puts its objects (``plant``: a secret file, FIFOs), the real data beside it
    (``shared``), and a secret in the caller's environment (``env_secret``)."""

    root: Path
    plant: Path
    secret: str
    env_secret: str
    shared: Path

    @property
    def secret_file(self) -> Path:
        return self.plant / "answers.jsonl"


@contextlib.contextmanager
def host_setup(root: Path = ROOT) -> Iterator[Host]:
    """Plant the host's objects (removed afterwards); sets ``DSM_ATTACK_SECRET`` in this process's environment
    (before any executor starts, so that a leak of the caller's environment would show it)."""
    plant = root / f".sandbox-attack-{uuid.uuid4().hex[:8]}"
    plant.mkdir(mode=0o755)
    plant.chmod(0o755)
    h = Host(root=root, plant=plant, secret=f"gold-{uuid.uuid4().hex}", env_secret=f"env-{uuid.uuid4().hex}",
             shared=Path(os.environ.get("SHARED_DATA", root.parent / "shared" / "data")))
    h.secret_file.write_text(json.dumps({"question": "1+1", "answer": h.secret}) + "\n")
    h.secret_file.chmod(0o644)
    os.environ["DSM_ATTACK_SECRET"] = h.env_secret
    try:
        yield h
    finally:
        os.environ.pop("DSM_ATTACK_SECRET", None)
        shutil.rmtree(plant, ignore_errors=True)


@dataclass
class Attack:
    """One attack: ``program(host)`` is the code; ``during(host)`` a context manager for what the host does
    meanwhile (it yields a dict the judge reads); ``judge(outcome, host, seen)`` -> (contained, evidence)."""

    key: str
    technique: str
    finding: bool
    program: Callable[[Host], str]
    judge: Callable[[Outcome, Host, dict], tuple[bool, str]]
    during: Callable[[Host], Any] | None = None
    limits: dict = field(default_factory=dict)
    concurrent: bool = False  # program(host) returns [victim, attacker]: run together

    def trial(self, runner: Any, host: Host) -> tuple[bool, str]:
        kw = {**PIPELINE_LIMITS, **self.limits}
        with (self.during(host) if self.during else contextlib.nullcontext({})) as seen:
            if self.concurrent:
                victim, attacker = self.program(host)
                box: dict = {}
                t = threading.Thread(target=lambda: box.setdefault("v", runner.run(victim, **kw)))
                t.start()
                time.sleep(0.5)
                out = runner.run(attacker, **kw)
                t.join()
            else:
                out = runner.run(self.program(host), **kw)
        return self.judge(out, host, seen or {})


PRELUDE = """
import os, sys, json, errno, ctypes
RES = {}
def attempt(name, fn):
    try:
        RES[name] = ["ok", repr(fn())[:200]]
    except OSError as e:
        RES[name] = ["refused", errno.errorcode.get(e.errno, str(e.errno))]
    except Exception as e:
        RES[name] = ["failed", type(e).__name__]
def done():
    print("RESULT " + json.dumps(RES), flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sysc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r < 0:
        raise OSError(ctypes.get_errno(), "syscall")
    return r
"""


def _oks(out: Outcome) -> list[str]:
    return sorted(k for k, v in out.report().items() if v[0] == "ok")


def _refused_unless(out: Outcome, allowed: set[str] = frozenset()) -> tuple[bool, str]:
    rep = out.report()
    if not rep:
        return True, f"no report ({out.status}: {out.stderr.strip()[-120:]})"
    ok = [k for k in _oks(out) if k not in allowed]
    return not ok, ("succeeded: " + ", ".join(ok)) if ok else f"all {len(rep)} refused"


# ---- issue 28's findings ------------------------------------------------------------------------------------
def p_answers(h: Host) -> str:
    return PRELUDE + f"""
roots = set()
with_cmdline = None
try:
    with_cmdline = open("/proc/1/cmdline", "rb").read().decode(errors="replace").split("\\0")
    for a in with_cmdline:
        if a.endswith("stages/core/_sandbox_zygote.py"):
            roots.add(a[: -len("/stages/core/_sandbox_zygote.py")])
except OSError:
    pass
for p in sys.path:  # a venv inside the checkout names it
    if "/.venv/" in p:
        roots.add(p.split("/.venv/")[0])
roots.add({str(h.root)!r})  # and what recon elsewhere (mountinfo, error messages) gives
read = {{}}
for p in [{str(h.shared / 'gsm8k')!r}, {str(h.shared / 'math')!r}]:  # the real data beside the checkout
    try:
        names = sorted(os.listdir(p))
        read[p] = ("dir", names[:5])
        f = next((os.path.join(p, n) for n in names if n.endswith((".jsonl", ".json", ".parquet"))), None)
        if f:
            read[f] = ("file", open(f, "rb").read(300).decode(errors="replace"))
    except OSError:
        pass
for r in sorted(roots):
    for rel in ("params.yaml", {str(h.secret_file.relative_to(h.root))!r}, "data/testsets",
                "../shared/data/gsm8k", "../shared/data/math"):
        p = os.path.join(r, rel)
        try:
            if os.path.isdir(p):
                names = sorted(os.listdir(p))
                read[p] = ("dir", names[:5])
                f = next((os.path.join(p, n) for n in names if n.endswith((".jsonl", ".json", ".parquet"))), None)
                if f:
                    read[f] = ("file", open(f, "rb").read(300).decode(errors="replace"))
            else:
                read[p] = ("file", open(p, "rb").read(300).decode(errors="replace"))
        except OSError as e:
            pass
RES["read"] = ["ok" if read else "refused", read]
done()
"""


def j_answers(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    read = out.report().get("read", ["refused", {}])[1]
    got_secret = h.secret in out.stdout
    if not read:
        return True, f"nothing of the checkout or ../shared readable ({out.status})"
    names = sorted({Path(p).name for p in read})[:4]
    return False, f"read {len(read)} paths ({', '.join(names)}...){'; the gold answer' if got_secret else ''}"


def p_proc_paths(h: Host) -> str:
    return PRELUDE + """
attempt("pid1 cmdline", lambda: open("/proc/1/cmdline", "rb").read().decode(errors="replace"))
attempt("pid1 environ", lambda: len(open("/proc/1/environ", "rb").read()))
mounts = []
for line in open("/proc/self/mountinfo"):
    f = line.split()
    mounts.append([f[3], f[4], f[line.split().index("-") + 1]])
RES["mounts"] = ["info", mounts]
done()
"""


def j_proc_paths(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    rep = out.report()
    pid1 = rep.get("pid1 cmdline", ["refused", ""])
    root = str(h.root)
    # a mount whose source is the checkout or a directory above it shows the checkout
    above = [m for m in rep.get("mounts", [None, []])[1] if m[2] not in ("tmpfs", "proc", "devtmpfs", "devpts",
                                                                         "mqueue", "sysfs", "cgroup", "cgroup2")
             and (root == m[0] or root.startswith(m[0].rstrip("/") + "/"))]
    n = len(rep.get("mounts", [None, []])[1])
    bits = []
    if pid1[0] == "ok":
        bits.append("PID 1's command line" + (" names the checkout" if root in pid1[1] else ""))
    if above:
        bits.append(f"mount {above[0][1]} shows {above[0][0]} (holds the checkout)")
    return not bits, "; ".join(bits) if bits else f"PID 1 hidden; {n} mounts, none holding the checkout"


@contextlib.contextmanager
def d_fifo(h: Host) -> Iterator[dict]:
    path = h.plant / "pipe"
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o666)
    path.chmod(0o666)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    seen: dict = {"got": b"", "path": str(path)}
    try:
        yield seen
    finally:
        time.sleep(0.2)
        with contextlib.suppress(BlockingIOError):
            seen["got"] += os.read(fd, 4096)
        os.close(fd)
        path.unlink(missing_ok=True)


def p_fifo(h: Host) -> str:
    return PRELUDE + f"""
def w():
    fd = os.open({str(h.plant / 'pipe')!r}, os.O_WRONLY | os.O_NONBLOCK)
    return os.write(fd, b"injected by the sandbox")
attempt("write host fifo", w)
done()
"""


def j_fifo(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    got = seen.get("got", b"")
    return not got, f"the host read {got[:40]!r} from its FIFO" if got else "no byte reached the host's FIFO"


def p_inodes(h: Host) -> str:
    return PRELUDE + """
import time
n, err, t0 = 0, None, time.monotonic()
os.mkdir("f")
try:
    while time.monotonic() - t0 < 6 and n < 300000:
        os.close(os.open(f"f/{n}", os.O_CREAT | os.O_WRONLY, 0o600))
        n += 1
except OSError as e:
    err = errno.errorcode.get(e.errno)
RES["files"] = ["info", [n, err]]
done()
"""


def j_inodes(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    n, err = out.report().get("files", ["info", [None, None]])[1]
    if n is None:
        return True, f"no report ({out.status})"
    return n <= 65536 and err is not None, f"{n} empty files" + (f", then {err}" if err else " (no limit hit)")


def p_cpu(h: Host) -> str:
    return PRELUDE + """
import time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        t = time.monotonic()
        while time.monotonic() - t < 2.0:
            pass
        os._exit(0)
    kids.append(pid)
t = time.monotonic()
while time.monotonic() - t < 2.0:
    pass
for k in kids:
    os.waitpid(k, 0)
wall = time.monotonic() - t
c = os.times()
RES["cpu"] = ["info", [c.user + c.system + c.children_user + c.children_system, wall]]
done()
"""


def j_cpu(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    cpu, wall = out.report().get("cpu", ["info", [None, None]])[1]
    if cpu is None:
        return True, f"no report ({out.status})"
    return cpu / wall <= 1.25, f"4 busy processes used {cpu / wall:.2f} CPUs"


# ---- fourteen more --------------------------------------------------------------------------------------------
def p_ptrace(h: Host) -> str:
    return PRELUDE + """
attempt("ptrace(ATTACH, 1)", lambda: sysc(101, 16, 1, 0, 0))
attempt("ptrace(ATTACH, ppid)", lambda: sysc(101, 16, os.getppid(), 0, 0))
buf = ctypes.create_string_buffer(64)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(0x400000, 64)
attempt("process_vm_readv(1)", lambda: sysc(310, 1, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0))
attempt("/proc/1/mem", lambda: open("/proc/1/mem", "rb").read(1))
attempt("pidfd_open(1) + pidfd_getfd", lambda: sysc(438, sysc(434, 1, 0), 0, 0))
done()
"""


def p_cgroup_escape(h: Host) -> str:
    return PRELUDE + """
import glob
for f in glob.glob("/sys/fs/cgroup/*/release_agent") + glob.glob("/sys/fs/cgroup/release_agent"):
    attempt("write " + f, lambda f=f: open(f, "w").close())
for f in glob.glob("/sys/fs/cgroup/*/notify_on_release")[:2]:
    attempt("write " + f, lambda f=f: open(f, "w").close())
os.makedirs("cg", exist_ok=True)
attempt("mount cgroup", lambda: sysc(165, ctypes.addressof(ctypes.create_string_buffer(b"cgroup")),
                                      ctypes.addressof(ctypes.create_string_buffer(b"cg")),
                                      ctypes.addressof(ctypes.create_string_buffer(b"cgroup")), 0,
                                      ctypes.addressof(ctypes.create_string_buffer(b"rdma"))))
attempt("unshare(NEWUSER|NEWNS)", lambda: sysc(272, 0x10000000 | 0x00020000))
RES["cgroup files visible"] = ["info", len(glob.glob("/sys/fs/cgroup/*"))]
done()
"""


def j_cgroup_escape(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    ok, ev = _refused_unless(out)
    n = out.report().get("cgroup files visible", ["info", "?"])[1]
    return ok, f"{ev}; {n} /sys/fs/cgroup entries visible"


def p_kernel_knobs(h: Host) -> str:
    return PRELUDE + """
for f in ("/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
          "/sys/kernel/mm/transparent_hugepage/enabled"):
    attempt("open for write " + f, lambda f=f: os.close(os.open(f, os.O_WRONLY)))
readable = []
for f in ("/proc/sys/kernel/core_pattern", "/proc/kallsyms", "/proc/modules", "/proc/sys/kernel/hostname",
          "/proc/cpuinfo", "/proc/meminfo", "/sys/class/net", "/sys/kernel/notes", "/proc/kcore"):
    try:
        if os.path.isdir(f):
            os.listdir(f)
        else:
            open(f, "rb").read(16)
        readable.append(f)
    except OSError:
        pass
RES["readable"] = ["info", readable]
done()
"""


def j_kernel_knobs(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    ok, ev = _refused_unless(out)
    readable = out.report().get("readable", ["info", []])[1]
    return ok, f"{ev}; kernel files readable: {len(readable)}" + (f" ({', '.join(readable[:3])}...)" if readable
                                                                   else "")


@contextlib.contextmanager
def d_abstract(h: Host) -> Iterator[dict]:
    name = _abstract_name(h)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(4)
    srv.settimeout(0.1)
    seen: dict = {"accepted": 0, "name": name}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                seen["accepted"] += 1
                c.close()
            except OSError:
                pass

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        time.sleep(0.2)
        stop.set()
        t.join()
        srv.close()


def _abstract_name(h: Host) -> str:
    return f"dsm-attack-{h.secret[-8:]}"  # known to the attacker (a well-known service name, say)


def p_abstract(h: Host) -> str:
    return PRELUDE + f"""
import socket, struct
name = {_abstract_name(h)!r}
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\\0" + name)
    return "connected"
def raw():
    fd = sysc(41, 1, 1, 0)
    addr = struct.pack("=H", 1) + b"\\0" + name.encode()
    b = ctypes.create_string_buffer(addr)
    return sysc(42, fd, ctypes.addressof(b), len(addr))
try:
    RES["listener visible"] = ["info", name in open("/proc/self/net/unix").read()]
except OSError:
    RES["listener visible"] = ["info", False]
attempt("connect", conn)
attempt("raw connect", raw)
done()
"""


def j_abstract(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    n = seen.get("accepted", 0)
    visible = out.report().get("listener visible", ["info", False])[1]
    return n == 0, (f"the host accepted {n} connection(s)" if n else "no connection reached the host") + \
        ("; the host's listener is listed in /proc/net/unix" if visible else "")


def p_signals(h: Host) -> str:
    return PRELUDE + """
import signal
me = {os.getpid()}
visible, signalable = 0, []
for pid in range(1, 65536):
    if pid in me:
        continue
    try:
        os.kill(pid, 0)
        signalable.append(pid)
    except ProcessLookupError:
        pass
    except PermissionError:
        visible += 1
RES["foreign pids that exist"] = ["info", visible + len(signalable)]
RES["foreign pids it may signal"] = ["ok" if signalable else "refused", signalable[:10]]
attempt("kill(ppid, SIGKILL)", lambda: os.kill(os.getppid(), signal.SIGKILL) if os.getppid() > 1 else
        os.kill(1, signal.SIGKILL))
attempt("kill(-1, SIGCONT)", lambda: os.kill(-1, signal.SIGCONT))
done()
"""


def j_signals(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    rep = out.report()
    sig = rep.get("foreign pids it may signal", ["refused", []])
    n = rep.get("foreign pids that exist", ["info", "?"])[1]
    kill = rep.get("kill(ppid, SIGKILL)", ["refused"])[0]
    bad = sig[0] == "ok" or kill == "ok"
    return not bad, f"{n} foreign processes seen, {len(sig[1])} signalable" + (
        "; kill(parent, SIGKILL) returned success" if kill == "ok" else "")


def p_memfd(h: Host) -> str:
    return PRELUDE + """
chunk = b"x" * (1 << 20)
def fill(fd, limit=200):
    n = 0
    try:
        for _ in range(limit):
            os.write(fd, chunk)
            n += 1
    except OSError:
        pass
    return n
attempt("memfd_create", lambda: fill(sysc(319, ctypes.addressof(ctypes.create_string_buffer(b"x")), 0)))
def shm():
    fd = os.open("/dev/shm/big", os.O_CREAT | os.O_WRONLY, 0o600)
    return fill(fd)
def tmp():
    fd = os.open("big", os.O_CREAT | os.O_WRONLY, 0o600)
    return fill(fd)
RES["shm MB"] = ["info", shm()]
RES["tmp MB"] = ["info", tmp()]
done()
"""


def j_memfd(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    rep = out.report()
    memfd = rep.get("memfd_create", ["refused"])
    mb = (int(memfd[1]) if memfd[0] == "ok" else 0) + rep.get("shm MB", [0, 0])[1] + rep.get("tmp MB", [0, 0])[1]
    return mb <= 20, f"stored {mb} MB in memory-backed files with disk_mb=16 (memfd {memfd[0]})"


def p_cross(h: Host) -> list[str]:
    victim = f"""
import os, time
open("/tmp/victim-secret", "w").write({h.secret!r})
try:
    open("/dev/shm/victim-secret", "w").write({h.secret!r})
except OSError:
    pass
time.sleep(2.0)
"""
    attacker = PRELUDE + f"""
import glob
found = []
for pat in ("/tmp/*", "/tmp/*/*", "/dev/shm/*", "/proc/*/cwd/*", "/proc/*/root/tmp/*"):
    for f in glob.glob(pat):
        try:
            if {h.secret!r} in open(f, errors="replace").read():
                found.append(f)
        except OSError:
            pass
RES["found"] = ["ok" if found else "refused", found]
done()
"""
    return [victim, attacker]


def j_cross(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    found = out.report().get("found", ["refused", []])[1]
    return not found, f"found the other program's secret at {found[0]}" if found else "nothing of the other program"


def p_links(h: Host) -> str:
    return PRELUDE + f"""
attempt("hardlink host file", lambda: os.link({str(h.secret_file)!r}, "hl"))
attempt("symlink to host file", lambda: os.symlink({str(h.secret_file)!r}, "sl"))
attempt("read through symlink", lambda: open("sl").read(30))
attempt("rename into host dir", lambda: os.rename("sl", {str(h.plant / 'planted')!r}))
done()
"""


def j_links(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    rep = out.report()
    nlink = h.secret_file.stat().st_nlink
    planted = (h.plant / "planted").exists() or (h.plant / "planted").is_symlink()
    read = rep.get("read through symlink", ["refused"])[0] == "ok"
    bad = nlink != 1 or planted or read
    return not bad, (f"hard link count {nlink}, planted: {planted}, read through a symlink: {read}" if bad
                     else "no link to a host file, nothing planted")


def p_daemon(h: Host, tag: str) -> str:
    return f"""
import os, time, ctypes
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"{tag}"), 0, 0, 0)
        time.sleep(3)
        for p in ("{h.plant}/daemon-was-here", "/tmp/daemon-was-here"):
            try:
                open(p, "w").write("alive")
            except OSError:
                pass
        time.sleep(30)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
print("parent done")
"""


def _comm_pids(tag: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{p}/comm").read_text().strip() == tag:
                    out.append(int(p))
    return out


@contextlib.contextmanager
def d_daemon(h: Host) -> Iterator[dict]:
    yield {}


class DaemonAttack(Attack):
    """The daemon's process name is unique per trial; the host looks for it 3.5 s after the program returned."""

    def trial(self, runner: Any, host: Host) -> tuple[bool, str]:
        tag = f"dsmd{uuid.uuid4().hex[:8]}"
        out = runner.run(p_daemon(host, tag), **{**PIPELINE_LIMITS, **self.limits})
        time.sleep(3.5)
        alive = _comm_pids(tag)
        wrote = (host.plant / "daemon-was-here").exists()
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        bad = bool(alive) or wrote
        return not bad, (f"daemon alive {3.5:.1f} s after the program returned ({out.wall_s:.1f} s)"
                         + ("; it wrote to the host" if wrote else "") if bad
                         else f"returned in {out.wall_s:.1f} s; no process left")


def p_forkbomb(h: Host) -> str:
    return PRELUDE + """
import time
n, err = 0, None
t0 = time.monotonic()
while n < 2000 and time.monotonic() - t0 < 3:
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    except OSError as e:
        err = errno.errorcode.get(e.errno)
        break
RES["forks"] = ["info", [n, err]]
done()
"""


def j_forkbomb(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    n, err = out.report().get("forks", ["info", [None, None]])[1]
    if n is None:
        return True, f"no report ({out.status})"
    return n <= 64, f"{n} processes" + (f", then {err}" if err else " (stopped by the attack itself)")


@contextlib.contextmanager
def d_host_shm(h: Host) -> Iterator[dict]:
    p = Path("/dev/shm") / f"dsm-attack-{uuid.uuid4().hex[:8]}"
    p.write_text(h.secret)
    p.chmod(0o644)
    try:
        yield {"path": str(p)}
    finally:
        p.unlink(missing_ok=True)


def p_host_shm(h: Host) -> str:
    return PRELUDE + f"""
found = []
for n in os.listdir("/dev/shm"):
    try:
        if {h.secret!r} in open("/dev/shm/" + n).read():
            found.append(n)
    except OSError:
        pass
RES["found"] = ["ok" if found else "refused", found]
done()
"""


def p_kernel_surface(h: Host) -> str:
    return PRELUDE + """
p = ctypes.create_string_buffer(256)
a = ctypes.addressof(p)
attempt("io_uring_setup", lambda: sysc(425, 4, a))
attempt("userfaultfd", lambda: sysc(323, 0))
attempt("perf_event_open", lambda: sysc(298, a, 0, -1, -1, 0))
attempt("bpf", lambda: sysc(321, 0, a, 64))
attempt("add_key", lambda: sysc(248, ctypes.addressof(ctypes.create_string_buffer(b"user")),
                               ctypes.addressof(ctypes.create_string_buffer(b"k")), a, 4, -3))
attempt("keyctl(join session)", lambda: sysc(250, 1, 0))
attempt("unshare(NEWUSER)", lambda: sysc(272, 0x10000000))
attempt("mount tmpfs", lambda: sysc(165, 0, a, ctypes.addressof(ctypes.create_string_buffer(b"tmpfs")), 0, 0))
attempt("kexec_load", lambda: sysc(246, 0, 0, 0, 0))
done()
"""


def p_tiocsti(h: Host) -> str:
    return PRELUDE + """
import fcntl, termios
c = ctypes.create_string_buffer(b"x")
def sti(fd):
    return fcntl.ioctl(fd, termios.TIOCSTI, b"x")
attempt("open /dev/tty", lambda: os.open("/dev/tty", os.O_RDWR))
for fd in (0, 1, 2):
    attempt(f"TIOCSTI on fd {fd}", lambda fd=fd: sti(fd))
done()
"""


def p_environ(h: Host) -> str:
    return PRELUDE + """
import glob
found = []
if any("DSM_ATTACK_SECRET" in k for k in os.environ):
    found.append("os.environ")
for f in ["/proc/self/environ", "/proc/1/environ"] + glob.glob("/proc/*/environ"):
    try:
        if b"DSM_ATTACK_SECRET" in open(f, "rb").read():
            found.append(f)
    except OSError:
        pass
RES["found"] = ["ok" if found else "refused", sorted(set(found))]
done()
"""


def j_found(out: Outcome, h: Host, seen: dict) -> tuple[bool, str]:
    found = out.report().get("found", ["refused", []])[1]
    leaked = h.env_secret in out.stdout or h.secret in out.stdout or bool(found)
    return not leaked, f"found in {found[:2]}" if leaked else "not found"


ATTACKS: list[Attack] = [
    Attack("answers", "reading the checkout's data and ../shared/data (path discovery, then open)", True, p_answers,
           j_answers),
    Attack("proc_paths", "procfs reconnaissance: /proc/1/cmdline, /proc/self/mountinfo", True, p_proc_paths,
           j_proc_paths),
    Attack("fifo", "a host named pipe (FIFO, mode 0666) on a read-only mount", True, p_fifo, j_fifo, d_fifo),
    Attack("inodes", "inode flood: empty files in the tmpfs (not counted by its size)", True, p_inodes, j_inodes),
    Attack("cpu", "CPU starvation: 4 busy processes", True, p_cpu, j_cpu),
    Attack("ptrace", "ptrace / process_vm_readv / /proc/1/mem / pidfd_getfd on PID 1 (the root monitor)", False,
           p_ptrace, lambda o, h, s: _refused_unless(o)),
    Attack("cgroup_escape", "cgroup v1 release_agent escape (write release_agent, mount cgroup, unshare)", False,
           p_cgroup_escape, j_cgroup_escape),
    Attack("kernel_knobs", "kernel knobs: /proc/sysrq-trigger, /proc/sys, /sys, kallsyms", False, p_kernel_knobs,
           j_kernel_knobs),
    Attack("abstract_socket", "abstract AF_UNIX socket of a host process", False, p_abstract, j_abstract,
           d_abstract),
    Attack("signals", "signals to other processes: a pid sweep with kill(pid, 0), kill(parent), kill(-1)", False,
           p_signals, j_signals),
    Attack("memfd", "memfd_create and /dev/shm to store past the disk quota", False, p_memfd, j_memfd,
           limits={"disk_mb": 16, "memory_mb": 256}),
    Attack("cross_sandbox", "snooping on a concurrent program (/tmp, /dev/shm, /proc/*/root)", False, p_cross,
           j_cross, concurrent=True),
    Attack("links", "hard / symbolic links to host files, planting a link in a host directory", False, p_links,
           j_links),
    DaemonAttack("daemon", "setsid + double fork: a daemon that outlives the timeout", False,
                 lambda h: "", lambda o, h, s: (True, "")),
    Attack("fork_bomb", "fork bomb (bounded at 2000 by the attack itself)", False, p_forkbomb, j_forkbomb,
           limits={"max_procs": 32, "timeout_s": 5.0}),
    Attack("host_shm", "host shared memory: a secret in the host's /dev/shm", False, p_host_shm, j_found,
           d_host_shm),
    Attack("kernel_surface", "kernel attack surface: io_uring, userfaultfd, perf_event_open, bpf, keyrings, "
           "unshare, mount, kexec", False, p_kernel_surface, lambda o, h, s: _refused_unless(o)),
    Attack("tiocsti", "TIOCSTI: typing into the controlling terminal", False, p_tiocsti,
           lambda o, h, s: _refused_unless(o)),
    Attack("environ", "environment leak: the caller's variables via os.environ and /proc/*/environ", False,
           p_environ, j_found),
]


# ---- the .pth finding: needs an interpreter whose site-packages has a .pth naming a directory ------------------
@contextlib.contextmanager
def pth_venv(secret: str) -> Iterator[tuple[str, Path]]:
    """A throw-away venv (``--system-site-packages``) whose site-packages has ``extra.pth`` naming a directory
    outside the installation, in the system temp directory, holding ``answers.txt`` (``secret``); yields
    (its python, that directory). Removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="dsm-pth-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(base / "venv")],
                       check=True, capture_output=True)
        py = base / "venv" / "bin" / "python"
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              check=True, capture_output=True, text=True).stdout.strip()
        named = base / "named-by-pth"
        named.mkdir(mode=0o755)
        (named / "answers.txt").write_text(secret)
        (named / "answers.txt").chmod(0o644)
        base.chmod(0o755)
        Path(site, "extra.pth").write_text(str(named) + "\n")
        yield str(py), named
    finally:
        shutil.rmtree(base, ignore_errors=True)


def pth_trial(make_executor: Callable[[str], Any], secret: str) -> tuple[bool, str]:
    """Start an executor on the .pth venv's interpreter and read the named directory from inside."""
    with pth_venv(secret) as (py, named):
        ex = make_executor(py)
        try:
            r, _ = ex.run(f"import sys\nprint({str(named)!r} in sys.path)\n"
                          f"print(open({str(named / 'answers.txt')!r}).read())")
        finally:
            ex.close()
    if secret in r.stdout:
        return False, "the directory a .pth names was shown: its file read"
    return True, "not shown (" + (r.stderr.strip().splitlines() or ["?"])[-1][:60] + ")"


def markdown(result: dict) -> str:
    """The red-team table: one row per attack, a cell per sandbox and user (contained or not, and the evidence)."""
    names = {"this": "this sandbox", "bwrap": "bubblewrap"}
    runs = result.get("runs", [result])
    cols = [(c, i) for c in names for i, run in enumerate(runs)
            if c in run["sandboxes"] or any(c in r for r in run["rows"])]
    heads = [names[c] + (f" ({runs[i].get('user', '?')})" if len(runs) > 1 else "") for c, i in cols]
    out = ["| attack (technique) | " + " | ".join(heads) + " |", "|---|" + "---|" * len(cols)]
    rows = [{i: r for i, run in enumerate(runs) for r in run["rows"] if r["key"] == first["key"]}
            for first in runs[0]["rows"]]
    for by_run in rows:
        cells = []
        for c, i in cols:
            ok, ev = by_run.get(i, {}).get(c, (None, ""))
            cell = ev if ok is None else ("contained: " if ok else "**NOT contained**: ") + ev
            cells.append(cell.replace("|", "/"))
        r = by_run[0]
        tag = " (finding)" if r["finding"] else ""
        out.append(f"| `{r['key']}`{tag}: {r['technique']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bwrap", action="store_true", help="attack bubblewrap as well")
    ap.add_argument("--only", nargs="*", help="attack keys to run")
    ap.add_argument("--table", action="store_true", help="print results/sandbox_attacks.json as "
                    "docs/results/sandbox.md's "
                    "markdown table and exit")
    ap.add_argument("--out", type=Path, help="write the results here (default: benchmarks/results/sandbox_attacks.json)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="RUN", help="write these runs' results (e.g. root's and "
                    "an ordinary user's) side by side into benchmarks/results/sandbox_attacks.json and exit")
    args = ap.parse_args()
    results = ROOT / "benchmarks" / "results" / "sandbox_attacks.json"
    if args.table:
        print(markdown(json.loads(results.read_text())))
        return
    if args.merge:
        results.write_text(json.dumps({"runs": [json.loads(f.read_text()) for f in args.merge]}, indent=2) + "\n")
        print(markdown(json.loads(results.read_text())))
        return
    load0 = os.getloadavg()
    with host_setup() as host:
        runners: dict[str, Any] = {}
        from stages.core import sandbox

        runners["this"] = ExecutorRunner("this", sandbox.SandboxExecutor())
        report = runners["this"].ex.report()
        if args.bwrap:
            runners["bwrap"] = BwrapRunner()
        rows = []
        for a in ATTACKS:
            if args.only and a.key not in args.only:
                continue
            row = {"key": a.key, "technique": a.technique, "finding": a.finding}
            for name, r in runners.items():
                try:
                    row[name] = a.trial(r, host)
                except Exception as e:  # noqa: BLE001 - a broken trial is reported, not fatal
                    row[name] = (None, f"trial failed: {type(e).__name__}: {e}")
                print(f"{a.key:16} {name:9} {'contained' if row[name][0] else 'NOT contained':14} {row[name][1]}",
                      flush=True)
            rows.append(row)
        for r in runners.values():
            r.close()
        if not args.only or "pth" in args.only:
            row = {"key": "pth", "technique": "a .pth file that names a directory (editable / compat installs)",
                   "finding": True}
            row["this"] = pth_trial(lambda py: sandbox.SandboxExecutor(python=py, preload=["math"], prefork=1),
                                    host.secret)
            if args.bwrap:
                row["bwrap"] = (None, "n/a: bwrap shows what its command line binds")
            for name in runners:
                if name in row:
                    print(f"{'pth':16} {name:9} {'contained' if row[name][0] else 'NOT contained':14} {row[name][1]}")
            rows.append(row)
    import platform
    import pwd

    out = {"user": pwd.getpwuid(os.getuid()).pw_name, "uid": os.getuid(), "privileges": report["privileges"],
           "inactive": {m: report["reasons"].get(m) for m in report["inactive"]}, "kernel": platform.release(),
           "python": sys.executable, "load_average_start": [round(x, 2) for x in load0],
           "load_average_end": [round(x, 2) for x in os.getloadavg()],
           "sandboxes": list(runners),
           "bwrap": subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
           if args.bwrap else None, "limits": PIPELINE_LIMITS, "rows": rows}
    if args.out or not args.only:
        path = args.out or results
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

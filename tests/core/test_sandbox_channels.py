"""Channels from a sandboxed program to the host, and limits that broke ordinary programs (issue 21), one
section per channel. Each test here failed on the sandbox before issue 21 (a deny-list seccomp filter, a
read-only root without ``nodev``, one malloc arena per thread); the general hostile programs are in
test_sandbox_hostile.py.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import socket
import stat
import struct
import threading
import time
from pathlib import Path

import pytest

from benchmarks.sandbox_syscalls import MATH_PROGRAMS
from stages.core import _sandbox_zygote as zygote
from stages.core.sandbox import isolation_report, run_python
from tests.core.test_sandbox_hostile import (  # noqa: F401 - fixtures
    STRICT,
    assert_clean,
    exposed,
    run_exposed,
    victim_dir,
)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def active(mech: str) -> None:
    rep = isolation_report()
    if not rep["mechanisms"][mech]:
        pytest.skip(f"{mech} is not active here: {rep['reasons'].get(mech)}")


def run_alongside(code: str, host_action, run=run_python, **kw):
    """Run ``code`` (with ``run``) in a thread; call ``host_action()`` every 20 ms while it runs; return its
    result."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", run(code, **kw)))
    t.start()
    while t.is_alive():
        host_action()
        time.sleep(0.02)
    t.join()
    return box["r"]


ATTEMPT = """
import os
def attempt(name, fn):
    try:
        print(name, "ok", fn(), flush=True)
    except OSError as e:
        print(name, "refused", e.errno, flush=True)
"""


# ----------------------------------------------------------------------------------------------------------
# 1. The seccomp filter is an allow-list: a call that is not on it fails with EPERM, new calls included.
# Calls the list lacks, each with invalid arguments (so that they fail harmlessly where they do run).
UNLISTED = {
    "open_tree_attr": (467, (-1, 0, 0, 0, 0)), "open_tree": (428, (-1, 0, 0)), "fsopen": (430, (0, 0)),
    "io_uring_setup": (425, (0, 0)), "userfaultfd": (323, (0xFFFF,)), "bpf": (321, (-1, 0, 0)),
    "perf_event_open": (298, (0, 0, -1, -1, 0)), "statmount": (457, (0, 0, 0, 0)), "listmount": (458, (0, 0, 0, 0)),
    "landlock_create_ruleset": (444, (0, 0, 0xFFFF)), "cachestat": (451, (-1, 0, 0, 0)), "mseal": (462, (0, 0, 0xFFFF)),
    "file_getattr": (468, (-1, 0, 0, 0, 0)), "process_madvise": (440, (-1, 0, 0, 0, 0)),
}
CALL = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"""


def host_errno(nr: int, args: tuple[int, ...]) -> int:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    assert r < 0, f"syscall {nr}{args} succeeded on the host"
    return ctypes.get_errno()


def test_the_lists_syscall_numbers_are_the_kernel_headers_ones():
    headers = [p for p in ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h")
               if Path(p).is_file()]
    if not headers:
        pytest.skip("no x86_64 kernel headers (linux-libc-dev) here")
    table = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+) (\d+)", Path(headers[0]).read_text())}
    ours = {**zygote.allowed_syscalls(locks=True, notify=True), **zygote.checked_syscalls()}
    assert {name: (nr, table.get(name)) for name, nr in ours.items() if table.get(name) != nr} == {}


def test_calls_the_allow_list_lacks_fail_with_eperm_new_ones_included():
    active("seccomp")
    # the kernel has them (ENOSYS: it does not; EPERM: refused on the host too, so that proves nothing)
    present = {k: v for k, v in UNLISTED.items() if host_errno(*v) not in (errno.ENOSYS, errno.EPERM)}
    assert "open_tree" in present and "bpf" in present, present
    r = run_python(CALL + f"print(json.dumps({{k: call(nr, *a) for k, (nr, a) in {present!r}.items()}}))", **STRICT)
    assert r.ok, r.stderr
    assert json.loads(r.stdout) == {k: [-1, errno.EPERM] for k in present}
    assert_clean(r)


def test_every_number_off_the_list_fails_with_eperm():
    active("seccomp")
    listed = set(zygote.allowed_syscalls().values()) | set(zygote.checked_syscalls().values())
    # 335 / 336 (uretprobe, uprobe; Linux >= 6.11 / 6.16) bypass seccomp by design; called from anywhere
    # but the kernel's probe trampoline they kill the caller with SIGILL, so they are no way out
    off = sorted(set(range(512)) - listed - {335, 336})
    code = CALL + f"""
if call(467, -1, 0, 0, 0, 0) != (-1, 1):  # open_tree_attr: a deny-list lets it through; stop before the sweep
    raise SystemExit("not an allow-list")
bad = [(nr, call(nr, 0, 0, 0, 0, 0, 0)) for nr in {off!r}]
bad = [b for b in bad if b[1] != (-1, 1)]
print(json.dumps({{"bad": bad, "x32 getpid": call(0x40000000 + 39), "getpid": call(39)[0] > 0}}))
"""
    r = run_python(code, **STRICT)
    assert r.ok, r.stderr
    assert json.loads(r.stdout) == {"bad": [], "x32 getpid": [-1, errno.EPERM], "getpid": True}
    assert len(off) > 350
    assert_clean(r)


def test_argument_checked_calls():
    active("seccomp")
    code = CALL + """
import fcntl, mmap, os
page = mmap.mmap(-1, 4096)
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
name = ctypes.create_string_buffer(b"worker")
out = {
    "clone(CLONE_NEWUSER)": call(56, 0x10000000 | 17, 0, 0, 0, 0),  # SIGCHLD: would fork if allowed
    "ioctl(TIOCSTI)": call(16, 1, 0x5412, ctypes.addressof(name)),
    "ioctl(TCGETS) on a pipe": call(16, 1, 0x5401, ctypes.addressof(ctypes.create_string_buffer(64))),
    "prctl(PR_SET_DUMPABLE)": call(157, 4, 0),
    "prctl(PR_SET_NAME)": call(157, 15, ctypes.addressof(name)),
    "madvise(MADV_MERGEABLE)": call(28, addr, 4096, 12),
    "madvise(MADV_DONTNEED)": call(28, addr, 4096, 4),
    "fcntl(F_SETOWN)": call(72, 1, 8, os.getpid()),
    "fcntl(F_GETFL)": call(72, 1, 3)[0] >= 0,
    "kill(1, 0)": call(62, 1, 0),  # the sandbox's monitor (the program's own uid without root)
    "tgkill(1, 1, 0)": call(234, 1, 1, 0),
    "kill(self, 0)": call(62, os.getpid(), 0),
}
print(json.dumps(out))
"""
    r = run_python(code, **STRICT)
    assert r.ok, r.stderr
    eperm = [-1, errno.EPERM]
    assert json.loads(r.stdout) == {
        "clone(CLONE_NEWUSER)": eperm, "ioctl(TIOCSTI)": eperm, "ioctl(TCGETS) on a pipe": [-1, errno.ENOTTY],
        "prctl(PR_SET_DUMPABLE)": eperm, "prctl(PR_SET_NAME)": [0, 0], "madvise(MADV_MERGEABLE)": eperm,
        "madvise(MADV_DONTNEED)": [0, 0], "fcntl(F_SETOWN)": eperm, "fcntl(F_GETFL)": True, "kill(1, 0)": eperm,
        "tgkill(1, 1, 0)": eperm, "kill(self, 0)": [0, 0]}
    assert_clean(r)


def test_typical_math_programs_still_run():
    """The programs benchmarks/sandbox_syscalls.py measured the list on: numpy, sympy, scipy, mpmath,
    networkx, pandas, the math standard library, threads, process pools, asyncio, signals, files."""
    failed = {}
    for name, code in MATH_PROGRAMS.items():
        r = run_python(code, timeout_s=60, memory_mb=1024)
        expected_error = name == "errors_and_input"  # raises ValueError('bad') on purpose, at the end
        if r.sandbox_error or (r.ok == expected_error) or (expected_error and "ValueError: bad" not in r.stderr):
            failed[name] = (r.status, r.stderr[-300:])
    assert failed == {}


# ----------------------------------------------------------------------------------------------------------
# 2. No datagram to a host AF_UNIX socket: socketpair only for stream / seqpacket, sendto without an
# address, no sendmsg. (Seccomp blocks socket() and connect(); read-only mounts do not apply to sockets.)
def test_no_datagram_reaches_a_host_unix_socket(victim_dir, run_exposed):  # noqa: F811
    active("unix_stream_only")
    path = str(victim_dir / "host.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.setblocking(False)
    received: list[bytes] = []

    def drain() -> None:
        try:
            while True:
                received.append(listener.recv(4096))
        except BlockingIOError:
            pass

    code = ATTEMPT + f"""
import ctypes, socket
path = {path!r}
def dgram_pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    return a.sendto(b"via a datagram socketpair", path)
attempt("dgram socketpair", dgram_pair)
libc = ctypes.CDLL(None, use_errno=True)
def raw_pair(family, type_):
    fds = (ctypes.c_int * 2)()
    if libc.socketpair(family, type_, 0, fds) != 0:
        raise OSError(ctypes.get_errno(), "socketpair")
    return "pair"
attempt("raw dgram socketpair", lambda: raw_pair(1, 2 | 0o2000000))
attempt("inet socketpair", lambda: raw_pair(2, 1))
s, t = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
attempt("stream sendto with address", lambda: s.sendto(b"via sendto", path))
q, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
attempt("seqpacket sendmsg with address", lambda: q.sendmsg([b"via sendmsg"], [], 0, path))
attempt("seqpacket sendto with address", lambda: q.sendto(b"via seqpacket sendto", path))
s.sendall(b"stream"); q.send(b"seqpacket")
print("pairs work", t.recv(16), w.recv(16))
"""
    try:
        r = run_alongside(code, drain, run_exposed, **STRICT)
        time.sleep(0.1)
        drain()
    finally:
        listener.close()
    assert r.ok, r.stderr
    assert received == []
    for name in ("dgram socketpair", "raw dgram socketpair", "inet socketpair", "stream sendto with address",
                 "seqpacket sendmsg with address", "seqpacket sendto with address"):
        assert f"{name} refused 1\n" in r.stdout, r.stdout
    assert "pairs work b'stream' b'seqpacket'" in r.stdout
    assert_clean(r)


# ----------------------------------------------------------------------------------------------------------
# 3. No lock on a host file, no file-change notification, no device node outside the minimal /dev.
FLOCK_RD = struct.pack("hh4xqqi4x", fcntl.F_RDLCK, 0, 0, 0, 0)  # struct flock (x86_64 layout)
FLOCK_WR = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0)
FLOCK_UN = struct.pack("hh4xqqi4x", fcntl.F_UNLCK, 0, 0, 0, 0)


def test_a_program_cannot_hold_a_lock_that_blocks_the_host(victim_dir, run_exposed):  # noqa: F811
    active("no_file_locks")
    target = victim_dir / "params.yaml"  # world-readable, not writable: like the project's params.yaml
    target.write_text("seed: 0\n")
    target.chmod(0o644)
    code = ATTEMPT + f"""
import fcntl, struct, time
fd = os.open({str(target)!r}, os.O_RDONLY)
rd = {FLOCK_RD!r}
attempt("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX))
attempt("lockf", lambda: fcntl.lockf(fd, fcntl.LOCK_SH))
attempt("F_SETLKW", lambda: fcntl.fcntl(fd, fcntl.F_SETLKW, rd))
attempt("F_OFD_SETLKW", lambda: fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, rd))
attempt("F_GETLK", lambda: fcntl.fcntl(fd, fcntl.F_GETLK, rd))
attempt("F_SETLEASE", lambda: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK))
time.sleep(1.5)  # holding whatever it got
"""
    hfd = os.open(target, os.O_RDWR)
    blocked: set[str] = set()

    def host_takes_locks() -> None:  # as a DVC lock, sqlite or a params reader would, without waiting
        for name, lock, unlock in (
            ("flock", lambda: fcntl.flock(hfd, fcntl.LOCK_EX | fcntl.LOCK_NB), lambda: fcntl.flock(hfd, fcntl.LOCK_UN)),
            ("posix", lambda: fcntl.fcntl(hfd, fcntl.F_SETLK, FLOCK_WR), lambda: fcntl.fcntl(hfd, fcntl.F_SETLK, FLOCK_UN)),
            ("ofd", lambda: fcntl.fcntl(hfd, fcntl.F_OFD_SETLK, FLOCK_WR),
             lambda: fcntl.fcntl(hfd, fcntl.F_OFD_SETLK, FLOCK_UN)),
        ):
            try:
                lock()
            except OSError:
                blocked.add(name)
            else:
                unlock()

    try:
        r = run_alongside(code, host_takes_locks, run_exposed, **STRICT)
    finally:
        os.close(hfd)
    assert r.ok, r.stderr
    assert blocked == set()
    for name in ("flock", "lockf", "F_SETLKW", "F_OFD_SETLKW", "F_GETLK", "F_SETLEASE"):
        assert f"{name} refused 1\n" in r.stdout, r.stdout
    assert_clean(r)


def test_no_notification_of_host_file_changes(victim_dir, run_exposed):  # noqa: F811
    active("no_fs_notify")
    watched = victim_dir / "watched"
    watched.mkdir(mode=0o755)
    code = ATTEMPT + f"""
import ctypes, fcntl, select, signal, time
libc = ctypes.CDLL(None, use_errno=True)
def checked(r):
    if r < 0:
        raise OSError(ctypes.get_errno(), "")
    return r
def inotify():
    fd = checked(libc.inotify_init1(0))
    checked(libc.inotify_add_watch(fd, {str(watched).encode()!r}, 0xFFF))
    return "event" if select.select([fd], [], [], 3)[0] else "no event"
attempt("inotify", inotify)
attempt("fanotify", lambda: checked(libc.fanotify_init(0x200, os.O_RDONLY)))  # FAN_REPORT_FID: unprivileged
signal.signal(signal.SIGIO, lambda *a: print("dnotify signal", flush=True))
dfd = os.open({str(watched)!r}, os.O_RDONLY)
attempt("F_NOTIFY", lambda: fcntl.fcntl(dfd, fcntl.F_NOTIFY, fcntl.DN_CREATE | fcntl.DN_MODIFY | fcntl.DN_MULTISHOT))
time.sleep(0.5)
"""
    n = [0]

    def host_touches_files() -> None:
        n[0] += 1
        (watched / f"f{n[0] % 5}").write_text(str(n[0]))

    r = run_alongside(code, host_touches_files, run_exposed, **STRICT)
    assert r.ok, r.stderr
    for name in ("inotify", "fanotify", "F_NOTIFY"):
        assert f"{name} refused 1\n" in r.stdout, r.stdout
    assert "event" not in r.stdout and "dnotify signal" not in r.stdout
    assert_clean(r)


DEV_NODES = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}


def test_root_is_nodev_and_a_host_device_node_cannot_be_opened(victim_dir, run_exposed):  # noqa: F811
    active("nodev")
    node = victim_dir / "null-copy"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
        node.chmod(0o666)
        with open(node, "wb") as f:
            f.write(b"x")
    except OSError as e:
        pytest.skip(f"cannot make a device node on the host here: {e}")
    code = ATTEMPT + f"""
without = [line.split()[4] for line in open("/proc/self/mountinfo") if "nodev" not in line.split()[5].split(",")]
print("without nodev", sorted(without))
attempt("open host device node", lambda: open({str(node)!r}, "wb").write(b"x"))
attempt("open /dev/null", lambda: open("/dev/null", "wb").write(b"x"))
"""
    r = run_exposed(code, **STRICT)
    assert r.ok, r.stderr
    without = eval(r.stdout.split("without nodev ", 1)[1].split("\n")[0])  # noqa: S307 - a list literal we printed
    assert set(without) <= DEV_NODES, without
    assert f"open host device node refused {errno.EACCES}\n" in r.stdout, r.stdout
    assert "open /dev/null ok 1\n" in r.stdout
    assert_clean(r)


# ----------------------------------------------------------------------------------------------------------
# 4. Threads: one malloc arena for all threads, so a thread pool fits in memory_mb; the limit still holds.
def test_32_threads_start_at_512_mb_and_memory_is_still_capped():
    code = """
import threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
go, done = threading.Event(), threading.Barrier(33)
errors = []
def work(i):
    go.wait()
    try:
        block = bytearray(32 << 20)  # 32 threads x 32 MB at once: over memory_mb in all
    except MemoryError:
        errors.append(i)
    done.wait()
threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
for t in threads:
    t.start()
print("started", sum(t.is_alive() for t in threads))
try:
    big = bytearray(600 << 20)
    print("allocated 600 MB")
except MemoryError:
    print("600 MB: MemoryError")
go.set()
done.wait()
for t in threads:
    t.join()
print("threads that hit MemoryError", len(errors) > 0)
with ThreadPoolExecutor(32) as pool:
    print("pool", sum(pool.map(lambda i: float(np.ones(1000).sum()), range(64))))
"""
    r = run_python(code, memory_mb=512, max_procs=64, timeout_s=30)  # max_procs counts threads too
    assert r.ok, r.stderr
    assert r.stdout == ("started 32\n600 MB: MemoryError\nthreads that hit MemoryError True\npool 64000.0\n")
    assert_clean(r)

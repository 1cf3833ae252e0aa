"""The privileged half of the code sandbox: a zygote process that forks one fresh sandbox per program.

Run by :mod:`stages.core.sandbox` as ``python -I -B _sandbox_zygote.py <config-json>`` with a
``SOCK_SEQPACKET`` control socket on the fd named in the config. Standard library only, single-threaded
(it forks, so it must never have other threads), and it never sees a program or its output: programs go
straight from the client to the sandbox through pipes whose ends are passed to the client over the control
socket (``SCM_RIGHTS``). So the zygote's memory, which every sandbox inherits, holds nothing of any other
program.

Process tree of one sandbox (``Z`` = this zygote, root, host namespaces; without root, Z is PID 1 of a PID namespace of
its own inside a user namespace that maps the caller's uid, whose parent only waits for it: :func:`enter_user_namespace`,
and U leaves for a user namespace of its own with no capability: :func:`own_user_namespace`)::

    Z --fork--> I  PID 1 of a new PID namespace (Z unshares CLONE_NEWPID for that one fork, then setns back):
                   joins the sandbox's cgroups, unshares mount/net/ipc/uts/cgroup namespaces, pivot_roots into the
                   allow-list root Z built at start (Zygote._build_template), mounts its private /tmp and /proc;
                   then monitors: when U ends, or when the client writes to or
                   closes the "life" pipe (timeout, client gone), it SIGKILLs every other process of the
                   namespace (double-forked daemons included), reaps them all and reports ``D``.
      I --fork--> U  waits (pre-forked) for the request on a pipe, applies limits, drops to a fresh
                     unprivileged uid, sets no_new_privs and the seccomp allow-list, clears the
                     environment, then runs the program as ``__main__``.

If I itself dies (the zygote died: PR_SET_PDEATHSIG), the kernel kills the whole namespace.

Protocol (status pipe, written by P/I/U, read by the client): text lines ``E <mechanism> <message>`` for a
setup failure (the program is NOT run), ``X <wait-status>`` when U ended, ``D`` when every process of the
program is gone (``W <dir>``: a host working directory to remove, without a mount namespace). Control socket (client -> Z):
``F`` = give me a sandbox, answered by a JSON header plus the fds
``[req_w, out_r, err_r, stat_r, life_w, res_r]``; ``Q`` = quit. The first message from Z is a JSON hello
with the isolation report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import json
import math
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback

# ----------------------------------------------------------------------------------------------------------
# Kernel constants (Linux uapi).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NS_FLAGS = {
    "mountns": CLONE_NEWNS,
    "netns": CLONE_NEWNET,
    "ipcns": CLONE_NEWIPC,
    "utsns": CLONE_NEWUTS,
    "cgroupns": CLONE_NEWCGROUP,
    "pidns": CLONE_NEWPID,
}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
AT_FDCWD, AT_EMPTY_PATH, AT_RECURSIVE = -100, 0x1000, 0x8000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
FSOPEN_CLOEXEC, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE, FSMOUNT_CLOEXEC = 1, 1, 6, 1
# Syscalls numbered >= 424 are the same on every architecture.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT, SYS_MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 1, 22, 38, 39
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, _LINUX_CAPABILITY_VERSION_3 = 24, 47, 4, 0x20080522
SECCOMP_MODE_FILTER = 2
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "AMD64": 155, "aarch64": 41, "arm64": 41}.get(platform.machine())

# Mechanisms, in the order of the report. "uid" = drop to a fresh unprivileged uid per sandbox.
MECHANISMS = (
    "uid", "no_new_privs", "seccomp", "unix_stream_only", "no_file_locks", "no_fs_notify", "pidns", "netns",
    "mountns", "ipcns", "utsns", "cgroupns", "allowlist_fs", "ro_root", "nodev", "private_tmp", "shared_quota",
    "inode_cap", "minimal_dev", "proc", "proc_hidepid", "cgroup_pids", "cgroup_memory", "cpu_limit", "rlimits",
    "empty_env", "fresh_process",
)
# What a mechanism needs: disabling the key disables the values.
DEPENDS = {
    "mountns": ("allowlist_fs", "ro_root", "private_tmp", "shared_quota", "minimal_dev", "proc"),
    "allowlist_fs": ("minimal_dev", "nodev"),
    "ro_root": ("nodev",),
    "private_tmp": ("shared_quota", "inode_cap"),
    "pidns": ("proc",),
    "proc": ("proc_hidepid",),
    "no_new_privs": ("seccomp",),
    "seccomp": ("unix_stream_only", "no_file_locks", "no_fs_notify"),
}
M_ARENA_MAX = -8  # mallopt
THREAD_STACK_MAX = 8 << 20  # default stack of a new thread, at most (glibc takes RLIMIT_STACK's soft limit)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)


class SetupError(Exception):
    """A sandbox mechanism could not be set up; carries the mechanism's name."""

    def __init__(self, mech: str, msg: str) -> None:
        super().__init__(f"{mech}: {msg}")
        self.mech = mech
        self.msg = msg


def _check(ret: int, mech: str, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise SetupError(mech, f"{what} failed: {os.strerror(e)} (errno {e})")
    return ret


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(mech: str, src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(libc.mount(_b(src), _b(target), _b(fstype), flags, _b(data)), mech, f"mount {target}")


def open_tree(mech: str, path: str, flags: int, dirfd: int = AT_FDCWD) -> int:
    return _check(libc.syscall(SYS_OPEN_TREE, dirfd, _b(path), flags), mech, f"open_tree {path}")


def move_mount(mech: str, fd: int, target: str) -> None:
    _check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, _b(target), MOVE_MOUNT_F_EMPTY_PATH), mech,
           f"move_mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr(mech: str, dirfd: int, path: str, flags: int, attr_set: int) -> None:
    attr = _MountAttr(attr_set, 0, 0, 0)
    _check(libc.syscall(SYS_MOUNT_SETATTR, dirfd, _b(path), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
           mech, f"mount_setattr {path or dirfd}")


def prctl(mech: str, option: int, arg2: int = 0, arg3: int = 0) -> int:
    return _check(libc.prctl(option, arg2, arg3, 0, 0), mech, f"prctl({option})")


# ----------------------------------------------------------------------------------------------------------
# seccomp: an allow-list filter (x86_64 only; on another architecture the mechanism is reported inactive,
# with its reason, and none of the restrictions below apply). A system call that is not on the list fails
# with EPERM (Python raises PermissionError), whatever its number: calls newer than this list included.
# clone3 fails with ENOSYS instead, so that glibc falls back to clone, whose flags the filter can read. A
# foreign architecture's calls kill the process; x32-ABI calls fail with EPERM.
#
# The list is what CPython, numpy, scipy, sympy and the math standard library really call, measured by
# benchmarks/sandbox_syscalls.py (strace of the sandboxes over the tests' programs, the PAL / GSM-Hard and
# ToRA programs and typical model-written math programs; results/sandbox_syscalls.json), plus, under "not
# measured", the few calls that the same functions make with another glibc version, or that a common
# standard-library function makes.
_X86_64_ALLOW: dict[str, dict[str, int]] = {
    # the program's own files and pipes (the host is mounted read-only; the working directory is private)
    # (pwrite64, fdatasync: sqlite, measured with no_file_locks disabled)
    # not measured: pipe (glibc's pipe()), dup, dup3 (os.dup2(inheritable=False)), readv, writev (os.readv /
    # writev, C stdio), ftruncate (file.truncate()), copy_file_range (shutil, Python >= 3.14)
    "file descriptors": {
        "read": 0, "write": 1, "close": 3, "fstat": 5, "lseek": 8, "pread64": 17, "pwrite64": 18, "readv": 19,
        "writev": 20, "pipe": 22, "dup": 32, "dup2": 33, "sendfile": 40, "fsync": 74, "fdatasync": 75,
        "ftruncate": 77, "getdents64": 217, "dup3": 292, "pipe2": 293, "copy_file_range": 326, "close_range": 436,
    },
    # file names (listxattr: shutil.copy2 gives up only on ENOTSUP/ENODATA/EINVAL; setting attributes is denied)
    # not measured: stat, lstat (glibc < 2.33), access, faccessat2 (os.access), chdir, symlink, umask,
    # getxattr, lgetxattr, llistxattr (shutil.copy2 of a file with attributes, of a symlink)
    "paths": {
        "open": 2, "stat": 4, "lstat": 6, "access": 21, "getcwd": 79, "chdir": 80, "rename": 82, "mkdir": 83,
        "rmdir": 84, "link": 86, "unlink": 87, "symlink": 88, "readlink": 89, "chmod": 90, "umask": 95,
        "statfs": 137, "getxattr": 191, "lgetxattr": 192, "listxattr": 194, "llistxattr": 195, "openat": 257,
        "newfstatat": 262, "unlinkat": 263, "readlinkat": 267, "utimensat": 280, "faccessat2": 439,
    },
    # memory (mbind: OpenBLAS's buffers; madvise is argument-checked below)
    # not measured: mremap (glibc's realloc() of large blocks)
    "memory": {"mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "mremap": 25, "msync": 26, "mbind": 237},
    # processes and threads (clone and prctl are argument-checked below; vfork: _posixsubprocess)
    # not measured: sched_yield (OpenBLAS's waiting threads)
    "processes and threads": {
        "sched_yield": 24, "vfork": 58, "exit": 60, "wait4": 61, "futex": 202, "sched_getaffinity": 204,
        "exit_group": 231, "set_robust_list": 273, "rseq": 334,
    },
    # identity, limits and machine facts (the program's own; setsid: daemonising code)
    # not measured: getegid
    "identity and limits": {
        "getpid": 39, "uname": 63, "getrusage": 98, "sysinfo": 99, "times": 100, "getuid": 102, "getgid": 104,
        "geteuid": 107, "getegid": 108, "getppid": 110, "setsid": 112, "getgroups": 115, "gettid": 186,
        "prlimit64": 302,
    },
    # signals and timers (kill and tgkill are argument-checked below: the uid or the user namespace and the PID
    # namespace confine them to the program's own processes)
    # not measured: restart_syscall (the kernel resumes an interrupted sleep with it), tgkill (abort(),
    # raise(), signal.pthread_kill), pause, rt_sigtimedwait (signal.pause / sigwait / sigtimedwait)
    "signals": {
        "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "pause": 34, "alarm": 37, "setitimer": 38,
        "rt_sigtimedwait": 128, "sigaltstack": 131, "restart_syscall": 219,
    },
    # clocks (mostly answered by the vDSO without a system call; CPU-time clocks always make one)
    # not measured: nanosleep (older glibc's sleep()), gettimeofday, time (without the vDSO), clock_getres
    "time": {"nanosleep": 35, "gettimeofday": 96, "time": 201, "clock_gettime": 228, "clock_getres": 229,
             "clock_nanosleep": 230},
    # waiting on file descriptors (asyncio, selectors, subprocess, multiprocessing)
    # not measured: select (older glibc's select())
    "polling": {"poll": 7, "select": 23, "epoll_wait": 232, "epoll_ctl": 233, "pselect6": 270, "epoll_create1": 291},
    # the ends of a socketpair (socketpair and sendto are argument-checked below; no socket(), connect(),
    # bind(), accept(), sendmsg())
    # not measured: shutdown (socket.shutdown), getpeername (asyncio's transports)
    "socketpair ends": {"recvfrom": 45, "shutdown": 48, "getsockname": 51, "getpeername": 52},
    "randomness": {"getrandom": 318},
}
# Checked arguments (the kernel reads these arguments as 32-bit ints: the filter compares the low half).
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_SOCKETPAIR, _X86_64_SENDTO = 56, 435, 53, 44
_X86_64_FCNTL, _X86_64_IOCTL, _X86_64_PRCTL, _X86_64_MADVISE = 72, 16, 157, 28
_X86_64_KILL, _X86_64_TGKILL = 62, 234  # not to PID 1, the sandbox's monitor (of the program's own uid without root)
AF_UNIX, SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 1, 5, 0xF
# fcntl: descriptor and status flags, duplication, pipe size. Not: record / OFD locks and leases (a lock
# on a world-readable host file blocks host processes), F_NOTIFY (directory change signals), F_SETOWN.
_FCNTL_ALLOW = {"F_DUPFD": 0, "F_GETFD": 1, "F_SETFD": 2, "F_GETFL": 3, "F_SETFL": 4, "F_DUPFD_CLOEXEC": 1030,
                "F_GETPIPE_SZ": 1032}
_FCNTL_LOCKS = {"F_GETLK": 5, "F_SETLK": 6, "F_SETLKW": 7, "F_OFD_GETLK": 36, "F_OFD_SETLK": 37,
                "F_OFD_SETLKW": 38, "F_SETLEASE": 1024, "F_GETLEASE": 1025}
_FCNTL_NOTIFY = {"F_NOTIFY": 1026}
# ioctl: the terminal queries isatty() and get_terminal_size() make (stdio are pipes: ENOTTY) and the
# close-on-exec / non-blocking / bytes-available requests. Not: TIOCSTI, file-system or device requests.
_IOCTL_ALLOW = {"TCGETS": 0x5401, "TIOCGWINSZ": 0x5413, "FIONREAD": 0x541B, "FIONBIO": 0x5421,
                "FIONCLEX": 0x5450, "FIOCLEX": 0x5451}
# prctl: naming threads and mappings, and libcap's start-up probe of the bounding set (read only).
_PRCTL_ALLOW = {"PR_SET_NAME": 15, "PR_GET_NAME": 16, "PR_CAPBSET_READ": 23, "PR_SET_VMA": 0x53564D41}
# madvise: every advice but KSM merging (a memory-deduplication timing channel) and the hwpoison ones (>= 100)
_MADV_DENY = {"MADV_MERGEABLE": 12, "MADV_UNMERGEABLE": 13}
# Sub-mechanisms of the filter (each can be disabled on its own, e.g. "no_file_locks" for sqlite files).
_X86_64_LOCKS = {"flock": 73}
_X86_64_NOTIFY = {"inotify_init": 253, "inotify_add_watch": 254, "inotify_rm_watch": 255, "inotify_init1": 294,
                  "fanotify_init": 300, "fanotify_mark": 301}
# Not on the list on purpose (a few of the calls programs tried; every other call is denied as well).
DENIED_ON_PURPOSE = {
    "socket": "no network, no host AF_UNIX socket", "connect": "no host socket", "bind": "no host socket",
    "sendmsg": "no destination address to check", "recvmsg": "pairs with sendmsg",
    "execve": "no other binary, no shell", "execveat": "no other binary, no shell",
    "flock": "no lock on host files (no_file_locks)", "inotify_init1": "no file-change events (no_fs_notify)",
    "inotify_init": "no file-change events", "inotify_add_watch": "no file-change events",
    "fanotify_init": "no file-change events", "ptrace": "no debugging of other processes",
    "mknod": "no device nodes", "mknodat": "no device nodes", "mincore": "page-cache residency of host files",
    "preadv2": "RWF_NOWAIT reveals the page cache", "memfd_create": "memory outside the tmpfs quota",
    "sync": "host-wide I/O", "syncfs": "host-wide I/O", "unshare": "no namespaces", "setns": "no namespaces",
    "mount": "no mounts", "io_uring_setup": "kernel surface", "bpf": "kernel surface", "userfaultfd": "kernel surface",
    "perf_event_open": "kernel surface", "open_tree": "no mounts", "fsopen": "no mounts",
}
AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_NS_CLONE_MASK = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
SECCOMP_SUBMECHANISMS = ("unix_stream_only", "no_file_locks", "no_fs_notify")


def allowed_syscalls(*, locks: bool = False, notify: bool = False) -> dict[str, int]:
    """Every unconditionally allowed x86_64 system call, ``{name: number}`` (``locks`` / ``notify``: with
    the sub-mechanism ``no_file_locks`` / ``no_fs_notify`` disabled)."""
    out = {name: nr for group in _X86_64_ALLOW.values() for name, nr in group.items()}
    if locks:
        out.update(_X86_64_LOCKS)
    if notify:
        out.update(_X86_64_NOTIFY)
    return out


def checked_syscalls() -> dict[str, int]:
    """The system calls the filter allows depending on their arguments (clone3: always ENOSYS)."""
    return {"clone": _X86_64_CLONE, "clone3": _X86_64_CLONE3, "socketpair": _X86_64_SOCKETPAIR,
            "sendto": _X86_64_SENDTO, "fcntl": _X86_64_FCNTL, "ioctl": _X86_64_IOCTL, "prctl": _X86_64_PRCTL,
            "madvise": _X86_64_MADVISE, "kill": _X86_64_KILL, "tgkill": _X86_64_TGKILL}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_supported() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


# classic BPF: A = 32-bit word at offset k of struct seccomp_data (nr @0, arch @4, args[i] @16 + 8 i)
_LD, _AND, _JEQ, _JGE, _JSET, _RET = 0x20, 0x54, 0x15, 0x35, 0x45, 0x06
_ALLOW, _EPERM, _ENOSYS = ("ret", SECCOMP_RET_ALLOW), ("ret", SECCOMP_RET_ERRNO | 1), ("ret", SECCOMP_RET_ERRNO | 38)


def _arg_lo(i: int) -> tuple[int, int, int, int]:
    return (_LD, 0, 0, 16 + 8 * i)


def _arg_hi(i: int) -> tuple[int, int, int, int]:
    return (_LD, 0, 0, 20 + 8 * i)


def _one_of(values: list[int]) -> list:
    """A in ``values`` -> allow, else EPERM."""
    n = len(values)
    return [(_JEQ, n - i, 0, v) for i, v in enumerate(values)] + [_EPERM, _ALLOW]


def build_seccomp(*, unix_stream_only: bool = True, no_file_locks: bool = True,
                  no_fs_notify: bool = True, allow_exec: bool = False) -> tuple[_SockFprog, ctypes.Array]:
    """The allow-list filter program (built once in the zygote; sandboxes only install it). ``allow_exec``: also
    what starting a new interpreter needs (execve, arch_prctl, set_tid_address): for a launcher such as
    bubblewrap, which installs the filter before it execs the program (benchmarks/sandbox_attacks.py)."""
    if not seccomp_supported():
        raise SetupError("seccomp", f"no syscall table for {platform.machine()}")
    fcntl_ok = dict(_FCNTL_ALLOW)
    if not no_file_locks:
        fcntl_ok.update(_FCNTL_LOCKS)
    if not no_fs_notify:
        fcntl_ok.update(_FCNTL_NOTIFY)
    checked: dict[int, list] = {
        _X86_64_CLONE3: [_ENOSYS],
        _X86_64_CLONE: [_arg_lo(0), (_JSET, 0, 1, _NS_CLONE_MASK), _EPERM, _ALLOW],
        _X86_64_FCNTL: [_arg_lo(1), *_one_of(sorted(fcntl_ok.values()))],
        _X86_64_IOCTL: [_arg_lo(1), *_one_of(sorted(_IOCTL_ALLOW.values()))],
        _X86_64_PRCTL: [_arg_lo(0), *_one_of(sorted(_PRCTL_ALLOW.values()))],
        _X86_64_MADVISE: [_arg_lo(2), *[(_JEQ, 2 - i, 0, v) for i, v in enumerate(sorted(_MADV_DENY.values()))],
                          (_JGE, 0, 1, 100), _EPERM, _ALLOW],
        _X86_64_KILL: [_arg_lo(0), (_JEQ, 0, 1, 1), _EPERM, _ALLOW],
        _X86_64_TGKILL: [_arg_lo(0), (_JEQ, 0, 1, 1), _EPERM, _ALLOW],
    }
    if unix_stream_only:
        # socketpair(AF_UNIX, SOCK_STREAM | SOCK_SEQPACKET [| flags]): no datagram end, whose sendto() with
        # an address would reach any host AF_UNIX datagram socket the program can see
        checked[_X86_64_SOCKETPAIR] = [_arg_lo(0), (_JEQ, 1, 0, AF_UNIX), _EPERM, _arg_lo(1),
                                       (_AND, 0, 0, SOCK_TYPE_MASK), *_one_of([SOCK_STREAM, SOCK_SEQPACKET])]
        # sendto(fd, buf, len, flags, dest_addr = NULL, addrlen): no destination address (64-bit pointer)
        checked[_X86_64_SENDTO] = [_arg_lo(4), (_JEQ, 0, 2, 0), _arg_hi(4), (_JEQ, 1, 0, 0), _EPERM, _ALLOW]
    allowed = allowed_syscalls(locks=not no_file_locks, notify=not no_fs_notify)
    if not unix_stream_only:
        allowed.update({"socketpair": _X86_64_SOCKETPAIR, "sendto": _X86_64_SENDTO})
    if allow_exec:
        allowed.update({"execve": 59, "arch_prctl": 158, "set_tid_address": 218})
    prog: list = [
        (_LD, 0, 0, 4),  # A = arch
        (_JEQ, 1, 0, AUDIT_ARCH_X86_64),
        ("ret", SECCOMP_RET_KILL_PROCESS),
        (_LD, 0, 0, 0),  # A = syscall number
        (_JGE, 0, 1, 0x40000000),  # x32 ABI
        _EPERM,
    ]
    for nr, block in checked.items():  # each block ends in a return on every path
        prog += [(_JEQ, 0, len(block), nr), *block]
    for nr in sorted(set(allowed.values())):  # the kernel caches these verdicts (no filter run per call)
        prog += [(_JEQ, 0, 1, nr), _ALLOW]
    prog.append(_EPERM)
    ins = [_SockFilter(_RET, 0, 0, i[1]) if i[0] == "ret" else _SockFilter(*i) for i in prog]
    arr = (_SockFilter * len(ins))(*ins)
    return _SockFprog(len(ins), arr), arr


def install_seccomp(fprog: _SockFprog) -> None:
    """Install a filter from :func:`build_seccomp` on the calling process (needs no_new_privs first)."""
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp",
           "prctl(PR_SET_SECCOMP)")


# ----------------------------------------------------------------------------------------------------------
# Without root: a user namespace (what bubblewrap does; no setuid helper, no subordinate uids).
def _userns_hint() -> str:
    """Why an unprivileged user namespace may be refused here, and the fix."""
    for knob, bad, fix in (("kernel/unprivileged_userns_clone", "0", "sysctl kernel.unprivileged_userns_clone=1"),
                           ("user/max_user_namespaces", "0", "sysctl user.max_user_namespaces=10000"),
                           ("kernel/apparmor_restrict_unprivileged_userns", "1",
                            "sysctl kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that "
                            "allows userns for this python")):
        try:
            with open(f"/proc/sys/{knob}") as f:
                if f.read().strip() == bad:
                    return f"{knob.replace('/', '.')} is {bad}: {fix} (or run as root)"
        except OSError:
            pass
    return "allow unprivileged user namespaces (or run as root)"


def enter_user_namespace(ctl_fd: int) -> str | None:
    """Become PID 1 of a new PID namespace inside a new user namespace that maps only the caller's uid and gid (to
    themselves) and holds every capability *there*: what the zygote needs to build sandboxes (mount, PID, network,
    IPC, UTS and cgroup namespaces, the allow-list root) without root. This process forks; the parent only waits for
    the child (the zygote), which dies with it (PR_SET_PDEATHSIG), and exits with its status. A PID namespace of
    the zygote's own is what lets it return there (``setns``) after forking each sandbox into a fresh one.
    Returns None in the zygote, or why no user namespace could be made (then nothing changed)."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return f"unshare(CLONE_NEWUSER) failed: {os.strerror(ctypes.get_errno())}; {_userns_hint()}"
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as e:  # (not seen: a single mapping of one's own ids is always allowed)
        return f"writing /proc/self/{name} of a new user namespace: {e}"
    pid = os.fork()
    if pid:
        os.close(ctl_fd)  # the client sees the zygote's end of the control socket only
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
            except InterruptedError:
                continue
    prctl("fresh_process", PR_SET_PDEATHSIG, signal.SIGKILL)
    return None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def own_user_namespace() -> None:
    """(The program's process, in a zygote without root.) A user namespace of its own, mapping its uid to itself,
    so that RLIMIT_NPROC counts this program's processes only (the kernel counts per user namespace and uid), then
    no capability left in it: an empty bounding set, no ambient, effective, permitted or inheritable ones."""
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER), "rlimits", "unshare(CLONE_NEWUSER) of the program")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            raise SetupError("uid", f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data), "uid", "capset")
    with open("/proc/self/status") as f:
        caps = {k: int(v, 16) for k, _, v in (ln.partition(":") for ln in f) if k in ("CapEff", "CapPrm", "CapBnd")}
    if any(caps.values()) or len(caps) != 3:
        raise SetupError("uid", f"capabilities left: {caps}")


# ----------------------------------------------------------------------------------------------------------
# Helpers.
def close_fds_except(keep: set[int]) -> None:
    """Close every fd of this process except ``keep`` (walks /proc/self/fd; falls back to a range)."""
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def read_exact(fd: int, n: int) -> bytes:
    """Read exactly ``n`` bytes (fewer only at EOF)."""
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def cg_limit(mech: str, max_procs: int, memory_mb: int, disk_mb: int, cpus: float = 1.0) -> bytes:
    """The value written to the sandbox's cgroup: pids.max counts I too; the memory cap covers the program's
    memory, its tmpfs (charged to it) and 64 MiB of copy-on-write pages of the interpreter; the CPU quota is
    ``cpus`` periods of 100 ms per period."""
    if mech == "cgroup_pids":
        return str(max_procs + 1).encode()
    if mech == "cpu_limit":
        return str(max(1000, round(cpus * CPU_PERIOD_US))).encode()
    return str((memory_mb + disk_mb + 64) << 20).encode()


CG_FILES = {"cgroup_pids": "pids.max", "cgroup_memory": "memory.limit_in_bytes", "cpu_limit": "cpu.cfs_quota_us"}
# memory.limit_in_bytes caps RAM only: on a host with swap (a laptop's swap file, zram) a program tree would page out
# past it (docs/sandbox.md). memory.memsw.limit_in_bytes caps RAM + swap; it exists where the kernel accounts swap
# (swapaccount).
MEMSW_FILE = "memory.memsw.limit_in_bytes"


def write_memory_cap(limit_fd: int, memsw_fd: int | None, value: bytes) -> None:
    """Set a memory cgroup's cap to ``value`` bytes, RAM and (with ``memsw_fd``) RAM + swap alike.

    cgroup v1 requires ``memsw >= limit`` after every write, so a lower cap is written RAM first and a higher one
    RAM + swap first (the RAM write fails with EINVAL while it would exceed the RAM + swap cap)."""
    if memsw_fd is None:
        os.write(limit_fd, value)
        return
    try:
        os.write(limit_fd, value)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        os.write(memsw_fd, value)
        os.write(limit_fd, value)
        return
    os.write(memsw_fd, value)
CPU_PERIOD_US = 100_000  # cgroup v1's default cpu.cfs_period_us


def inode_cap(disk_mb: int) -> int:
    """Files (inodes) the sandbox's tmpfs may hold: 1024 + 64 per MB (5120 at 64 MB, ~5 MB of kernel memory)."""
    return 1024 + 64 * max(1, disk_mb)


def write_line(fd: int, line: str) -> None:
    try:
        os.write(fd, (" ".join(line.split()) + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def remove_cgroup_tree(path: str) -> None:
    """rmdir a sandbox cgroup directory and its (empty) children; errors ignored."""
    try:
        subs = [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for sub in subs:
        try:
            os.rmdir(sub)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def remove_stale_cgroups(parent: str) -> None:
    """Remove ``dsm-sandbox-<pid>`` cgroups left by zygotes that died without cleaning up."""
    try:
        entries = [e.name for e in os.scandir(parent) if e.name.startswith("dsm-sandbox-")]
    except OSError:
        return
    for name in entries:
        pid = name.rsplit("-", 1)[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            remove_cgroup_tree(os.path.join(parent, name))


# ----------------------------------------------------------------------------------------------------------
# The sandbox's file system, by allow-list: a read-only tmpfs holding only these, each at its host path.
SYSTEM_TREES = ("/usr", "/lib", "/lib32", "/lib64", "/libx32")  # bound read-only when directories
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # merged-/usr symlinks, copied as symlinks
# /etc: only what the C library and the standard library read (dynamic loader cache, time zone, name service)
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf")
ETC_WRITTEN = {  # written into the sandbox's /etc (the host's passwd / group / hosts are not shown)
    "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
}
DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def python_installation() -> tuple[list[str], list[str]]:
    """The running interpreter's own directories (standard library, lib-dynload, site-packages, a stdlib zip),
    and the ``sys.path`` entries outside them (directories that ``.pth`` files or PYTHONPATH named: an editable
    install's checkout, ...), which the sandbox does not show."""
    import site
    import sysconfig

    dirs = {os.path.dirname(os.__file__), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    dirs |= set(site.getsitepackages())
    dirs |= {p for p in sys.path if os.path.basename(p) == "lib-dynload"}
    dirs = {d for d in dirs if d and os.path.isdir(d)}
    dirs |= {p for p in sys.path if p.endswith(".zip") and os.path.isfile(p)}  # python3X.zip, when present
    real = {os.path.realpath(d) for d in dirs}
    outside = [p for p in sys.path if p and os.path.exists(p)
               and not any(_inside(p, d) or _inside(os.path.realpath(p), r) for d in dirs for r in real)]
    return sorted(dirs), sorted(set(outside))


def plan_fs(python_dirs: list[str], expose: list[str], hide: list[str], *, root: str = "/") -> dict:
    """What the sandbox's root holds: ``binds`` (host paths shown read-only at the same path; the outermost of
    nested ones), ``links`` (merged-/usr symlinks), ``etc`` (host /etc entries shown), ``hide`` (paths inside a
    bind that stay hidden: covered by an empty read-only mount). ``root`` prefixes host lookups (tests)."""
    def host(p: str) -> str:
        return os.path.join(root, p.lstrip("/")) if root != "/" else p

    links = {p: os.readlink(host(p)) for p in SYSTEM_LINKS if os.path.islink(host(p))}
    cands = [p for p in SYSTEM_TREES if p not in links and os.path.isdir(host(p))]
    cands += [os.path.abspath(p) for p in (*python_dirs, *expose) if os.path.exists(host(os.path.abspath(p)))]
    binds: list[str] = []
    for p in sorted(set(cands), key=lambda x: (x.count("/"), x)):  # outer first
        real = os.path.realpath(host(p))
        if any(_inside(p, b) or _inside(real, os.path.realpath(host(b))) for b in binds):
            continue
        binds.append(p)
    hidden = []
    for h in hide:
        hr = os.path.realpath(host(os.path.abspath(h)))
        for b in binds:
            br = os.path.realpath(host(b))
            if _inside(hr, br) and os.path.exists(hr):
                hidden.append(os.path.join(b, os.path.relpath(hr, br)) if hr != br else b)
    etc = [e for e in ETC_FILES if os.path.lexists(host(f"/etc/{e}"))]
    return {"binds": sorted(binds), "links": links, "etc": etc, "hide": sorted(set(hidden))}


# ----------------------------------------------------------------------------------------------------------
class Zygote:
    """Forks sandboxes; keeps ``prefork`` of them ready; reaps them and removes their cgroups."""

    def __init__(self, cfg: dict, privileges: str = "root") -> None:
        self.cfg = cfg
        self.privileges = privileges  # "root", "user namespace" or "none: <why>"
        self.userns = privileges == "user namespace"
        self.host_pid = int(os.readlink("/proc/self"))  # (in a user namespace the zygote is PID 1 of its own)
        self.ctl = socket.socket(fileno=cfg["ctl_fd"])
        self.warnings: list[str] = []
        self.enabled = {m: True for m in MECHANISMS}
        self.reasons: dict[str, str] = {}
        self.ready: list[dict] = []
        self.children: dict[int, dict[str, str | None]] = {}  # I pid -> its cgroup dirs
        self.counter = 0
        self.spawned = 0  # sandboxes forked so far (the CPU a pinned one starts on)
        self.cg_parents: dict[str, str] = {}
        self.cg_free: list[dict[str, str | None]] = []
        self.cg_dying: list[str] = []
        self.fs: dict = {"binds": [], "links": {}, "etc": [], "hide": []}
        self.not_exposed: list[str] = []
        self.template: str | None = None  # where the sandboxes' root is mounted in the zygote's mount namespace
        self.tmp_binds: list[str] = []  # binds under /tmp: re-attached in each sandbox's private /tmp
        self.cpu_method: str | None = None
        self.swap_capped = False  # the memory cgroup caps RAM + swap (memory.memsw), not RAM alone
        self.cpus = os.sched_getaffinity(0)
        self.disk_mb = int(cfg.get("disk_mb", 64))
        self.memory_mb = int(cfg.get("memory_mb", 512))
        self.max_procs = int(cfg.get("max_procs", 32))
        self.uid_base = int(cfg.get("uid_base", 2_000_000_000))
        self.fatal: str | None = None

    # ---- start-up --------------------------------------------------------------------------------------
    def disable(self, mech: str, reason: str) -> None:
        if not self.enabled.get(mech):
            return
        self.enabled[mech] = False
        self.reasons[mech] = reason
        for dep in DEPENDS.get(mech, ()):
            self.disable(dep, f"needs {mech}")

    def start(self) -> None:
        for mech in self.cfg.get("disable", []):
            if mech in self.enabled:
                self.disable(mech, "disabled by configuration")
        if self.privileges != "root":
            self.disable("uid", "not root: the programs run as the caller's uid (in a user namespace, their PID "
                         "namespace and the seccomp filter keep them from the caller's other processes)")
        if not self.userns and self.privileges != "root":
            for mech in ("pidns", "netns", "mountns", "ipcns", "utsns", "cgroupns"):
                self.disable(mech, f"not root, and no user namespace: {self.privileges.removeprefix('none: ')}")
        if SYS_PIVOT_ROOT is None:
            self.disable("allowlist_fs", f"no pivot_root number for {platform.machine()}")
        if self.enabled["pidns"]:
            try:
                self.host_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                self.disable("pidns", f"cannot open /proc/self/ns/pid: {e}")
        if not seccomp_supported():
            self.disable("seccomp", f"no syscall table for {platform.machine()} (the allow-list is x86_64's)")
        elif self.enabled["seccomp"]:
            self.seccomp_prog = build_seccomp(**{m: self.enabled[m] for m in SECCOMP_SUBMECHANISMS})
        self.threads = self._thread_limits()
        for mod in self.cfg.get("preload", []):
            try:
                __import__(mod)
            except Exception as e:  # noqa: BLE001 - a missing optional module is only a warning
                self.warnings.append(f"preload {mod!r} failed: {type(e).__name__}: {e}")
        gc.collect()
        gc.freeze()  # sandboxes' garbage collections then never write to (copy) the zygote's objects
        ntasks = len(os.listdir("/proc/self/task"))
        if ntasks > 1:  # forking a multi-threaded process can deadlock the child
            self.warnings.append(f"zygote has {ntasks} threads after preloading; a preloaded module started threads")
        if self.enabled["allowlist_fs"]:
            try:
                self._build_template()
            except (SetupError, OSError) as e:
                self.disable("allowlist_fs", str(e))
        self._setup_cgroups()
        self._probe()

    def _thread_limits(self) -> dict:
        """Make threads cheap in address space, which ``RLIMIT_AS`` counts (sandboxes inherit both settings).

        glibc gives each new thread that allocates its own malloc arena and reserves 64 MiB of address space
        for it: at ``memory_mb=512`` only ~7 threads could start. One arena (mallopt ``M_ARENA_MAX``) is
        shared by all threads instead. A thread's default stack is capped at :data:`THREAD_STACK_MAX`
        (glibc uses the caller's ``RLIMIT_STACK``, which may be larger)."""
        out: dict = {"malloc_arena_max": None, "thread_stack_bytes": None}
        if libc.mallopt(M_ARENA_MAX, 1) == 1:
            out["malloc_arena_max"] = 1
        else:
            self.warnings.append("mallopt(M_ARENA_MAX, 1) failed: each thread reserves a 64 MiB malloc arena")
        try:
            attr = ctypes.create_string_buffer(128)  # a pthread_attr_t (56 bytes on x86_64, 64 on aarch64)
            size = ctypes.c_size_t()
            if libc.pthread_getattr_default_np(attr) != 0 or libc.pthread_attr_getstacksize(attr, ctypes.byref(size)):
                raise OSError("pthread_getattr_default_np failed")
            if size.value == 0 or size.value > THREAD_STACK_MAX:
                if libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(THREAD_STACK_MAX)) or \
                        libc.pthread_setattr_default_np(attr):
                    raise OSError("pthread_setattr_default_np failed")
                size.value = THREAD_STACK_MAX
            libc.pthread_attr_destroy(attr)
            out["thread_stack_bytes"] = size.value
        except (AttributeError, OSError) as e:
            self.warnings.append(f"thread stack size unknown: {e}")
        return out

    def _build_template(self) -> None:
        """The sandboxes' root, built once: the zygote moves to a private mount namespace of its own and mounts a
        tmpfs holding only the allow-list (:func:`plan_fs`) over ``/dev/shm`` there; each sandbox then copies
        this namespace (``unshare``) and makes the tmpfs its root (``pivot_root``), leaving the host's tree.

        Shown, read-only, ``nosuid``, ``nodev``, each at its host path: ``/usr`` and ``/lib*`` (or their merged-/usr
        symlinks), the interpreter's standard library, lib-dynload and site-packages (not the directories that
        ``.pth`` files name: an editable install's checkout stays out), ``expose`` paths, six /etc entries and a
        written passwd / group / hosts, the five device nodes, and empty ``/tmp``, ``/proc`` mount points. Not
        shown: everything else (the checkout, data directories, HOME, ``/run``, ``/sys``, ``/var``, other
        mounts); ``hide`` paths inside a bind are covered by empty read-only mounts."""
        pydirs, self.not_exposed = python_installation()
        expose = [p for p in self.cfg.get("expose", []) if p]
        self.fs = fs = plan_fs(pydirs, expose, list(self.cfg.get("hide", [])))
        self.template = tpl = "/dev/shm"
        if not os.path.isdir(tpl):
            raise SetupError("allowlist_fs", "no /dev/shm to mount the sandboxes' root on")
        _check(libc.unshare(CLONE_NEWNS), "allowlist_fs", "unshare(CLONE_NEWNS) of the zygote")
        mount("allowlist_fs", None, "/", None, MS_REC | MS_PRIVATE)
        ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
        clones = []
        for b in fs["binds"]:  # taken before anything is mounted over their paths (a venv under /dev/shm)
            fd = open_tree("allowlist_fs", os.path.realpath(b), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
            mount_setattr("allowlist_fs", fd, "", AT_EMPTY_PATH, ro | MOUNT_ATTR_NODEV)
            clones.append((b, fd))
        etc = []
        for e in fs["etc"]:
            src = f"/etc/{e}"
            if os.path.islink(src):
                etc.append((e, os.readlink(src), None))
            else:
                fd = open_tree("allowlist_fs", src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
                mount_setattr("allowlist_fs", fd, "", AT_EMPTY_PATH, ro | MOUNT_ATTR_NODEV)
                etc.append((e, None, fd))
        devs = []
        for name in DEV_NODES:
            if os.path.exists(f"/dev/{name}"):
                fd = open_tree("minimal_dev", f"/dev/{name}", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
                mount_setattr("minimal_dev", fd, "", AT_EMPTY_PATH, ro)
                devs.append((name, fd))
        mount("allowlist_fs", "tmpfs", tpl, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")

        def at(path: str) -> str:
            return os.path.join(tpl, path.lstrip("/"))

        def mountpoint(path: str, is_dir: bool) -> None:
            if is_dir:
                os.makedirs(at(path), mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(at(path)), mode=0o755, exist_ok=True)
                open(at(path), "w").close()

        for d in ("tmp", "proc", "dev", "etc"):
            os.makedirs(at(d), mode=0o755, exist_ok=True)
        for link, target in fs["links"].items():
            os.symlink(target, at(link))
        for b, fd in clones:
            mountpoint(b, os.path.isdir(b))
            move_mount("allowlist_fs", fd, at(b))
            os.close(fd)
        for e, target, fd in etc:
            if fd is None:
                os.symlink(target, at(f"/etc/{e}"))
            else:
                mountpoint(f"/etc/{e}", os.path.isdir(f"/etc/{e}"))
                move_mount("allowlist_fs", fd, at(f"/etc/{e}"))
                os.close(fd)
        for name, text in ETC_WRITTEN.items():
            with open(at(f"/etc/{name}"), "w") as f:
                f.write(text)
            os.chmod(at(f"/etc/{name}"), 0o644)
        for name, fd in devs:
            mountpoint(f"/dev/{name}", False)
            move_mount("minimal_dev", fd, at(f"/dev/{name}"))
            os.close(fd)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):
            os.symlink(target, at(f"/dev/{name}"))
        os.makedirs(at("/dev/shm"), mode=0o755, exist_ok=True)
        for h in fs["hide"]:  # inside read-only binds: mount over them (mount points need no write access)
            if os.path.isdir(at(h)):
                mount("allowlist_fs", "tmpfs", at(h), "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY,
                      "size=4k,nr_inodes=1,mode=0555")
            else:
                mount("allowlist_fs", at("/dev/null"), at(h), None, MS_BIND)
                mount("allowlist_fs", None, at(h), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        mount("allowlist_fs", None, tpl, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        self.tmp_binds = [b for b in fs["binds"] if _inside(b, "/tmp")]

    def _setup_cgroups(self) -> None:
        """A parent cgroup per controller for this zygote's sandboxes (cgroup v1). CPU: a quota per sandbox
        (``cpus`` CPUs for the whole process tree); without a cpu controller, each program is pinned to
        ``ceil(cpus)`` CPUs instead (``sched_setaffinity``, which the seccomp filter does not let it undo)."""
        self.cpu_method = "affinity"
        for ctrl, mech in (("pids", "cgroup_pids"), ("memory", "cgroup_memory"), ("cpu", "cpu_limit")):
            if not self.enabled[mech]:
                continue
            if ctrl == "cpu" and "cpu_cgroup" in self.cfg.get("disable", []):  # (benchmarks: pinned as without root)
                self.reasons["cpu_limit"] = "cpu cgroup disabled by configuration; pinned to CPUs instead"
                continue
            base = f"/sys/fs/cgroup/{ctrl}"
            try:
                if not os.path.isfile(os.path.join(base, "cgroup.procs")):
                    raise OSError(f"no cgroup v1 {ctrl} hierarchy at {base} (cgroup v2 is not supported)")
                cur = ""
                with open("/proc/self/cgroup") as f:
                    for line in f:
                        _, ctrls, path = line.rstrip("\n").split(":", 2)
                        if ctrl in ctrls.split(","):
                            cur = path
                remove_stale_cgroups(base + cur)
                parent = os.path.join(base + cur, f"dsm-sandbox-{self.host_pid}")
                os.mkdir(parent)
                self.cg_parents[mech] = parent
                if mech == "cgroup_memory":
                    self.swap_capped = os.path.isfile(os.path.join(parent, MEMSW_FILE))
                    if not self.swap_capped:
                        self.warnings.append(
                            "the kernel does not account swap (no memory.memsw; boot with swapaccount=1): "
                            "on a host with swap, a program tree may page out past memory_mb")
                if mech == "cpu_limit":
                    # the sandboxes together weigh as much as one busy process per CPU (the default pool's size):
                    # under contention a batch gets what its programs as plain processes would, however many
                    # threads they start, and each program at most its quota
                    with open(os.path.join(parent, "cpu.shares"), "w") as f:
                        f.write(str(1024 * len(self.cpus)))
                    self.cpu_method = "cgroup"
            except OSError as e:
                why = str(e) if self.privileges == "root" else f"no cgroup delegated to this user ({e}); rlimits only"
                if mech == "cpu_limit":
                    self.reasons["cpu_limit"] = f"cgroup: {why}; pinned to CPUs instead"
                else:
                    self.disable(mech, why)

    def _probe(self) -> None:
        """Run a real program in a sandbox; a mechanism whose setup fails is disabled (with a warning)."""
        for _ in range(len(MECHANISMS) + 1):
            sb = self.spawn()
            try:
                out = self._probe_once(sb)
            finally:
                for k in ("req_w", "out_r", "err_r", "stat_r", "life_w", "res_r"):
                    try:
                        os.close(sb[k])
                    except OSError:
                        pass
                self.reap(block=True)
            if out is None:
                return
            mech, msg = out
            if mech in ("fresh_process", "rlimits", "empty_env") or not self.enabled.get(mech):
                self.warnings.append(f"sandbox probe failed and cannot degrade further: {mech}: {msg}")
                self.fatal = f"{mech}: {msg}"
                return
            self.disable(mech, msg)
        self.fatal = "sandbox probe did not converge"

    def _probe_once(self, sb: dict) -> tuple[str, str] | None:
        req = json.dumps({"code": "print('sandbox-ok')", "timeout_s": 10, "memory_mb": 128, "disk_mb": 4,
                          "max_procs": 8}).encode()
        try:
            os.write(sb["req_w"], struct.pack("!Q", len(req)) + req)
        except OSError:
            pass
        os.close(sb["req_w"])
        sb["req_w"] = -1
        out, stat = b"", b""
        deadline = time.monotonic() + 30
        fds = {sb["out_r"]: "out", sb["stat_r"]: "stat", sb["err_r"]: "err"}
        err = b""
        while fds and time.monotonic() < deadline:
            r, _, _ = select.select(list(fds), [], [], 1.0)
            for fd in r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    del fds[fd]
                elif fds[fd] == "out":
                    out += chunk
                elif fds[fd] == "err":
                    err += chunk
                else:
                    stat += chunk
        lines = stat.decode("utf-8", "replace").splitlines()
        for line in lines:  # a host working directory (no private /tmp): removed, as the client does
            if line.startswith("W /tmp/dsm-sandbox-"):
                import shutil

                shutil.rmtree(line[2:], ignore_errors=True)
        for line in lines:
            if line.startswith("E "):
                parts = line.split(" ", 2)
                return parts[1], parts[2] if len(parts) > 2 else ""
        if b"sandbox-ok" not in out:
            tail = err.decode("utf-8", "replace")[-300:]
            return "fresh_process", f"probe program failed: status={stat!r} stderr={tail!r}"
        return None

    # ---- sandboxes -------------------------------------------------------------------------------------
    def spawn(self) -> dict:
        """Fork one sandbox (I -> U) that waits for its request.

        With a PID namespace the zygote unshares ``CLONE_NEWPID`` just for this fork (its own PID namespace
        never changes; only its children's), so I is PID 1 of a fresh namespace, then goes back to the
        host namespace for its next children with ``setns``."""
        cgdirs = self._take_cgroups()
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stat_r, stat_w = os.pipe()
        life_r, life_w = os.pipe()
        res_r, res_w = os.pipe()
        pid_err = None
        if self.enabled["pidns"] and libc.unshare(CLONE_NEWPID) != 0:
            pid_err = f"unshare(CLONE_NEWPID) failed: {os.strerror(ctypes.get_errno())}"
        unshared = self.enabled["pidns"] and pid_err is None
        try:
            pid = os.fork()
        except OSError:
            if unshared:
                self._setns_back()
            for fd in (req_r, req_w, out_r, out_w, err_r, err_w, stat_r, stat_w, life_r, life_w, res_r, res_w):
                os.close(fd)
            self._release_cgroups(cgdirs)
            raise
        self.spawned += 1
        if pid == 0:  # I
            code = 111
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                close_fds_except({0, 1, 2, req_r, out_w, err_w, stat_w, life_r, res_w})
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.close(null)
                code = Sandbox(self, cgdirs, req_r, out_w, err_w, stat_w, life_r, res_w, pid_err).init()
            except SetupError as e:
                write_line(stat_w, f"E {e.mech} {e.msg}")
            except BaseException as e:  # noqa: BLE001 - report, never run the program unisolated
                write_line(stat_w, f"E fresh_process {type(e).__name__}: {e}")
            finally:
                os._exit(code)
        if unshared:
            self._setns_back()
        for fd in (req_r, out_w, err_w, stat_w, life_r, res_w):
            os.close(fd)
        self.children[pid] = cgdirs
        return {"pid": pid, "uid": self.uid_base + pid if self.enabled["uid"] else None, "req_w": req_w,
                "out_r": out_r, "err_r": err_r, "stat_r": stat_r, "life_w": life_w, "res_r": res_r}

    def _setns_back(self) -> None:
        if libc.setns(self.host_pidns, CLONE_NEWPID) != 0:  # cannot happen; if it did, stop rather than misplace
            raise RuntimeError(f"setns back to the host PID namespace failed: {os.strerror(ctypes.get_errno())}")

    def reap(self, block: bool = False) -> None:
        while self.children:
            try:
                pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self._release_cgroups(self.children.pop(pid, {}))
            if block:
                return

    def _take_cgroups(self) -> dict[str, str | None]:
        """A cgroup per controller for one sandbox: reused from finished sandboxes (cheaper than mkdir/rmdir,
        and no dying memory cgroups pile up), else created. ``None`` = could not be created (I then refuses)."""
        if self.cg_free:
            return self.cg_free.pop()
        self.counter += 1
        out: dict[str, str | None] = {}
        for mech, parent in self.cg_parents.items():
            d = os.path.join(parent, f"s{self.counter}")
            try:
                os.mkdir(d)
                out[mech] = d
            except OSError:
                out[mech] = None
        return out

    def _release_cgroups(self, cg: dict[str, str | None]) -> None:
        def empty(d: str | None) -> bool:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:  # type: ignore[arg-type]
                    return not f.read().strip()
            except (OSError, TypeError):
                return False

        if cg and all(empty(d) for d in cg.values()):
            self.cg_free.append(cg)
        else:
            self.cg_dying.extend(d for d in cg.values() if d)
        self.cg_dying = [d for d in self.cg_dying if not self._rmdir(d, tries=1)]

    @staticmethod
    def _rmdir(d: str, tries: int = 50) -> bool:
        for i in range(tries):
            try:
                os.rmdir(d)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if i + 1 < tries:
                    time.sleep(0.01)
        return False

    def report(self) -> dict:
        return {
            "mechanisms": {m: self.enabled[m] for m in MECHANISMS},
            "reasons": dict(self.reasons),
            "warnings": list(self.warnings),
            "fatal": self.fatal,
            "cgroups": list(self.cg_parents.values()),
            "exposed_paths": self.fs["binds"] if self.enabled["allowlist_fs"] else None,
            "hidden_paths": self.fs["hide"] if self.enabled["allowlist_fs"] else None,
            "etc": self.fs["etc"] if self.enabled["allowlist_fs"] else None,
            "not_exposed": self.not_exposed,
            "cpu_limit": self.cpu_method if self.enabled["cpu_limit"] else None,
            "memory_cap": (("RAM + swap" if self.swap_capped else "RAM only") if self.enabled["cgroup_memory"]
                           else None),
            "uid_base": self.uid_base if self.enabled["uid"] else None,
            "seccomp": None if not self.enabled["seccomp"] else {
                "policy": "allow-list (anything else fails with EPERM)", "arch": "x86_64",
                "allowed_syscalls": len(allowed_syscalls(locks=not self.enabled["no_file_locks"],
                                                         notify=not self.enabled["no_fs_notify"])),
                "argument_checked": sorted(checked_syscalls())},
            "threads": self.threads,
            "zygote_pid": self.host_pid,
            "privileges": self.privileges,
            "kernel": platform.release(),
            "python": sys.version.split()[0],
            "preloaded": list(self.cfg.get("preload", [])),
        }

    # ---- main loop -------------------------------------------------------------------------------------
    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.ctl.sendall(json.dumps({"hello": self.report()}).encode())
        prefork = int(self.cfg.get("prefork", 2))
        poller = select.poll()
        poller.register(self.ctl.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        try:
            while True:
                timeout = 0 if len(self.ready) < prefork and not self.fatal else None
                events = poller.poll(timeout)
                if not events:  # idle: pre-fork one more sandbox
                    try:
                        self.ready.append(self.spawn())
                    except OSError as e:  # e.g. out of processes: retry later, serve requests meanwhile
                        print(f"sandbox zygote: pre-fork failed: {e}", file=sys.stderr, flush=True)
                        poller.poll(200)
                    continue
                for fd, ev in events:
                    if fd == wake_r:
                        try:
                            while os.read(wake_r, 4096):
                                pass
                        except BlockingIOError:
                            pass
                        self.reap()
                        continue
                    msg = self.ctl.recv(64) if ev & (select.POLLIN | select.POLLHUP) else b""
                    if not msg or msg == b"Q":
                        return
                    if msg == b"F":
                        try:
                            sb = self.ready.pop(0) if self.ready else self.spawn()
                        except OSError as e:
                            self.ctl.send(json.dumps({"error": f"cannot fork a sandbox: {e}"}).encode())
                            continue
                        fds = [sb["req_w"], sb["out_r"], sb["err_r"], sb["stat_r"], sb["life_w"], sb["res_r"]]
                        head = json.dumps({"pid": sb["pid"], "uid": sb["uid"]}).encode()
                        socket.send_fds(self.ctl, [head], fds)
                        for f in fds:
                            os.close(f)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        for sb in self.ready:
            for k in ("req_w", "out_r", "err_r", "stat_r", "life_w", "res_r"):
                try:
                    os.close(sb[k])
                except OSError:
                    pass
        self.ready.clear()
        deadline = time.monotonic() + 5
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)
        for cg in self.cg_free:
            self.cg_dying.extend(d for d in cg.values() if d)
        self.cg_free.clear()
        for d in self.cg_dying + list(self.cg_parents.values()):
            self._rmdir(d)


class Sandbox:
    """The code of I and U for one sandbox (runs in forked children of the zygote only)."""

    def __init__(self, z: Zygote, cgdirs: dict[str, str | None], req_r: int, out_w: int, err_w: int, stat_w: int,
                 life_r: int, res_w: int, pid_err: str | None) -> None:
        self.z = z
        self.on = z.enabled
        self.cgdirs = cgdirs
        self.req_r, self.out_w, self.err_w, self.stat_w, self.life_r, self.res_w = req_r, out_w, err_w, stat_w, life_r, res_w
        self.pid_err = pid_err
        self.cg_fds: dict[str, int] = {}
        self.memsw_fd: int | None = None  # memory.memsw.limit_in_bytes, where the zygote caps swap too
        self.uid: int | None = None
        self.tmp_workdir = "/tmp"  # the program's working directory inside the private /tmp
        self.host_pid = 0

    # ---- I: PID 1 of the sandbox, and its monitor ------------------------------------------------------
    def init(self) -> int:
        prctl("fresh_process", PR_SET_PDEATHSIG, signal.SIGKILL)  # the zygote dies -> the sandbox dies
        if self.on["pidns"]:
            if self.pid_err:
                raise SetupError("pidns", self.pid_err)
            if os.getpid() != 1:
                raise SetupError("pidns", "the sandbox is not PID 1 of a new PID namespace")
        self.host_pid = host_pid = int(os.readlink("/proc/self"))  # the host's /proc is still mounted here
        self.uid = self.z.uid_base + host_pid if self.on["uid"] else None
        try:  # the monitor must survive an out-of-memory kill in its cgroup
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except OSError:
            pass
        for mech, d in self.cgdirs.items():
            if d is None:
                raise SetupError(mech, "could not create the sandbox's cgroup")
            try:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write("0")  # this process
                self.cg_fds[mech] = os.open(os.path.join(d, CG_FILES[mech]), os.O_WRONLY)
                value = cg_limit(mech, self.z.max_procs, self.z.memory_mb, self.z.disk_mb)
                if mech == "cgroup_memory":
                    if self.z.swap_capped:
                        self.memsw_fd = os.open(os.path.join(d, MEMSW_FILE), os.O_WRONLY)
                    write_memory_cap(self.cg_fds[mech], self.memsw_fd, value)
                else:
                    os.write(self.cg_fds[mech], value)
            except OSError as e:
                raise SetupError(mech, f"joining {d}: {e}") from e
        flags = 0
        for mech, fl in NS_FLAGS.items():
            if self.on[mech] and mech != "pidns":
                flags |= fl
        if flags and libc.unshare(flags) != 0:
            err = ctypes.get_errno()
            for mech, fl in NS_FLAGS.items():  # name the culprit
                if flags & fl and libc.unshare(fl) != 0:
                    raise SetupError(mech, f"unshare failed: {os.strerror(ctypes.get_errno())}")
            raise SetupError("mountns", f"unshare failed: {os.strerror(err)}")
        if self.on["utsns"]:
            name = b"sandbox"
            _check(libc.sethostname(name, len(name)), "utsns", "sethostname")
        if self.on["mountns"]:
            self.build_fs()
        upid = os.fork()
        if upid == 0:
            code = 111
            try:
                code = self.user()
            except SetupError as e:
                write_line(self.stat_w, f"E {e.mech} {e.msg}")
            except BaseException as e:  # noqa: BLE001
                write_line(self.stat_w, f"E fresh_process {type(e).__name__}: {e}")
                try:
                    os.write(2, traceback.format_exc().encode("utf-8", "replace"))
                except OSError:
                    pass
            finally:
                os._exit(code)
        for fd in (self.req_r, self.out_w, self.err_w, self.res_w, *self.cg_fds.values()):
            os.close(fd)
        if self.memsw_fd is not None:
            os.close(self.memsw_fd)
        # Wait for U to end, or for the client to write to / close the life pipe (timeout, client gone).
        status = None
        try:
            pidfd: int | None = os.pidfd_open(upid)
        except (AttributeError, OSError):
            pidfd = None
        poller = select.poll()
        poller.register(self.life_r, select.POLLIN | select.POLLHUP)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        while status is None:
            events = poller.poll(None if pidfd is not None else 20)
            if any(fd == self.life_r for fd, _ in events):
                break
            pid, st = os.waitpid(upid, os.WNOHANG)
            if pid:
                status = st
        self.kill_all(upid)
        if status is not None:
            write_line(self.stat_w, f"X {status}")
        write_line(self.stat_w, "D")  # every process of the program is gone
        return 0

    def kill_all(self, upid: int) -> None:
        """Kill and reap every process of the sandbox but this one."""
        if self.on["pidns"] and os.getpid() == 1:  # kill(-1) from PID 1 reaches this namespace only
            while True:
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    return
        try:
            os.kill(upid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.sweep(upid)
        try:
            while True:
                os.waitpid(-1, 0)
        except ChildProcessError:
            pass

    def sweep(self, upid: int) -> None:
        """Fallback tree kill (no PID namespace): SIGKILL the program's process group, every process of the
        sandbox uid, and every process of the sandbox's pids cgroup."""
        try:
            os.killpg(upid, signal.SIGKILL)  # U called setsid(): its group holds children that did not leave
        except OSError:
            pass
        if self.uid is not None:
            kpid = os.fork()
            if kpid == 0:
                try:
                    os.setresgid(self.uid, self.uid, self.uid)
                    os.setresuid(self.uid, self.uid, self.uid)
                    for _ in range(1000):
                        os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    os._exit(0)
                except BaseException:  # noqa: BLE001
                    os._exit(1)
                os._exit(0)
            os.waitpid(kpid, 0)
        for mech, d in self.cgdirs.items():
            if mech == "cgroup_pids" and d:
                for _ in range(100):
                    try:
                        with open(os.path.join(d, "cgroup.procs")) as f:
                            pids = [int(x) for x in f.read().split()]
                        pids = [p for p in pids if p != os.getpid()]
                    except OSError:
                        break
                    if not pids:
                        break
                    for p in pids:
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    time.sleep(0.005)

    def build_fs(self) -> None:
        """The sandbox's file-system view (new mount namespace, run as root in I): the zygote's template as root
        (:meth:`Zygote._build_template`), or without it the host's tree read-only; a private /tmp and /dev/shm."""
        tmp_fds = []
        if self.on["allowlist_fs"]:
            tpl = self.z.template
            assert tpl is not None
            for b in self.z.tmp_binds:  # under /tmp: cloned before the private /tmp covers them
                fd = open_tree("allowlist_fs", os.path.join(tpl, b.lstrip("/")),
                               OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
                tmp_fds.append((b, fd))
            self.mount_proc(os.path.join(tpl, "proc"))  # while the host's /proc is visible (a user namespace needs it)
            os.chdir(tpl)
            _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "allowlist_fs", "pivot_root")
            _check(libc.umount2(b".", MNT_DETACH), "allowlist_fs", "detaching the host's tree")
            os.chdir("/")
        else:
            mount("mountns", None, "/", None, MS_REC | MS_PRIVATE)
            if self.on["ro_root"]:
                attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | (MOUNT_ATTR_NODEV if self.on["nodev"] else 0)
                mount_setattr("nodev" if self.on["nodev"] else "ro_root", AT_FDCWD, "/", AT_RECURSIVE, attrs)
            self.mount_proc("/proc")
        if self.on["private_tmp"]:
            self.mount_work(self.z.disk_mb)
            for b, fd in tmp_fds:  # read-only Python directories inside the private /tmp
                os.makedirs(b, mode=0o755, exist_ok=True)
                move_mount("allowlist_fs", fd, b)
                os.close(fd)
                self.tmp_workdir = "/tmp/work"  # the program still starts in an empty directory of its own
            if self.tmp_workdir != "/tmp":
                os.makedirs(self.tmp_workdir, mode=0o700, exist_ok=True)
                if self.uid is not None:
                    os.chown(self.tmp_workdir, self.uid, self.uid)

    def mount_proc(self, target: str) -> None:
        """The program's /proc: hidepid=invisible, it sees its own processes only (not PID 1, the monitor);
        subset=pid: no /proc/sys, /proc/kcore, /proc/sysrq-trigger, ... (kernel >= 5.8)."""
        if self.on["proc_hidepid"]:
            mount("proc_hidepid", "proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible,subset=pid")
        elif self.on["proc"]:
            mount("proc", "proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)

    def mount_work(self, disk_mb: int) -> None:
        """One size- and inode-limited tmpfs shown at /tmp (the working directory) and /dev/shm: one quota for
        both (``shared_quota``; else two tmpfs with the same limits)."""
        uid = self.uid if self.uid is not None else os.geteuid()
        size = f"{max(1, disk_mb)}m"
        inodes = str(inode_cap(disk_mb)) if self.on["inode_cap"] else None
        if self.on["shared_quota"]:
            fs = _check(libc.syscall(SYS_FSOPEN, b"tmpfs", FSOPEN_CLOEXEC), "shared_quota", "fsopen")
            for k, v in (("size", size), ("mode", "0755"), ("nr_inodes", inodes)):
                if v is not None:
                    _check(libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, k.encode(), v.encode(), 0),
                           "inode_cap" if k == "nr_inodes" else "shared_quota", f"fsconfig {k}")
            _check(libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0), "shared_quota", "fsconfig create")
            mfd = _check(libc.syscall(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV),
                         "shared_quota", "fsmount")
            os.close(fs)
            for sub, mode in (("work", 0o700), ("shm", 0o700)):
                os.mkdir(sub, mode, dir_fd=mfd)
                os.chown(sub, uid, uid, dir_fd=mfd)
            for sub, target in (("work", "/tmp"), ("shm", "/dev/shm")):
                if target == "/dev/shm" and not os.path.isdir(target):
                    continue
                t = open_tree("shared_quota", sub, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC, dirfd=mfd)
                move_mount("shared_quota", t, target)
                os.close(t)
            os.close(mfd)
            return
        opts = f"size={size},mode=0700,uid={uid},gid={uid}" + (f",nr_inodes={inodes}" if inodes else "")
        mount("private_tmp", "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts)
        if os.path.isdir("/dev/shm"):
            mount("private_tmp", "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts)

    # ---- U (the program) -------------------------------------------------------------------------------
    def user(self) -> int:
        os.close(self.life_r)
        # --- what needs no request, done while waiting for it (pre-forked): off the program's path
        os.setsid()
        try:  # I is exempt from the OOM killer; the program is its first choice
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        head = read_exact(self.req_r, 8)
        if len(head) < 8:  # sandbox discarded unused
            return 0
        (size,) = struct.unpack("!Q", head)
        body = read_exact(self.req_r, size)
        os.close(self.req_r)
        if len(body) < size:
            return 0
        req = json.loads(body.decode("utf-8"))
        # --- limits, while still root
        max_procs = int(req.get("max_procs", 32))
        memory_mb = int(req.get("memory_mb", 512))
        disk_mb = int(req.get("disk_mb", self.z.disk_mb))
        cpus = float(req.get("cpus") or 1.0)
        for mech, fd in self.cg_fds.items():
            val = cg_limit(mech, max_procs, memory_mb, disk_mb, cpus)
            if val != cg_limit(mech, self.z.max_procs, self.z.memory_mb, self.z.disk_mb):
                try:
                    if mech == "cgroup_memory":
                        write_memory_cap(fd, self.memsw_fd, val)
                    else:
                        os.write(fd, val)
                except OSError as e:
                    raise SetupError(mech, f"setting limit: {e}") from e
            os.close(fd)
        if self.memsw_fd is not None:
            os.close(self.memsw_fd)
            self.memsw_fd = None
        if self.on["private_tmp"] and disk_mb != self.z.disk_mb:
            opts = f"size={max(1, disk_mb)}m" + (f",nr_inodes={inode_cap(disk_mb)}" if self.on["inode_cap"] else "")
            mount("private_tmp", None, "/tmp", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, opts)
            if not self.on["shared_quota"] and os.path.isdir("/dev/shm"):
                mount("private_tmp", None, "/dev/shm", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, opts)
        self.pin(cpus)
        if self.z.userns:  # before RLIMIT_NPROC: the kernel checks each enclosing user namespace's count against the
            own_user_namespace()  # limit its creator had (the zygote's namespace counts every sandbox's processes)
        cpu = max(1, math.ceil(float(req.get("cpu_s") or req.get("timeout_s", 10))))
        with open("/proc/self/statm") as f:
            vsz = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                  (resource.RLIMIT_AS, vsz + (memory_mb << 20)), (resource.RLIMIT_FSIZE, max(1, disk_mb) << 20),
                  (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_MEMLOCK, 0), (resource.RLIMIT_MSGQUEUE, 0)]
        if self.uid is not None or self.z.userns:  # RLIMIT_NPROC counts a uid's processes (per user namespace):
            limits.append((resource.RLIMIT_NPROC, max_procs))  # meaningful for a fresh uid or user namespace only
        try:
            for lim, val in limits:
                soft, hard = val if isinstance(val, tuple) else (val, val)
                resource.setrlimit(lim, (soft, hard))
        except (OSError, ValueError) as e:
            raise SetupError("rlimits", str(e)) from e
        os.chdir(self.tmp_workdir if self.on["private_tmp"] else self._host_workdir())
        os.umask(0o077)
        # --- stdio
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(self.out_w, 1)
        os.dup2(self.err_w, 2)
        for fd in (null, self.out_w, self.err_w):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        # --- drop privileges
        if self.on["uid"]:
            try:
                os.setgroups([])
                os.setresgid(self.uid, self.uid, self.uid)
                os.setresuid(self.uid, self.uid, self.uid)
            except OSError as e:
                raise SetupError("uid", str(e)) from e
            if os.getresuid() != (self.uid,) * 3 or os.getgroups():
                raise SetupError("uid", "uid drop did not take")
            try:
                os.setuid(0)
            except PermissionError:
                pass
            else:
                raise SetupError("uid", "could regain root")
        if self.on["no_new_privs"]:
            prctl("no_new_privs", PR_SET_NO_NEW_PRIVS, 1)
        if self.on["seccomp"]:
            install_seccomp(self.z.seccomp_prog[0])
        call = req.get("call")
        close_fds_except({0, 1, 2, self.res_w} if call else {0, 1, 2})
        return run_program(req["code"], call, self.res_w)

    def pin(self, cpus: float) -> None:
        """Without a cpu cgroup (``cpu_limit`` by affinity): pin this process to ``ceil(cpus)`` CPUs, starting with the
        one the scheduler woke it on (no migration; consecutive sandboxes do not pile up on one CPU)."""
        if not self.on["cpu_limit"] or self.cgdirs.get("cpu_limit"):
            return
        cpus_list = sorted(self.z.cpus)
        k = min(len(cpus_list), max(1, math.ceil(cpus)))
        here = libc.sched_getcpu()
        start = cpus_list.index(here) if here in cpus_list else self.z.spawned % len(cpus_list)
        try:
            os.sched_setaffinity(0, {cpus_list[(start + i) % len(cpus_list)] for i in range(k)})
        except OSError as e:
            raise SetupError("cpu_limit", f"sched_setaffinity: {e}") from e

    def _host_workdir(self) -> str:
        """Without a mount namespace: a fresh directory under /tmp (removed by the client)."""
        import tempfile

        d = tempfile.mkdtemp(prefix="dsm-sandbox-")
        if self.uid is not None:
            os.chown(d, self.uid, self.uid)
        write_line(self.stat_w, f"W {d}")
        return d


def run_program(code: str, call: str | None, res_w: int) -> int:
    """Run ``code`` as ``__main__`` in this (already sandboxed) process; return the exit code."""
    import atexit
    import builtins
    import io
    import linecache
    import types

    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                    errors="surrogateescape", write_through=False)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                    errors="backslashreplace", line_buffering=True)
    sys.argv = [""]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    filename = "<string>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    exit_code = 0
    try:
        exec(compile(code, filename, "exec", dont_inherit=True), main.__dict__)  # noqa: S102 - this is the sandbox
        if call:
            if call not in main.__dict__:
                raise NameError(f"name {call!r} is not defined")
            result = main.__dict__[call]()
            text = str(result)
            data = text.encode("utf-8", "backslashreplace")
            view = memoryview(data)
            while view:
                n = os.write(res_w, view)
                view = view[n:]
            os.close(res_w)
    except SystemExit as e:
        if e.code is None:
            exit_code = 0
        elif isinstance(e.code, int):
            exit_code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            exit_code = 1
    except BaseException as e:  # noqa: BLE001 - the program's own error: print it like Python does
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        try:
            sys.stderr.write("".join(traceback.format_exception(type(e), e, tb)))
        except BaseException:  # noqa: BLE001
            os.write(2, f"{type(e).__name__}\n".encode())
        exit_code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            exit_code = exit_code or 120
    return exit_code


def main() -> None:
    cfg = json.loads(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    privileges = "root"
    if os.geteuid() != 0:
        why = enter_user_namespace(cfg["ctl_fd"]) if "userns" not in cfg.get("disable", []) else \
            "disabled by configuration"
        privileges = "user namespace" if why is None else f"none: {why}"
    z = Zygote(cfg, privileges)
    try:
        z.start()
        z.serve()
    except BaseException:
        traceback.print_exc()
        z.shutdown()
        raise


if __name__ == "__main__":
    main()

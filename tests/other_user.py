"""A second, non-root local user for the tests of what holds for an ordinary user on a shared machine (issue 46):
the code sandbox without root, and the pipeline's servers against another user's processes.

:func:`other_user` creates it (``useradd``) where the suite runs as root, as CI does, and finds an interpreter it can
run (the suite's own may live where it cannot read, e.g. under /root); the modules the tests run as that user are
copied where it can read them (:attr:`OtherUser.code`). Where the suite runs as an ordinary user already, every other
test exercises the non-root path, and these skip with the reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "dsmtest"
COPIED = ("stages/__init__.py", "stages/core/__init__.py", "stages/core/sandbox.py", "stages/core/_sandbox_zygote.py",
          "benchmarks/__init__.py", "benchmarks/sandbox_attacks.py")
"""What the tests run as that user: the sandbox and the red-team table's attacks (standard library only)."""


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int
    python: str
    """An interpreter this user can run."""
    code: Path
    """A directory of this user's holding :data:`COPIED` (its working directory in :meth:`run`)."""

    def popen(self, args: list[str], **kw: object) -> subprocess.Popen[str]:
        """Start ``args`` as this user (no supplementary groups, a minimal environment, in :attr:`code`)."""
        env = {"PATH": os.defpath, "HOME": str(self.code), "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.Popen(args, user=self.uid, group=self.gid, extra_groups=[], env=env, cwd=self.code,
                                text=True, **kw)  # type: ignore[call-overload]

    def python_code(self, code: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` as this user (its directory first on sys.path: ``from stages.core import sandbox``)."""
        p = self.popen([self.python, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _runs_as(uid: int, gid: int, python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import ctypes, json, socket"], user=uid, group=gid, extra_groups=[],
                              env={"PATH": os.defpath}, cwd="/", capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def other_user() -> tuple[OtherUser | None, str]:
    """(the user, "") or (None, why there is none). Call :func:`cleanup` on the user when done."""
    if not sys.platform.startswith("linux"):
        return None, f"{sys.platform}: the tests of a second user are Linux's"
    if os.geteuid() != 0:
        return None, (f"the suite runs as uid {os.geteuid()}, not root: it cannot create a second user (the other "
                      "tests exercise the non-root path here)")
    try:
        pw = pwd.getpwnam(NAME)
    except KeyError:
        useradd = shutil.which("useradd", path=os.defpath + ":/usr/sbin:/sbin")
        if useradd is None:
            return None, "no useradd to create a second user"
        subprocess.run([useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", NAME], capture_output=True)
        try:  # (a concurrent test session may have created it meanwhile)
            pw = pwd.getpwnam(NAME)
        except KeyError:
            return None, f"useradd {NAME} failed"
    if pw.pw_uid == 0:
        return None, f"user {NAME} is root"
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), os.path.realpath(sys.executable),
                  shutil.which("python3", path=os.defpath) or "", "/usr/bin/python3"]
    python = next((p for p in dict.fromkeys(candidates) if p and _runs_as(pw.pw_uid, pw.pw_gid, p)), None)
    if python is None:
        return None, f"no Python interpreter that user {NAME} can run (tried {[c for c in candidates if c]})"
    code = Path(tempfile.mkdtemp(prefix="dsm-other-user-"))
    for rel in COPIED:
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, code / rel)
    for d, _, files in os.walk(code):
        os.chown(d, pw.pw_uid, pw.pw_gid)
        os.chmod(d, 0o755)
        for f in files:
            os.chown(os.path.join(d, f), pw.pw_uid, pw.pw_gid)
    return OtherUser(NAME, pw.pw_uid, pw.pw_gid, python, code), ""


def cleanup(user: OtherUser) -> None:
    """Remove the user's copy (the user itself stays: other test sessions may use it)."""
    shutil.rmtree(user.code, ignore_errors=True)

"""Which system calls sandboxed programs really make: the evidence behind the sandbox's seccomp allow-list.

    python benchmarks/sandbox_syscalls.py [--groups tests,pot,tir,math] [--pot-n 1319]

Runs the sandbox's zygote under ``strace -f`` (Debian's strace; the zygote and its sandboxes are traced,
nothing is changed in them) and counts, per group of programs, every system call made *after* the seccomp
filter was installed: by the program's process from its ``prctl(PR_SET_SECCOMP)`` on, and by every process
and thread it started. Groups:

- ``tests``: the programs of tests/core/test_sandbox.py and test_sandbox_hostile.py (hostile ones
  included: their denied calls show up with EPERM results);
- ``pot``: the PAL / GSM-Hard ``solution()`` programs (../shared/data/pot_tir/pal_gsmhardv2.jsonl when
  present), the PAL prompts' programs (../shared/data/pot_tir/prompts) and the tiny default's generated
  PoT programs (stages/data/problems.py);
- ``tir``: the code of the ToRA prompts' tool-integrated examples (../shared/data/pot_tir/prompts) and the
  tiny default's TIR programs;
- ``math``: typical model-written programs using numpy, sympy, scipy, mpmath, networkx, the math standard
  library, threads, process pools, asyncio and files in the working directory (:data:`MATH_PROGRAMS`).

Writes benchmarks/results/sandbox_syscalls.json: per group ``{syscall: {"calls": n, "eperm": n}}`` and the
values of the arguments the filter checks (``arguments``: ``"fcntl(F_GETFL)": n``, ...), the
syscalls used that the allow-list lacks (each must be a deliberate denial, listed in the zygote's
``_X86_64_DENIED_ON_PURPOSE``), and the allowed syscalls no group used. Timing assertions of the tests may
fail under strace (it slows every call); that does not matter here. Not part of benchmarks/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core import _sandbox_zygote as zygote  # noqa: E402
from stages.core import sandbox  # noqa: E402

CLONES = {"clone", "clone3", "fork", "vfork"}
LINE = re.compile(r"^(\d+) +(?:(\w+)\(|<\.\.\. (\w+) resumed>|(\+\+\+|---))")
RESULT = re.compile(r"\) += (-?\d+)(?: /\* (\d+) in strace's PID NS \*/)?(?: (E[A-Z0-9]+))?")

MATH_PROGRAMS: dict[str, str] = {
    "numpy_linalg": "import numpy as np\nA = np.array([[2., 1.], [1., 3.]])\nprint(np.linalg.solve(A, [3., 5.]), "
                    "np.linalg.eigvalsh(A), np.linalg.det(A), np.linalg.inv(A) @ A)",
    "numpy_misc": "import numpy as np\nrng = np.random.default_rng(0)\nx = rng.normal(size=1000)\n"
                  "print(np.fft.fft(x)[:2], np.polyfit(np.arange(10), np.arange(10) ** 2, 2), np.median(x), "
                  "np.cumsum(np.arange(5)), np.unique([3, 1, 3]), np.random.randint(0, 9, 3).shape)",
    "numpy_big": "import numpy as np\na = np.ones((2000, 2000))\nprint((a @ a).sum(), np.sort(np.random.rand(10**6))[0] >= 0)",
    "sympy_solve": "from sympy import *\nx, y = symbols('x y')\nprint(solve([x + y - 3, x - y - 1], [x, y]), "
                   "solve(x**3 - 6*x**2 + 11*x - 6, x), factor(x**4 - 1), expand((x + 1)**5))",
    "sympy_calculus": "from sympy import *\nx = symbols('x')\nprint(integrate(sin(x)**2, (x, 0, pi)), "
                      "limit(sin(x) / x, x, 0), diff(exp(x**2), x), series(cos(x), x, 0, 6), "
                      "summation(1 / symbols('k')**2, (symbols('k'), 1, oo)))",
    "sympy_numbers": "from sympy import *\nprint(factorint(360), isprime(2**31 - 1), nsimplify(0.333333333333), "
                     "Rational(3, 4) + Rational(1, 6), binomial(10, 3), totient(36), simplify(sqrt(8)), "
                     "Matrix([[1, 2], [3, 4]]).inv(), N(pi, 50), divisors(60), gcd(12, 18), mod_inverse(3, 7))",
    "sympy_parse": "from sympy.parsing.sympy_parser import parse_expr\nimport sympy\n"
                   "e = parse_expr('x**2 + 2*x + 1')\nprint(sympy.factor(e), sympy.latex(e), sympy.srepr(e)[:20])",
    "scipy": "from scipy import optimize, integrate, special, stats\nimport math\n"
             "print(optimize.brentq(lambda t: t**2 - 2, 0, 2), integrate.quad(math.sin, 0, math.pi)[0], "
             "special.comb(10, 3), stats.norm.cdf(1.0), optimize.minimize(lambda v: (v[0] - 1)**2, [0]).x)",
    "mpmath_networkx": "import mpmath, networkx as nx\nmpmath.mp.dps = 40\nG = nx.cycle_graph(6)\n"
                       "print(mpmath.zeta(3), mpmath.quad(mpmath.sin, [0, mpmath.pi]), nx.shortest_path_length(G, 0, 3), "
                       "nx.number_of_edges(G))",
    "stdlib_math": "import math, cmath, fractions, decimal, statistics, itertools, functools, random, heapq, bisect\n"
                   "decimal.getcontext().prec = 50\nprint(math.comb(30, 7), math.gcd(84, 36), math.isqrt(10**20), "
                   "cmath.sqrt(-4), fractions.Fraction(3, 7) + fractions.Fraction(1, 7), decimal.Decimal(2).sqrt(), "
                   "statistics.mean([1, 2, 3, 4]), statistics.stdev([1, 2, 3, 4]), len(list(itertools.permutations(range(6)))), "
                   "functools.reduce(lambda a, b: a * b, range(1, 10)), random.Random(0).random(), heapq.nlargest(2, [5, 1, 9]), "
                   "bisect.bisect([1, 3, 5], 4))",
    "stdlib_misc": "import collections, datetime, json, re, string, time, hashlib, csv, io, sys, os, typing, enum, dataclasses\n"
                   "sys.setrecursionlimit(10000)\n"
                   "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
                   "print(f(5000), collections.Counter('banana'), datetime.date(2024, 2, 29) + datetime.timedelta(days=1), "
                   "json.dumps({'a': [1, 2]}), re.findall(r'\\d+', 'a1b22'), string.ascii_lowercase[:3], "
                   "hashlib.sha256(b'x').hexdigest()[:8], time.time() > 0, time.perf_counter() > 0, os.getcwd(), "
                   "os.cpu_count(), len(os.sched_getaffinity(0)))\ntime.sleep(0.01)\n"
                   "w = csv.writer(io.StringIO()); w.writerow([1, 2])",
    "lru_cache_dp": "from functools import lru_cache\n@lru_cache(maxsize=None)\n"
                    "def ways(n):\n    return 1 if n <= 1 else ways(n - 1) + ways(n - 2)\nprint(ways(300))",
    "files_in_cwd": "import os, tempfile, pathlib, shutil, pickle\nopen('a.txt', 'w').write('hello')\n"
                    "print(open('a.txt').read(), os.listdir('.'), os.path.getsize('a.txt'))\n"
                    "os.makedirs('d/e', exist_ok=True)\nshutil.copy('a.txt', 'd/e/b.txt')\nos.rename('a.txt', 'c.txt')\n"
                    "with tempfile.TemporaryDirectory() as t:\n    pathlib.Path(t, 'x').write_bytes(pickle.dumps([1, 2]))\n"
                    "    print(pickle.loads(pathlib.Path(t, 'x').read_bytes()))\n"
                    "with tempfile.NamedTemporaryFile('w+') as f:\n    f.write('z'); f.flush(); os.fsync(f.fileno())\n"
                    "print(shutil.disk_usage('.').total > 0)\nshutil.rmtree('d')\nos.remove('c.txt')\n"
                    "open('/dev/shm/s', 'wb').write(b'1')\nprint(os.stat('/dev/shm/s').st_size)\nimport sqlite3\n"
                    "db = sqlite3.connect(':memory:'); db.execute('create table t(x)'); print(db.execute('select 1').fetchall())",
    "threads": "import threading, queue\nq = queue.Queue()\n"
               "ts = [threading.Thread(target=lambda i=i: q.put(sum(range(i * 1000)))) for i in range(8)]\n"
               "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(q.get() for _ in range(8))[:2])\n"
               "from concurrent.futures import ThreadPoolExecutor\n"
               "with ThreadPoolExecutor(4) as ex:\n    print(list(ex.map(lambda v: v * v, range(10))))\n"
               "ev = threading.Event(); threading.Timer(0.01, ev.set).start(); print(ev.wait(5))",
    "processes": "import multiprocessing as mp, os\nfrom concurrent.futures import ProcessPoolExecutor\n"
                 "def sq(v):\n    return v * v\nif __name__ == '__main__':\n"
                 "    with mp.Pool(2) as p:\n        print(p.map(sq, range(6)))\n"
                 "    with ProcessPoolExecutor(2) as ex:\n        print(list(ex.map(sq, range(4))))\n"
                 "    pid = os.fork()\n    if pid == 0:\n        os._exit(3)\n    print(os.waitpid(pid, 0)[1] >> 8)\n"
                 "    q = mp.Queue(); pr = mp.Process(target=q.put, args=(5,)); pr.start(); print(q.get()); pr.join()",
    "asyncio_signal": "import asyncio, signal, time\nasync def main():\n    await asyncio.sleep(0.01)\n"
                      "    return await asyncio.gather(*(asyncio.sleep(0, result=i) for i in range(3)))\n"
                      "print(asyncio.run(main()))\nsignal.signal(signal.SIGALRM, lambda *a: print('alarm'))\n"
                      "signal.setitimer(signal.ITIMER_REAL, 0.01)\ntime.sleep(0.1)\nsignal.alarm(0)",
    "errors_and_input": "import sys, traceback, warnings, subprocess\nwarnings.warn('w')\n"
                        "try:\n    input()\nexcept EOFError:\n    print('eof')\n"
                        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
                        "print(sys.stdin.isatty(), sys.stdout.isatty())\nraise ValueError('bad')",
    "stdlib_system": "import ctypes, faulthandler, resource, select, os, time, platform, tempfile, shutil, gc\n"
                     "faulthandler.enable()\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0, "
                     "resource.getrlimit(resource.RLIMIT_AS), time.process_time() >= 0, time.thread_time() >= 0, "
                     "os.times().user >= 0, len(os.urandom(8)), os.getloadavg()[0] >= 0, platform.platform()[:5], "
                     "select.select([], [], [], 0.001))\n"
                     "CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))\n"
                     "arr = (ctypes.c_int * 5)(5, 1, 4, 2, 3)\n"
                     "ctypes.CDLL(None).qsort(arr, 5, ctypes.sizeof(ctypes.c_int), CMP(lambda a, b: a[0] - b[0]))\n"
                     "print(list(arr))\nfd, path = tempfile.mkstemp(dir='.')\nos.write(fd, b'abc'); os.close(fd)\n"
                     "os.makedirs('t/u')\nshutil.copy2(path, 't/u/v')\nshutil.copytree('t', 't2')\nshutil.move('t2', 't3')\n"
                     "print(sorted(os.listdir('.')), os.path.getmtime('t/u/v') > 0)\ngc.collect()",
    "numpy_memmap": "import numpy as np\n"
                    "m = np.memmap('m.dat', dtype='float64', mode='w+', shape=(1000,))\nm[:] = 1.0\nm.flush()\n"
                    "print(float(np.memmap('m.dat', dtype='float64', mode='r').sum()))",
    "pandas": "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [4, 5, 6]})\nprint(df.sum().tolist(), df.describe().shape)",
}


def tiny_programs() -> tuple[list[str], list[str]]:
    """PoT and TIR programs of the tiny default's generated problems."""
    from stages.core.sandbox import extract_tir_code
    from stages.data.problems import generate_splits

    rows = generate_splits(0, n_sft=40, n_rl=0, n_test=0, min_steps=1, max_steps=6, max_value=200)["sft"]
    return [r["pot"] for r in rows], [extract_tir_code(r["tir"].split("```output")[0]) for r in rows]


def shared_data() -> Path:
    return Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))


def prompt_programs() -> tuple[list[str], list[str]]:
    """The few-shot prompts' programs: PAL ``solution()`` blocks, and the accumulated code after each code
    block of the tool-integrated (ToRA) examples."""
    from stages.core.sandbox import extract_tir_code

    pal, tir = [], []
    for md in sorted((shared_data() / "pot_tir" / "prompts").glob("*.md")):
        for example in md.read_text(encoding="utf-8").split("---"):
            pieces = example.split("```output")
            for k in range(1, len(pieces)):
                code = extract_tir_code("```output".join(pieces[:k]).rstrip())
                if code:
                    tir.append(code)
            if len(pieces) == 1 and "def solution" in example:
                pal += [b.split("```")[0] for b in example.split("```python")[1:]]
    return pal, tir


class _TracedSubprocess:
    """A stand-in for the sandbox module's ``subprocess`` that starts the zygote under strace."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.n = 0

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    def Popen(self, args, **kw):  # noqa: N802 - mirrors subprocess.Popen
        self.n += 1
        out = self.outdir / f"zygote-{os.getpid()}-{self.n}.trace"
        cmd = ["strace", "-f", "-qq", "-s", "0", "--decode-pids=pidns", "-o", str(out), *args]
        return subprocess.Popen(cmd, **kw)


def trace_into(outdir: Path) -> None:
    sandbox.subprocess = _TracedSubprocess(outdir)  # type: ignore[assignment]
    sandbox.configure()  # a fresh default executor, started under strace on first use


# Syscalls whose arguments the filter checks (or could): which argument values programs really pass.
_ARG_OF = {"ioctl": 1, "fcntl": 1, "prctl": 0, "socketpair": 1, "madvise": 2, "mbind": 2}


def arg_key(name: str, line: str) -> str | None:
    """``name(value)`` for the argument of interest of one traced call (None for other syscalls)."""
    line = line.replace(" <unfinished ...>", ")")
    if name == "clone":
        m = re.search(r"flags=([A-Z_0-9|]+)", line)
        return f"clone({m.group(1) if m else '?'})"
    if name in ("sendto", "sendmsg"):
        return f"{name}(address={'NULL' if 'NULL, 0)' in line or 'msg_name=NULL' in line else 'SET'})"
    if name not in _ARG_OF:
        return None
    args = line.split("(", 1)[1].split(")")[0].split(",")
    i = _ARG_OF[name]
    return f"{name}({args[i].strip() if i < len(args) else '?'})"


class _Life:
    __slots__ = ("post", "names", "eperm", "args", "forced")

    def __init__(self) -> None:
        self.post: bool | None = None
        self.names: Counter[str] = Counter()
        self.eperm: Counter[str] = Counter()
        self.args: Counter[str] = Counter()
        self.forced = False


def count_post_filter(trace: Path) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """(calls, EPERM results, argument values: see :func:`arg_key`) per syscall made after the seccomp filter, in one ``strace -f`` output file.

    A process's lines are post-filter from its ``prctl(PR_SET_SECCOMP)`` on, or entirely when its parent
    was post-filter when it cloned it. Host pids are reused (pid_max is small), so state is per lifetime:
    a pid's lifetime ends at its ``+++ exited/killed +++`` line."""
    live: dict[int, _Life] = {}
    dead: dict[int, _Life] = {}
    lives: list[_Life] = []

    def life(pid: int) -> _Life:
        if pid not in live:
            live[pid] = _Life()
            lives.append(live[pid])
        return live[pid]

    with trace.open(errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            pid = int(m.group(1))
            if m.group(4):
                if m.group(4) == "+++" and pid in live:
                    dead[pid] = live.pop(pid)
                continue
            lf = life(pid)
            name = m.group(2) or m.group(3)
            if name.startswith("syscall_0xffffffff"):  # strace's view of a call cut short by SIGKILL (fork bomb)
                continue
            if m.group(2) == "prctl" and "PR_SET_SECCOMP" in line:
                lf.names.clear()
                lf.eperm.clear()
                lf.args.clear()
                lf.post, lf.forced = True, True
                continue
            if m.group(2):
                lf.names[name] += 1
                key = arg_key(name, line)
                if key:
                    lf.args[key] += 1
            r = RESULT.search(line)
            if r and (m.group(2) and "<unfinished" not in line or m.group(3)):
                if r.group(3) == "EPERM":
                    lf.eperm[name] += 1
                if name in CLONES and int(r.group(1)) > 0:
                    child = int(r.group(2) or r.group(1))
                    target = live.get(child) or dead.get(child) or life(child)
                    if not target.forced:
                        target.post = bool(lf.post)
    calls: Counter[str] = Counter()
    eperm: Counter[str] = Counter()
    argv: Counter[str] = Counter()
    for lf in lives:
        if lf.post:
            calls.update(lf.names)
            eperm.update(lf.eperm)
            argv.update(lf.args)
    return calls, eperm, argv


def run_group(group: str, args: argparse.Namespace) -> None:
    if group == "tests":
        import pytest

        class Plugin:
            def pytest_configure(self, config) -> None:  # noqa: ARG002
                trace_into(Path(os.environ["DSM_TRACE_DIR"]))

        pytest.main(["-q", "-p", "no:cacheprovider", "tests/core/test_sandbox.py",
                     "tests/core/test_sandbox_hostile.py"], plugins=[Plugin()])
        return
    trace_into(Path(os.environ["DSM_TRACE_DIR"]))
    pot, tir = tiny_programs()
    pal_prompts, tora = prompt_programs() if (shared_data() / "pot_tir").is_dir() else ([], [])
    if group == "pot":
        pal = shared_data() / "pot_tir" / "pal_gsmhardv2.jsonl"
        codes = [json.loads(x)["code"] for x in pal.open()][: args.pot_n] if pal.is_file() else []
        res = sandbox.run_many_pot(codes + pal_prompts + pot, timeout_s=60)
        print(f"pot: {sum(r.ok for r, _ in res)}/{len(res)} ok")
    elif group == "tir":
        codes = tora + tir
        res = sandbox.run_many(codes, timeout_s=60)
        print(f"tir: {sum(r.ok for r in res)}/{len(res)} ok")
    elif group == "math":
        for name, code in MATH_PROGRAMS.items():
            r = sandbox.run_python(code, timeout_s=120, memory_mb=1024)
            print(f"math {name}: {r.status} {r.stderr.strip().splitlines()[-1:] if not r.ok else ''}")
    sandbox.get_executor().close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="tests,pot,tir,math")
    ap.add_argument("--pot-n", type=int, default=1319, help="PAL programs to run (all 1319 by default)")
    ap.add_argument("--group", help=argparse.SUPPRESS)  # internal: run one group in this process
    ap.add_argument("--keep", action="store_true", help="keep the raw traces (printed directory)")
    args = ap.parse_args()
    if args.group:
        run_group(args.group, args)
        return
    if not shutil.which("strace"):
        sys.exit("strace not found: apt-get install strace")
    allowed = set(zygote.allowed_syscalls()) | set(zygote.checked_syscalls())
    on_purpose = set(zygote.DENIED_ON_PURPOSE)
    result: dict = {"allow_list_size": len(allowed), "groups": {}}
    used: set[str] = set()
    for group in args.groups.split(","):
        d = Path(tempfile.mkdtemp(prefix=f"dsm-strace-{group}-"))
        env = dict(os.environ, DSM_TRACE_DIR=str(d), PYTHONPATH=str(ROOT))
        subprocess.run([sys.executable, __file__, "--group", group, "--pot-n", str(args.pot_n)], env=env, cwd=ROOT,
                       check=False)
        calls: Counter[str] = Counter()
        eperm: Counter[str] = Counter()
        argv: Counter[str] = Counter()
        for t in sorted(d.glob("*.trace")):
            c, e, a = count_post_filter(t)
            calls.update(c)
            eperm.update(e)
            argv.update(a)
        if args.keep:
            print("traces:", d)
        else:
            shutil.rmtree(d, ignore_errors=True)
        result["groups"][group] = {k: {"calls": calls[k], "eperm": eperm[k]} for k in sorted(calls)}
        result.setdefault("arguments", {})[group] = dict(sorted(argv.items()))
        used |= set(calls)
        print(f"{group}: {len(calls)} distinct syscalls, {sum(calls.values())} calls")
    result["used_not_allowed"] = {
        k: "denied on purpose" if k in on_purpose else "MISSING FROM THE ALLOW-LIST" for k in sorted(used - allowed)}
    result["allowed_not_used"] = sorted(allowed - used)
    out = ROOT / "benchmarks" / "results" / "sandbox_syscalls.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["used_not_allowed"], indent=1))
    print("allowed but not used:", result["allowed_not_used"])
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

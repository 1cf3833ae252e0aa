"""How many CPU threads torch uses, chosen from how busy the machine is.

Torch runs its CPU kernels on OpenMP threads that meet at a barrier after every operation. When another process
competes for the cores, one of the stage's threads is regularly descheduled and the other waits for it (spinning,
which burns the slice the first one needs): beside a busy process, 2 threads on 2 cores run slower than 1 thread,
while on an idle machine 2 threads run faster (benchmarks/thread_policy.py, its results in
benchmarks/results/thread_policy.json). No fixed count is good for both.

:class:`ThreadPolicy` therefore decides between steps: a sampler thread counts, every 0.2 s, the runnable tasks of
the machine (``procs_running`` of /proc/stat) that are not this process's own threads; at each :meth:`ThreadPolicy.step`
the stage uses ``min(limit, cores - others)`` threads (at least 1), where ``others`` is that count averaged over the
last step (:data:`BUSY`: 0.75 of a busy process counts as one). Forward-only work (generation, GRPO's log-prob
passes, evaluation batches), float32 training steps under MKL's strict reproducibility mode (:func:`strict_blas`:
GRPO's update, its continued-SFT baseline) and bf16 training steps of one fixed shape (pretraining, packed SFT)
adapt: their kernels give the same bits at 1 and 2 threads for this project's shapes (torch 2.13;
tests/core/test_threads.py checks the training steps, GRPO's shared-prompt log-prob pass, sampled generation in
float32 and bf16, and decode attention: :func:`invariant_attention`); other training steps hold the limit
(:data:`TRAINING`), so the thread count only changes speed. ``DSM_THREADS=fixed`` turns the adaptation off (every step uses ``limit``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

log = logging.getLogger(__name__)

SAMPLE_S = 0.2
"""Seconds between two samples of the machine's runnable tasks."""
TRAINING = ("float32 training steps follow the load under MKL's strict reproducibility mode (strict_blas), "
            "bf16-autocast steps of one fixed shape too; the others hold the limit")
"""Which training steps adapt (:func:`training_adapts`: the loops' ``step(adapt=...)``, :func:`held` around GRPO's
update). Why (measured on a CPU with AMX: docs/results/speed.md; tests/core/test_threads.py checks the bits):

- **float32**: in MKL's default mode a training step's bits depend on the thread count (its sgemm splits a weight
  gradient's reduction over the tokens by thread count); under MKL's *strict* conditional numerical reproducibility
  mode (:data:`MKL_CBWR`, :func:`strict_blas`) they do not, at no cost that shows. So float32 steps follow the load
  where strict mode is on (every project command: flows/_common.py ``begin``), and hold the limit where it is not (a
  torch without MKL, or MKL used before it could be switched on).
- **bf16 autocast** (oneDNN's kernels, which strict MKL does not govern): the same bits at 1 and 2 threads at
  pretraining's (16, 256) and SFT's (8, 512) batches once the chunked LM head's backward products run on one thread
  (:func:`single`), other bits at many other shapes. Pretraining's stream and SFT's packed rows are one shape
  (``BatchSource.fixed_shape``), so their steps follow the load; bf16 steps of varying shape hold the limit.
- **DeepSpeed** (ZeRO's partitioned reductions, its bf16 mode): not checked, so it holds the limit."""
BUSY = 0.75
"""Other runnable tasks, averaged over a step, that count as one busy process: a process that computes all the time
reads ~1.0; the pipeline's own servers and short-lived helpers, seen runnable in one sample of a few, read 0.25-0.5
and should not halve the threads (at 0.5 they did: 9 of pretraining's 300 steps ran on 1 thread on an idle machine)."""
ENV = "DSM_THREADS"
"""``fixed``: no adaptation (the stage's ``num_threads``, or torch's default, on every step)."""


MKL_CBWR = "AUTO,STRICT"
"""Intel MKL's conditional numerical reproducibility (CNR) mode of the project's processes (the ``MKL_CBWR``
environment variable, set by flows/_common.py ``begin`` unless already set): the code path MKL picks for this CPU
(``AUTO``) in its *strict* mode, whose ?gemm gives the same bits at any thread count (oneMKL Developer Guide,
"Reproducibility Conditions": in strict CNR mode ?gemm, ?symm, ?hemm, ?trsm and their CBLAS forms are bitwise
reproducible "even when the number of threads changes", on the AVX2 and AVX-512 code paths). torch's x86 wheels
link MKL for float32 CPU matrix products; CUDA is not affected. Bits are still specific to the CPU's code path:
another machine may round otherwise."""
_MKL_STRICT = 0x10000
"""MKL_CBWR_STRICT of mkl_cbwr.h."""
_strict: bool | None = None


def _mkl_cbwr() -> Any:
    """MKL's CNR get / set functions in torch's CPU library (exported there as ``mkl_serv_cbwr_get`` / ``_set``), or
    None (a torch without MKL, another platform)."""
    import ctypes

    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get, put = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    put.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
    return get, put


def strict_blas() -> bool:
    """Whether this process's float32 CPU matrix products are in MKL's strict reproducibility mode (:data:`MKL_CBWR`):
    then a float32 training step gives the same bits at 1 and 2 threads (:data:`TRAINING`). Switches it on when MKL
    has not computed anything yet in this process (it reads ``MKL_CBWR`` once, at its first call; a project command
    has it set from the start) and ``MKL_CBWR`` does not ask for another mode; False without MKL, with a non-strict
    ``MKL_CBWR`` of the user's, or when MKL already runs in another mode (a process that multiplied matrices first):
    float32 training steps then hold the thread limit."""
    global _strict
    chosen = os.environ.setdefault("MKL_CBWR", MKL_CBWR)  # for the processes this one starts (ranks)
    if _strict is None or not _strict:
        fns = _mkl_cbwr()
        if fns is None:
            _strict = False
        else:
            get, put = fns
            if not get(-1) & _MKL_STRICT and "STRICT" in chosen.upper():  # MKL_CBWR_ALL
                put(_MKL_STRICT | 2)  # MKL_CBWR_AUTO; refused (MKL_CBWR_ERR_MODE_CHANGE_FAILURE) once MKL has run
            _strict = bool(get(-1) & _MKL_STRICT)
    return _strict


def training_adapts(*, autocast_bf16: bool, fixed_shape: bool, deepspeed: bool = False) -> bool:
    """Whether a training loop's steps may follow the load (:data:`TRAINING`): float32 steps under strict MKL
    (:func:`strict_blas`), bf16-autocast steps of one fixed shape; never under DeepSpeed."""
    if deepspeed:
        return False
    if autocast_bf16:
        return fixed_shape
    return strict_blas()


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _procs_running() -> int | None:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _own_running() -> int:
    """This process's threads in state R (running or runnable) now."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"R":
                    n += 1
        except (OSError, IndexError):
            continue
    return n


class ThreadPolicy:
    """The thread count of one stage's loop (module docstring): ``step()`` between steps (or batches) applies the
    count for the next one and returns it. ``limit``: the most threads (a stage's ``num_threads``; 0 = every core).
    ``stats()``: steps run at each count and the mean count of other runnable tasks seen (for data/timings)."""

    def __init__(self, limit: int = 0, *, adaptive: bool | None = None) -> None:
        import torch

        self.limit = int(limit) if limit and limit > 0 else cores()
        self.cores = cores()
        self.adaptive = (os.environ.get(ENV, "") != "fixed") if adaptive is None else adaptive
        self.adaptive = self.adaptive and self.limit > 1 and _procs_running() is not None
        self.threads = self.limit
        torch.set_num_threads(self.threads)
        self._sum = 0.0
        self._n = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.counts: dict[int, int] = {}
        self.others_total, self.others_n = 0.0, 0
        self._thread: threading.Thread | None = None
        if self.adaptive:
            self._thread = threading.Thread(target=self._sample, name="thread-policy", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            running = _procs_running()
            if running is None:
                continue
            others = max(0, running - _own_running())
            with self._lock:
                self._sum += others
                self._n += 1

    def _set(self, n: int) -> None:
        if n != self.threads:
            import torch

            torch.set_num_threads(n)
            self.threads = n

    def step(self, adapt: bool = True) -> int:
        """Choose the thread count for the next step from the load seen since the previous call; apply it.
        ``adapt=False``: the step runs at the limit whatever the load (a step whose kernels round by thread count:
        training steps, :data:`TRAINING`)."""
        if not self.adaptive or not adapt:
            with self._lock:
                self._sum, self._n = 0.0, 0
            self._set(self.limit if self.adaptive else self.threads)
            self.counts[self.threads] = self.counts.get(self.threads, 0) + 1
            return self.threads
        with self._lock:
            others = self._sum / self._n if self._n else None
            self._sum, self._n = 0.0, 0
        if others is not None:
            self.others_total += others
            self.others_n += 1
            want = max(1, min(self.limit, self.cores - int(others + 1.0 - BUSY)))
            if want != self.threads:
                log.info("torch threads %d -> %d (%.1f other runnable tasks on %d cores)", self.threads, want, others,
                         self.cores)
                self._set(want)
        self.counts[self.threads] = self.counts.get(self.threads, 0) + 1
        return self.threads

    @contextlib.contextmanager
    def held(self, hold: bool = True) -> Any:
        """Inside: the limit's thread count, whatever the load (the update of a GRPO step that adapted for its
        generation and log-prob passes, when :func:`training_adapts` says no: :data:`TRAINING`); after: the count the
        step had. ``hold=False``: the step's count stays (an update that may follow the load)."""
        if not hold:
            yield
            return
        before = self.threads
        self._set(self.limit if self.adaptive else self.threads)
        try:
            yield
        finally:
            self._set(before)

    def stats(self) -> dict[str, Any]:
        """For data/timings: ``steps_at_threads`` {count: steps}, ``others_mean`` and whether it adapted."""
        return {"adaptive": self.adaptive, "limit": self.limit, "strict_blas": strict_blas(),
                "steps_at_threads": {str(k): v for k, v in sorted(self.counts.items())},
                "others_mean": round(self.others_total / self.others_n, 2) if self.others_n else None}

    def close(self) -> None:
        """Stop the sampler thread (the count stays as it is)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def __enter__(self) -> ThreadPolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def max_threads() -> int:
    """The most torch threads this process may use: the current policy's limit, the cores, torch's count now."""
    import torch

    return max(torch.get_num_threads(), cores(), _current.limit if _current is not None else 0)


def invariant_attention(input_ids: Any, heads: int = 1) -> contextlib.AbstractContextManager[Any]:
    """Around a forward whose ``input_ids`` hold one position per row (a decode step of generation), on the CPU:
    scaled-dot-product attention by its math backend (two matmuls and a softmax) when the step has fewer
    (row, head) pairs than :func:`max_threads`, else torch's default (flash) kernel.

    Why (``benchmarks/decode_attention.py``, benchmarks/results/decode_attention.json): at decode shapes every kernel
    gives the same bits at any thread count while rows x heads >= the thread count; with fewer pairs than threads the
    flash kernel also splits one query's keys across threads, which rounds by thread count, and the math backend holds
    out to longer key lengths. So the small steps take the math backend, which makes sampled tokens and log-probs
    independent of the count :class:`ThreadPolicy` chooses from the load for every shape the tests check (the tiny
    default: 4 heads, 2 cores, always the flash kernel). The math backend is not the default for all steps because in
    bf16 on the CPU it is several times slower than the flash kernel at decode shapes (docs/results/speed.md). Several query
    positions keep the default kernel (thread-count invariant in the forward; a cached pass over a single position also
    rounds its gradients by thread count, so the log-prob passes do not share a prompt for 2-token completions:
    stages/rl/rollout.py)."""
    if getattr(input_ids, "device", None) is None or input_ids.device.type != "cpu" or input_ids.shape[-1] != 1:
        return contextlib.nullcontext()
    if input_ids.shape[0] * max(1, int(heads)) >= max_threads():
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


@contextlib.contextmanager
def single(enabled: bool = True) -> Any:
    """Inside: torch on 1 thread (the count before is restored after; ``enabled=False``: nothing changes, e.g. for
    tensors on an accelerator). For a product whose reduction oneDNN would otherwise split across threads at some
    shapes, so that its bits depend on the thread count: the chunked LM
    head's backward products (stages/core/logprobs.py; in bf16 on an AMX CPU their bits differ between 1 and 2
    threads at some row counts). Its small cost (docs/results/speed.md) is the price of letting pretraining's steps
    follow the load (:data:`TRAINING`)."""
    import torch

    before = torch.get_num_threads()
    if not enabled or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_current: ThreadPolicy | None = None


def use(limit: int = 0) -> ThreadPolicy:
    """Start the policy of this process's stage (``limit``: its ``num_threads``), replacing (and stopping) the one
    before; the loops then call :func:`step`."""
    global _current
    if _current is not None:
        _current.close()
    strict_blas()  # as early as the stage starts (a project command set MKL_CBWR before anything ran)
    _current = ThreadPolicy(limit)
    return _current


def step(adapt: bool = True) -> int | None:
    """:meth:`ThreadPolicy.step` of the current policy (None when no stage started one: nothing changes)."""
    return _current.step(adapt) if _current is not None else None


def held(hold: bool = True) -> contextlib.AbstractContextManager[Any]:
    """:meth:`ThreadPolicy.held` of the current policy (nothing when no stage started one)."""
    return _current.held(hold) if _current is not None else contextlib.nullcontext()


def stats() -> dict[str, Any] | None:
    """:meth:`ThreadPolicy.stats` of the current policy, or None."""
    return _current.stats() if _current is not None else None

# Run at the start of every Python process of a venv (through the one-line dsm_import_trace.pth that .ci/slow puts in
# its site-packages) while DSM_IMPORT_TRACE names a directory: at the process's end (normal exit, or os._exit as
# forked workers end), it writes the names of the project's modules the process imported to <dir>/<pid>.txt. So a
# group of .ci/slow learns which files its tests executed, in every process they started (dvc repro, the stage
# server's forks, torchrun ranks), without a coverage tracer's cost.
import atexit
import os
import sys

_out = os.environ.get("DSM_IMPORT_TRACE")
if _out:
    _roots = ("flows", "stages", "tests", "benchmarks")

    def _main_name() -> str:
        """The module a ``python -m X`` / ``python path/to/x.py`` process runs as ``__main__``."""
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            return spec.name
        parts = os.path.abspath(getattr(main, "__file__", "") or "").removesuffix(".py").split(os.sep)
        starts = [i for i, p in enumerate(parts) if p in _roots]
        return ".".join(parts[starts[-1]:]) if starts else ""

    def _dump() -> None:
        try:
            names = sorted({n for n in [*list(sys.modules), _main_name()] if n.split(".")[0] in _roots})
            with open(os.path.join(_out, f"{os.getpid()}.txt"), "a", encoding="utf-8") as f:
                f.write("\n".join(names) + "\n")
        except Exception:  # noqa: BLE001 - never fail the traced process
            pass

    atexit.register(_dump)
    _exit = os._exit

    def _traced_exit(code: int) -> None:
        _dump()
        _exit(code)

    os._exit = _traced_exit

"""The answer-checking worker: ``python -m stages.core._answers_worker``.

Protocol (one JSON object per line): it prints ``{"ready": true}`` once its imports are done, then for
every request line on stdin answers ``{"id": n, "ok": bool}`` on stdout (``null`` for an ``mv`` request whose gold
math-verify cannot read). Requests:
``{"id": n, "op": "check", "mode": "deepseekmath" | "strict", "pred": str, "gold": str, "pv": bool}`` (the mode's
full rules; ``op`` and ``mode`` default to ``check`` / ``deepseekmath``) and ``{"id": n, "op": "mv", "text": str,
"gold": str}`` (math-verify's own verdict on a whole output). It exits at end of input (its parent closed the pipe or died).
The parent (:mod:`stages.core.answers`) kills it when a check runs past its time limit, which is how
the timeout works in any thread. Its address space is capped (``ANSWERS_WORKER_MEM_MB``, default
4096 MiB) so a pathological expression fails with MemoryError instead of exhausting the machine.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _limit_memory() -> None:
    try:
        import resource

        mb = int(os.environ.get("ANSWERS_WORKER_MEM_MB", "4096"))
        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    except (ImportError, ValueError, OSError):
        pass


def main() -> None:
    """Serve equivalence checks until stdin closes."""
    _limit_memory()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent; we stop at end of input
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol
    from stages.core._answers_symbolic import full_check, math_verify_verdict

    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            if req.get("op", "check") == "mv":
                ok = math_verify_verdict(req["text"], req["gold"])
            else:
                ok = full_check(req["pred"], req["gold"], bool(req.get("pv", True)), req.get("mode", "deepseekmath"))
        except (Exception, RecursionError, MemoryError):  # noqa: BLE001 - a failed check is "not equivalent"
            ok = False
        out.write(json.dumps({"id": req["id"], "ok": ok}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

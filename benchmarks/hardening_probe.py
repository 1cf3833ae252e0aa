"""Issue 28's params, tool-output and file findings, probed through whichever checkout is on PYTHONPATH, with only
the interfaces both main before issue 28 and today's code have: what docs/sandbox.md's before / after table shows.

    PYTHONPATH=<checkout> python benchmarks/hardening_probe.py [--only CASE ...]

Each case prints one line: its name and what happened (a one-line PipelineError, a traceback's exception, accepted,
the seconds and peak memory of the YAML alias bomb in a child process capped at 60 s and 4 GB). The test files
(tests/schema/test_base.py, tests/core/test_tool_output_text.py, tests/core/test_corrupt_files.py) assert today's
behaviour; they use today's helpers, so they cannot run on main.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _root() -> Path:
    import stages

    return Path(stages.__file__).resolve().parent.parent


def _raw() -> dict:
    from stages.params import resolve

    return resolve(_root() / "params.yaml")


def _keys(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _keys(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _set(raw: dict, key: str, value) -> dict:
    node = raw
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return raw


def _outcome(fn: Callable[[], object]) -> str:
    from stages.core.errors import PipelineError

    try:
        fn()
    except PipelineError as e:
        return f"one-line error: {str(e)[:150]}"
    except Exception as e:  # noqa: BLE001
        return f"traceback: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    return "accepted"


def case_params_inf() -> list[str]:
    from stages.params import parse_params

    raw = _raw()
    out = []
    for want in ("exec_timeout_s", "lr"):
        key = next(k for k, v in _keys(raw) if k.startswith("grpo.") and k.endswith("." + want) or k == f"grpo.{want}")
        out.append(f"grpo {want} = .inf: " + _outcome(lambda k=key: parse_params(_set(copy.deepcopy(raw), k, math.inf))))
    key = next(k for k, v in _keys(raw) if k.startswith("grpo.") and k.endswith("exec_timeout_s"))
    out.append("exec_timeout_s = 3e6: " + _outcome(lambda: parse_params(_set(copy.deepcopy(raw), key, 3e6))))
    return out


def case_sandbox_inf() -> list[str]:
    from stages.core import sandbox

    return ["run_python(timeout_s=inf): " + _outcome(lambda: sandbox.run_python("print(1)", timeout_s=math.inf))]


BOMB = "\n".join(["l0: &l0 [" + ", ".join([f'"{"lol" * 300}"'] * 9) + "]"]
                 + [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 40)]) + "\n"


def case_alias_bomb() -> list[str]:
    """The entry point's first step on a params file with a ~12 KB alias bomb appended, in a child process."""
    d = Path(tempfile.mkdtemp(prefix="dsm-bomb-"))
    try:
        p = d / "params.yaml"
        p.write_text((_root() / "params.yaml").read_text() + BOMB)
        code = ("import sys, time, resource; t = time.perf_counter()\n"
                "from stages.params import load_params\n"
                "from stages.core.errors import PipelineError\n"
                f"try:\n    load_params({str(p)!r}); print('accepted')\n"
                "except PipelineError as e:\n    print('one-line error:', str(e)[:120])\n"
                "except MemoryError:\n    print('MemoryError')\n"
                "print(round(time.perf_counter() - t, 2), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

        t = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=cap)
            lines = r.stdout.strip().splitlines()
            if len(lines) >= 2:
                s, mb = lines[-1].split()
                return [f"12 KB alias bomb ({len(BOMB)} bytes): {lines[-2][:140]} after {s} s, peak {mb} MB"]
            return [f"12 KB alias bomb: died ({r.returncode}) after {time.perf_counter() - t:.1f} s: "
                    f"{r.stderr.strip().splitlines()[-1][:100] if r.stderr.strip() else ''}"]
        except subprocess.TimeoutExpired:
            return [f"12 KB alias bomb: still running after {time.perf_counter() - t:.0f} s (killed; 4 GB cap)"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _tok():
    from stages.base_model import train_tokenizer

    texts = [f"print({i}) ```output {i} </s> So the answer is {i}." for i in range(200)]
    return train_tokenizer(texts, 400)


def case_tokens() -> list[str]:
    from stages.core.generation import Completion, SamplingParams
    from stages.core.tool_loop import TIR_STOP, run_loop
    from stages.train.data import make_example

    tok = _tok()
    code = " Check.\n```python\nprint('done<' '/s>')\n```\n```output"

    class Gen:
        tokenizer = tok

        def __init__(self) -> None:
            self.calls = []

        def _c(self, ctx: str) -> Completion:
            text = code if "```output" not in ctx.split("Assistant:")[-1] else " So 5."
            ids = tok(text, add_special_tokens=False)["input_ids"] + ([] if text.endswith(TIR_STOP) else [tok.eos_token_id])
            return Completion(text, ids, [0.0] * len(ids), "stop")

        def generate(self, prompts, sp):
            self.calls.append(list(prompts))
            return [[self._c(p) for _ in range(sp.n)] for p in prompts]

        def generate_ids(self, ids, sp):
            self.calls.append([list(x) for x in ids])
            return [[self._c(tok.decode(x, skip_special_tokens=True)) for _ in range(sp.n)] for x in ids]

    sp = lambda r, c: SamplingParams(temperature=0.0, max_new_tokens=16)  # noqa: E731
    prompt = "User: 2+3?\n\nAssistant:"
    g = Gen()
    st = run_loop(g, [prompt], "tir", sp, carry="tokens", tokenizer=tok)[0][0]
    injected = [i for i, m in zip(st.token_ids, st.policy_mask, strict=True) if m == 0]
    out = [f"RL rollout (token carry), a program prints '</s>': EOS ids injected = {injected.count(tok.eos_token_id)}"]
    g = Gen()
    run_loop(g, [prompt], "tir", sp, carry="text")
    ids = tok(g.calls[1][0], add_special_tokens=True)["input_ids"]
    out.append(f"evaluation (text carry): EOS ids in the next round's prompt = {ids.count(tok.eos_token_id)}")
    ex = make_example(tok, prompt, " Check.\n```output\n</s>\n```\nSo 1.")
    target = [i for i in ex.labels if i != -100]
    out.append(f"SFT target with '</s>' in an output block: EOS ids = {target.count(tok.eos_token_id)} (1 = only the end)")
    return out


def _parquet(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": [f"q{i}" * 20 for i in range(3000)], "answer": ["1"] * 3000}), path,
                   row_group_size=1000)
    off = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(b"\xff" * 48)
    return path


def case_files() -> list[str]:
    import datasets

    from stages import base_model
    from stages.core.ingestion import read_source
    from stages.core.model_files import model_dir_problem
    from stages.core.modeling import save_model
    from stages.schema.base_model import BaseModelParams

    d = Path(tempfile.mkdtemp(prefix="dsm-files-"))
    out = []
    try:
        f = _parquet(d / "x.parquet")
        out.append("Parquet, corrupt data page: " + _outcome(lambda: list(read_source(f))))
        ds = d / "ds"
        datasets.Dataset.from_dict({"question": ["q"] * 2000, "answer": ["1"] * 2000}).save_to_disk(ds)
        arrow = next(ds.glob("*.arrow"))
        with open(arrow, "r+b") as h:
            h.truncate(arrow.stat().st_size // 2)
        out.append("datasets directory, truncated arrow file: " + _outcome(lambda: list(read_source(ds))))
        from stages.params import resolve
        raw = resolve(_root() / "params.yaml")["base_model"]
        raw.update(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, num_kv_heads=2, vocab_size=400)
        tok = _tok()
        good = d / "good"
        save_model(base_model.init_model(BaseModelParams.model_validate(raw), tok), tok, good)

        def broken(name: str, edit: Callable[[Path], None]) -> None:
            m = d / name
            shutil.copytree(good, m)
            edit(m)
            work = d / f"run-{name}"
            work.mkdir()
            import os

            cwd = os.getcwd()
            os.chdir(work)
            try:
                res = _outcome(lambda: base_model.run(BaseModelParams.model_validate({**raw, "checkpoint": str(m)})))
            finally:
                os.chdir(cwd)
            out.append(f"{name}: model_dir_problem: {model_dir_problem(m)}; base_model stage: {res}")

        def truncate(m: Path) -> None:
            f = m / "model.safetensors"
            with open(f, "r+b") as h:
                h.truncate(f.stat().st_size // 2)

        def drop_tensor(m: Path) -> None:
            from safetensors.torch import load_file, save_file

            sd = load_file(m / "model.safetensors")
            del sd[next(k for k in sd if "layers.0.mlp" in k)]
            save_file(sd, m / "model.safetensors", metadata={"format": "pt"})

        def bad_tokenizer(m: Path) -> None:
            t = (m / "tokenizer.json").read_text()
            (m / "tokenizer.json").write_text(t[: len(t) // 2])

        broken("model.safetensors truncated to half", truncate)
        broken("a tensor missing", drop_tensor)
        broken("tokenizer.json cut in half", bad_tokenizer)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


CASES = {"params_inf": case_params_inf, "sandbox_inf": case_sandbox_inf, "alias_bomb": case_alias_bomb,
         "tokens": case_tokens, "files": case_files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    args = ap.parse_args()
    print(f"checkout: {_root()}")
    result = {}
    for name, fn in CASES.items():
        if args.only and name not in args.only:
            continue
        try:
            lines = fn()
        except Exception as e:  # noqa: BLE001
            lines = [f"probe failed: {type(e).__name__}: {e}"]
        result[name] = lines
        for line in lines:
            print(f"{name:12} {line}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

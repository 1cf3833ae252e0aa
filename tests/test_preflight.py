"""Bad input of every kind is refused before any work (stages/preflight.py, stages/params.py): exit status 2, one line
naming the key or file and the fix, no traceback, every output untouched.

The cases run against a project copy whose data, corpus and base_model stages are done (their outputs are what
must stay untouched). Each case writes a bad params file (or bad data / model files it points at) and runs a stage's
command; ``python tests/test_preflight.py`` prints the table of cases (docs/robustness.md shows it).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.params import resolve
from tests.flows._project import env, make_project, run, set_key, tree_hash

# (case id, stage, what it breaks, edit(raw params, project) -> raw params or None (then: a raw YAML text), expected)
Edit = Callable[[dict[str, Any], Path], Any]


def _rows_file(project: Path, name: str, lines: list[str]) -> str:
    f = project / "bad" / name
    f.parent.mkdir(exist_ok=True)
    f.write_text("".join(line + "\n" for line in lines))
    return str(f.relative_to(project))


def _problems_dir(project: Path, split: str, lines: list[str] | None) -> str:
    """A copy of data/generated/problems with ``split``.jsonl replaced by ``lines`` (None: the file removed)."""
    d = project / "bad" / f"problems-{split}-{len(lines or [])}"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(project / "data" / "generated" / "problems", d)
    if lines is None:
        (d / f"{split}.jsonl").unlink()
    else:
        (d / f"{split}.jsonl").write_text("".join(line + "\n" for line in lines))
    return str(d.relative_to(project))


def _model_dir(project: Path, name: str, *, config: str | None = '{"model_type": "llama"}', weights: bool = True,
               tokenizer: bool = True) -> str:
    """A copy of data/models/base with parts missing or broken."""
    d = project / "bad" / name
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(project / "data" / "models" / "base", d)
    if config is None:
        (d / "config.json").unlink()
    elif config != "keep":
        (d / "config.json").write_text(config)
    if not weights:
        (d / "model.safetensors").unlink()
    if not tokenizer:
        (d / "tokenizer.json").unlink()
    return str(d.relative_to(project))


_SFT_ROW = ('{"id": "s1", "question": "What is 2 + 3?", "answer": "5", "cot": "2 + 3 = 5. The answer is 5.", '
            '"pot": "def solution():\\n    return 2 + 3", "tir": "2 + 3 = 5"}')
_NO_SOLUTION_ROW = '{"id": "p2", "question": "What is 4 + 4?", "answer": "8"}'
_GOOD_ROW = '{"id": "p1", "question": "Tom has 2 apples and gets 3 more. How many?", "answer": "5", "cot": "2 + 3 = 5"}'

CASES: list[tuple[str, str, str, Edit, str]] = [
    # params: schema, cross-field constraints, YAML
    ("negative count", "data", "params", lambda r, p: set_key(r, "data.problems.n_test", -1),
     "data.problems.n_test: Input should be greater than 0"),
    ("min above max", "data", "params", lambda r, p: set_key(r, "data.problems.min_steps", 3) and
     set_key(r, "data.problems.max_steps", 2), "min_steps (3) > problems.max_steps (2)"),
    ("unknown key", "data", "params", lambda r, p: set_key(r, "data.problems.n_tests", 5),
     "data.problems.n_tests: unknown key"),
    ("head shapes", "base_model", "params", lambda r, p: set_key(r, "base_model.hidden_size", 100),
     "head size hidden_size / num_heads = 50; use a multiple of 16"),
    ("format shares", "sft", "params", lambda r, p: set_key(r, "sft.formats.cot", 0.9),
     "sft.formats: format shares cot + pot + tir must sum to 1"),
    ("runtime key in the tracked section", "grpo", "params", lambda r, p: set_key(r, "grpo.checkpoint_every", 5),
     "grpo.checkpoint_every: a runtime value"),
    ("launcher without ranks", "sft", "params", lambda r, p: set_key(r, "sft.launcher.nproc_per_node", 2),
     "kind none runs one process, but nproc_per_node x nnodes = 2"),
    ("no benchmark", "evaluate", "params", lambda r, p: set_key(r, "evaluate.common.benchmarks", []),
     "evaluate.common.benchmarks: name at least one test set to evaluate"),
    ("custom weights", "grpo", "params", lambda r, p: set_key(r, "grpo.reward.custom_weights", [1.0]),
     "custom has 0 entries but custom_weights 1"),
    ("custom reward import", "grpo", "params", lambda r, p: set_key(r, "grpo.reward.custom", ["no_such_mod:fn"]) and
     set_key(r, "grpo.reward.custom_weights", [1.0]), "grpo.reward.custom: cannot import 'no_such_mod:fn'"),
    ("seq_len above the context", "pretrain", "params", lambda r, p: set_key(r, "pretrain.train.seq_len", 1024),
     "pretrain.train.seq_len: 1024 is above the start model's context length 512"),
    ("YAML: duplicate key", "data", "yaml",
     lambda r, p: yaml.safe_dump(r, sort_keys=False).replace("  seed: 0\n", "  seed: 0\n  seed: 1\n", 1),
     "key 'seed' appears twice"),
    ("YAML: 040 is octal", "grpo", "yaml",
     lambda r, p: yaml.safe_dump(r, sort_keys=False).replace("  steps: 40\n", "  steps: 040\n", 1),
     "'040' is read as the number 32"),
    ("YAML: yes is a boolean", "corpus", "yaml",
     lambda r, p: yaml.safe_dump(r, sort_keys=False).replace("    approve: auto\n", "    approve: yes\n", 1),
     "'yes' is read as true"),
    # input files and directories
    ("missing crawl", "corpus", "file", lambda r, p: set_key(r, "corpus.crawl_path", "data/none/crawl.jsonl"),
     "corpus.crawl_path: data/none/crawl.jsonl not found"),
    ("missing decontamination set", "corpus", "file",
     lambda r, p: set_key(r, "corpus.decontam.testsets", "bad/testsets"),
     "corpus.decontam.testsets: bad/testsets not found"),
    ("missing approved list", "corpus", "file", lambda r, p: set_key(r, "corpus.domains.approve", "bad/approved.tsv"),
     "corpus.domains.approve: bad/approved.tsv not found"),
    ("missing problem split", "corpus", "file",
     lambda r, p: set_key(r, "corpus.problems_dir", _problems_dir(p, "rl", None)), "rl.jsonl not found"),
    ("missing mixture source", "pretrain", "file",
     lambda r, p: set_key(r, "pretrain.mixture", [{"path": "data/corpus/math_corpus.jsonl", "ratio": 0.5},
                                                  {"path": "bad/code.jsonl", "ratio": 0.5}]),
     "pretrain.mixture[1].path: bad/code.jsonl not found"),
    ("missing prompt file", "grpo", "file", lambda r, p: set_key(r, "grpo.prompts_file", "bad/prompts.jsonl"),
     "grpo.prompts_file: bad/prompts.jsonl not found"),
    ("missing hostfile", "sft", "file", lambda r, p: set_key(r, "runtime.sft.launcher.hostfile", "bad/hosts") and
     set_key(r, "runtime.sft.launcher.kind", "deepspeed"), "runtime.sft.launcher.hostfile: bad/hosts not found"),
    # rows
    ("row without answer", "corpus", "rows",
     lambda r, p: set_key(r, "corpus.problems_dir", _problems_dir(p, "sft", [_GOOD_ROW, '{"question": "What is 2+2?"}'])),
     "sft.jsonl:2: SFT problem row has no non-empty 'answer' (missing)"),
    ("empty RL split", "corpus", "rows", lambda r, p: set_key(r, "corpus.problems_dir", _problems_dir(p, "rl", [])),
     "rl.jsonl: no RL problem rows in the file"),
    ("prompt row without question", "grpo", "rows",
     lambda r, p: set_key(r, "grpo.prompts_file", _rows_file(p, "prompts.jsonl", [_GOOD_ROW, "", '{"answer": "4"}'])),
     "prompts.jsonl: row 2 has no non-empty string 'question'"),
    ("prompt rows without the reward source's field", "grpo", "rows",
     lambda r, p: set_key(r, "grpo.prompts_file", _rows_file(p, "novalues.jsonl", [_GOOD_ROW]))
     and set_key(r, "grpo.reward.source", "process_rule"),
     "grpo.reward.source process_rule needs a 'values' field in every row of bad/novalues.jsonl; 1 of 1 rows"),
    ("malformed JSON line", "sft", "rows",
     lambda r, p: set_key(r, "sft.problems", _rows_file(p, "sft.jsonl", [_SFT_ROW, '{"question": "x", "answer": '])),
     "sft.jsonl:2: malformed JSONL line"),
    ("SFT row without any solution", "sft", "rows",
     lambda r, p: set_key(r, "sft.problems", _rows_file(p, "sft2.jsonl", [_SFT_ROW, _NO_SOLUTION_ROW])),
     "sft2.jsonl: SFT row 2 (p2) has no solution (cot, pot or tir)"),
    # model directories
    ("checkpoint without config", "base_model", "model",
     lambda r, p: set_key(r, "base_model.checkpoint", _model_dir(p, "noconfig", config=None)), "no config.json"),
    ("config not JSON", "base_model", "model",
     lambda r, p: set_key(r, "base_model.checkpoint", _model_dir(p, "badconfig", config="{not json")),
     "has a config.json that is not valid JSON"),
    ("checkpoint without weights", "base_model", "model",
     lambda r, p: set_key(r, "base_model.checkpoint", _model_dir(p, "noweights", weights=False)),
     "base_model.checkpoint: bad/noweights has no weights"),
    ("checkpoint without tokenizer", "base_model", "model",
     lambda r, p: set_key(r, "base_model.checkpoint", _model_dir(p, "notok", config="keep", tokenizer=False)),
     "base_model.checkpoint: bad/notok has no tokenizer"),
    ("evaluated model missing", "evaluate", "model",
     lambda r, p: set_key(r, "evaluate.models.sft.path", "bad/models/none"),
     "evaluate.models.sft.path: bad/models/none not found"),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, prefect_api: str) -> Path:
    """A tiny project whose data, corpus and base_model stages are done."""
    proj = make_project(tmp_path_factory.mktemp("preflight") / "proj")
    run(["dvc", "repro", "base_model", "corpus"], proj, env(prefect_api))
    return proj


def _flow(stage: str) -> Callable[[list[str]], int]:
    """The ``python -m flows.<stage>`` entry as a function of argv (called in this process: no start-up cost)."""
    import importlib

    from flows._common import main

    if stage == "evaluate":
        from flows.evaluate import cli

        return lambda argv: cli([*argv, "--model", "sft"])
    mod = importlib.import_module(f"flows.{stage}")
    fn = getattr(mod, f"{stage}_flow")
    return lambda argv: main(fn, stage, argv)


def run_case(project: Path, case: tuple[str, str, str, Edit, str], capsys: Any, monkeypatch: Any) -> dict[str, Any]:
    """Run one case in ``project``; return exit code, stderr lines and whether data/ is unchanged."""
    name, stage, _, edit, _ = case
    raw = resolve(project / "params.yaml")
    out = edit(raw, project)
    bad = project / "bad" / "params.yaml"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text(out if isinstance(out, str) else yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(project)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    before = tree_hash(project / "data")
    capsys.readouterr()
    try:
        code = _flow(stage)(["--params", str(bad.relative_to(project))])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    err = capsys.readouterr().err
    return {"case": name, "stage": stage, "code": code, "lines": [x for x in err.splitlines() if x.strip()],
            "untouched": tree_hash(project / "data") == before, "stderr": err}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_any_work(case: tuple[str, str, str, Edit, str], project: Path, capsys: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    r = run_case(project, case, capsys, monkeypatch)
    assert r["code"] == 2, r["stderr"][-2000:]
    assert len(r["lines"]) == 1 and r["lines"][0].startswith("error: "), r["stderr"][-2000:]
    assert case[4] in r["lines"][0], r["lines"][0]
    assert "Traceback" not in r["stderr"]
    assert r["untouched"], f"{case[0]}: data/ changed"


def test_pipeline_refuses_bad_input_before_dvc_removes_outputs(project: Path) -> None:
    """The pipeline checks every stage it will run (those whose inputs an earlier stage writes excepted) before
    any stage runs: a bad input of the last stage leaves every earlier output in place."""
    raw = resolve(project / "params.yaml")
    set_key(raw, "corpus.decontam.testsets", "bad/testsets")
    set_key(raw, "data.seed", 7)  # data would re-run (and DVC would delete data/generated first)
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    before = tree_hash(project / "data")
    try:
        out = run([sys.executable, "-m", "flows.pipeline", "corpus"], project, env(), check=False, timeout=300)
    finally:
        run(["git", "checkout", "params.yaml"], project)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and lines == ["error: corpus.decontam.testsets: bad/testsets not found; run the "
                                             "testsets stage (dvc repro testsets) or fix the path"], out.stderr[-2000:]
    assert tree_hash(project / "data") == before
    assert not (project / ".prefect" / "servers" / "api.json").exists()  # refused before any server started


def test_under_dvc_repro_the_error_names_the_restoring_command(project: Path, prefect_api: str) -> None:
    """Plain ``dvc repro`` deletes a stage's outputs before its command runs; the one line says how to get them back,
    and that command does. (A missing input file is refused by DVC itself, before it deletes anything: every input
    named in params is a dvc dependency; an existing directory without pages passes DVC and is refused here.)"""
    before = tree_hash(project / "data" / "corpus")
    raw = resolve(project / "params.yaml")
    (project / "bad" / "nocrawl").mkdir(parents=True, exist_ok=True)
    (project / "bad" / "nocrawl" / "README").write_text("no pages here\n")
    set_key(raw, "corpus.crawl_path", "bad/nocrawl")
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        out = run(["dvc", "repro", "corpus"], project, env(prefect_api), check=False, timeout=300)
    finally:
        run(["git", "checkout", "params.yaml"], project)
    errors = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert out.returncode != 0 and len(errors) == 1, out.stdout[-1500:] + out.stderr[-1500:]
    assert "corpus.crawl_path: bad/nocrawl holds no *.jsonl or *.parquet files" in errors[0]
    assert "`dvc checkout corpus` restores the last recorded ones" in errors[0]
    assert "Traceback" not in out.stdout + out.stderr
    assert not (project / "data" / "corpus").exists()  # DVC removed it before the command ran
    run(["dvc", "checkout", "corpus"], project)
    assert tree_hash(project / "data" / "corpus") == before


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the cases (docs/robustness.md)."""
    out = ["| # | case | stage | kind | exit | the line | outputs untouched |", "|---|---|---|---|---|---|---|"]
    kinds = {c[0]: c[2] for c in CASES}
    for i, r in enumerate(rows, 1):
        line = r["lines"][0] if len(r["lines"]) == 1 else " / ".join(r["lines"])
        out.append(f"| {i} | {r['case']} | {r['stage']} | {kinds[r['case']]} | {r['code']} | `{line}` | "
                   f"{'yes' if r['untouched'] else 'NO'} |")
    return "\n".join(out)


if __name__ == "__main__":  # print the table: python tests/test_preflight.py
    import contextlib
    import io
    import os
    import tempfile

    class _Cap:
        def __init__(self) -> None:
            self.buf = io.StringIO()

        def readouterr(self) -> Any:
            v = self.buf.getvalue()
            self.buf.truncate(0)
            self.buf.seek(0)
            return type("R", (), {"err": v, "out": ""})()

    class _MP:
        def chdir(self, p: Path) -> None:
            os.chdir(p)

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's flows and stages
    with tempfile.TemporaryDirectory() as d:
        proj = make_project(Path(d) / "proj")
        run(["dvc", "repro", "base_model", "corpus"], proj, env())
        cap, rows = _Cap(), []
        for c in CASES:
            with contextlib.redirect_stderr(cap.buf):
                rows.append(run_case(proj, c, cap, _MP()))
        os.chdir("/")
        print(table(rows))
        print(json.dumps({"cases": len(rows), "all_exit_2": all(r["code"] == 2 for r in rows),
                          "all_untouched": all(r["untouched"] for r in rows)}))

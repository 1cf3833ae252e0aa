"""What every params schema and YAML read share (stages/schema/base.py): no infinite or
NaN number anywhere, bounded timeouts / pool sizes / counts, and no YAML anchors or aliases (issue 28, item 3).
Each bad input is one line naming the file and the key, within a second."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.core.errors import PipelineError
from stages.params import parse_params, resolve
from stages.schema.base import MAX_COUNT, MAX_TIMEOUT_S, load_yaml, read_params_file

ROOT = Path(__file__).resolve().parents[2]


_RAW = resolve(ROOT / "params.yaml")


def _raw() -> dict[str, Any]:
    return copy.deepcopy(_RAW)


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _leaves(v, f"{prefix}{k}.")]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _leaves(v, f"{prefix}{i}.")]
    return [(prefix[:-1], node)]


def _set(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    node: Any = raw
    *parents, last = key.split(".")
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return raw


def _one_line_error(raw: dict[str, Any]) -> str:
    with pytest.raises(PipelineError) as e:
        parse_params(raw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


NUMBERS = [(k, v) for k, v in _leaves(_raw()) if isinstance(v, (int, float)) and not isinstance(v, bool)]


def test_every_number_of_params_yaml_refuses_infinity_and_nan():
    """Each numeric value of the committed file (floats and ints, every section, runtime included), set to .inf,
    -.inf or .nan: one line naming that key."""
    assert len(NUMBERS) > 50
    bad = {}
    for i, (key, _) in enumerate(NUMBERS):
        value = (math.inf, -math.inf, math.nan)[i % 3]
        try:
            parse_params(_set(_raw(), key, value))
        except PipelineError as e:
            msg = str(e)
            where = key.removeprefix("runtime.")
            if where not in msg or "\n" in msg or not ("finite" in msg or "greater" in msg or "less" in msg):
                bad[key] = msg[:160]
        else:
            bad[key] = "accepted"
    assert bad == {}


TIMEOUTS = [k for k, _ in NUMBERS if k.endswith("timeout_s")]


@pytest.mark.parametrize("key", TIMEOUTS)
def test_timeouts_are_bounded(key):
    assert len(TIMEOUTS) >= 4  # grpo, evaluate, ingest, testsets
    assert "finite" in _one_line_error(_set(_raw(), key, math.inf))
    assert f"less than or equal to {MAX_TIMEOUT_S:g}" in _one_line_error(_set(_raw(), key, 3e6))  # ~ the old overflow
    assert key in _one_line_error(_set(_raw(), key, 0.0))


def test_learning_rate_infinity_is_refused():
    key = next(k for k, _ in NUMBERS if k.startswith("grpo.") and k.endswith(".lr") or k == "grpo.lr")
    assert key in _one_line_error(_set(_raw(), key, math.inf))


def test_pool_sizes_and_counts_are_bounded():
    key = next(k for k, _ in NUMBERS if k.endswith("exec_workers"))
    assert "less than or equal to 1024" in _one_line_error(_set(_raw(), key, 10**6))
    assert "less than or equal to" in _one_line_error(_set(_raw(), "data.problems.n_sft", MAX_COUNT * 2))


def test_the_sandbox_refuses_a_non_finite_timeout_with_a_clear_error():
    """What the schema now stops was an OverflowError deep in the sandbox for every program."""
    from stages.core import sandbox

    for kw in ({"timeout_s": math.inf}, {"timeout_s": 1e7}, {"memory_mb": math.nan}, {"cpus": 0}):
        with pytest.raises(ValueError, match="sandbox: .* must be a finite number in"):
            sandbox.run_python("print(1)", **kw)


BOMB = "\n".join(
    ["l0: &l0 [" + ", ".join([f'"{"lol" * 300}"'] * 9) + "]"]
    + [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 40)]
) + "\n"


def test_a_yaml_alias_bomb_is_one_line_at_once(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(_raw()) + BOMB)
    assert 10_000 < len(BOMB) < 14_000  # a ~12 KB bomb: 9^40 strings of 900 characters once expanded
    t = time.perf_counter()
    with pytest.raises(PipelineError) as e:
        read_params_file(p)
    assert time.perf_counter() - t < 1.0
    msg = str(e.value)
    assert msg.startswith(f"{p}: line ") and "anchors and aliases" in msg and "\n" not in msg


def test_an_alias_bomb_stops_the_entry_point_in_one_line(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(_raw()) + BOMB)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.data", "--params", str(p)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and time.perf_counter() - t < 60
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "anchors and aliases" in lines[0], proc.stderr[-500:]


def test_even_a_harmless_anchor_is_refused_and_every_yaml_the_pipeline_reads_uses_the_loader(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("a: &x 1\nb: *x\n")
    with pytest.raises(PipelineError, match=r"x.yaml: line 1: YAML anchors and aliases"):
        load_yaml(p)
    (tmp_path / "dvc.yaml").write_text("stages:\n  data: &s {cmd: x}\n  other: *s\n")
    from flows._dvc import stages

    with pytest.raises(ValueError, match="dvc.yaml: line 2: YAML anchors"):
        stages(tmp_path)
    grep = subprocess.run(["git", "grep", "-n", "yaml.safe_load\\|yaml.load(", "--", "stages", "flows"], cwd=ROOT,
                          capture_output=True, text=True).stdout
    reads = [ln for ln in grep.splitlines() if "safe_load(word)" not in ln and "Loader=_NoAliasLoader" not in ln]
    assert reads == [], reads  # the pipeline's code reads YAML files through load_yaml only


def test_deep_nesting_and_huge_files_are_one_line(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(PipelineError, match="deep.yaml: nested too deeply"):
        load_yaml(p)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(17 << 20)
    with pytest.raises(PipelineError, match="big.yaml: .* bytes, more than"):
        load_yaml(big)

"""The evaluate stage end to end on a tiny random model: outputs, metrics, plots, resume, and GSM8K in
real mode (few-shot and zero-shot). The scores are meaningless (random weights); the plumbing is tested."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages import testsets
from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import untimed
from stages.evaluate import stage
from stages.params import EvaluateParams, TestsetsParams


def _params(model_dir: Path, **over: Any) -> EvaluateParams:
    common = {
        "backend": "hf", "dtype": "float32", "num_threads": 1, "batch_size": 4, "max_new_tokens": 12, "temperature": 0.7,
        "top_p": 1.0, "seed": 0, "tir_max_rounds": 2, "exec_timeout_s": 5.0, "exec_workers": 2,
        "maj_subsets": 64, "n_shots": 3, "limit": 6, "sample_limit": 4, "testsets": "data/testsets",
        "benchmarks": ["generated"],
        "checker": {"headline": "strict", "report": "deepseekmath", "timeout_s": 5.0, "math_verify": True},
    }
    common.update(over.pop("common", {}))
    models = {
        "tiny_zs": {"path": str(model_dir), "prompting": "zero_shot", "greedy_modes": ["cot", "pot", "tir"],
                    "sample_modes": ["cot"], "n_samples": 4, "limit": None},
        "tiny_fs": {"path": str(model_dir), "prompting": "few_shot", "greedy_modes": ["cot"],
                    "sample_modes": [], "n_samples": 1, "limit": None},
    }
    return EvaluateParams.model_validate({"common": common, "models": models})


def test_stage_writes_completions_metrics_and_plots(project: Path, tiny_model_dir: Path) -> None:
    p = _params(tiny_model_dir)
    m = stage.run(p, "tiny_zs")
    out = paths.eval_dir("tiny_zs")
    names = {f.name for f in out.iterdir()}
    assert names == {"generated_cot_greedy.jsonl", "generated_pot_greedy.jsonl", "generated_tir_greedy.jsonl",
                     "generated_cot_sample.jsonl", "prompts.txt"}
    rows = [json.loads(x) for x in (out / "generated_cot_sample.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["completions"]) == 4 for r in rows)
    assert {"text", "answer", "correct", "finish_reason"} <= set(rows[0]["completions"][0])
    greedy = [json.loads(x) for x in (out / "generated_cot_greedy.jsonl").read_text().splitlines()]
    assert len(greedy) == 6
    g = m["generated"]["cot"]["greedy"]
    assert g["n"] == 6 and g["acc"] == pytest.approx(sum(r["completions"][0]["correct"] for r in greedy) / 6, abs=1e-4)
    assert sum(v["n"] for v in g["by_difficulty"].values()) == 6
    s = m["generated"]["cot"]["sample"]
    assert set(s) >= {"pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4", "by_difficulty"}
    assert s["pass@1"] <= s["pass@2"] <= s["pass@4"]
    assert "exec_ok" in m["generated"]["pot"]["greedy"] and "mean_executions" in m["generated"]["tir"]["greedy"]
    assert m["wall_s"] > 0
    assert json.loads(paths.details_file("evaluate_tiny_zs").read_text()) == untimed(m)  # timings: data/timings
    assert json.loads(paths.timings_file("evaluate_tiny_zs").read_text())["wall_s"] == m["wall_s"]
    tsv = (paths.plots_dir("evaluate") / "tiny_zs" / "generated_cot_at_k.tsv").read_text().splitlines()
    assert tsv[0] == "k\tpass_at_k\tmaj_at_k" and [r.split("\t")[0] for r in tsv[1:]] == ["1", "2", "4"]
    assert not any((paths.CHECKPOINTS / "evaluate").iterdir())  # checkpoint removed once done
    # every completion judged in both checker modes and by math-verify; the headline is strict's verdict
    comp = rows[0]["completions"][0]
    assert set(comp["verdicts"]) == {"strict", "deepseekmath", "math_verify"}
    assert all(c["correct"] == (c["verdicts"]["strict"] == "right") for r in rows for c in r["completions"])
    v = g["verifiers"]
    assert v["n"] == 6 and set(v["disagreements"]) == {"deepseekmath/strict", "deepseekmath/math_verify",
                                                         "strict/math_verify"}
    assert v["strict"]["acc"] == g["acc"] and g["acc_se"] >= 0 and g["timeouts"] == 0
    assert sum(k["count"] for k in v["kinds"].values()) <= 6
    assert g["per_problem"]["ids"] == [r["id"] for r in greedy] and len(g["per_problem"]["acc"]) == 6
    assert s["avg@4"] == pytest.approx(s["pass@1"]) and "pass@4_se" in s and len(s["per_problem"]["maj@4"]) == 4
    # what produced the numbers
    assert m["checker"]["headline"] == "strict" and m["checker"]["version"] and m["checker"]["math_verify"]
    assert g["sampling"]["temperature"] == 0.0 and s["sampling"]["temperature"] == 0.7 and s["sampling"]["n"] == 4
    assert len(g["prompt_sha256"]) == 16 and g["prompt_sha256"] != m["generated"]["pot"]["greedy"]["prompt_sha256"]
    headline = json.loads(paths.metrics_file("evaluate_tiny_zs").read_text())
    assert headline["checker"]["headline"] == "strict" and "acc_se" in headline["generated"]["cot"]["greedy"]
    assert "verifiers" not in headline["generated"]["cot"]["greedy"]  # the table is in the details only


def test_few_shot_model_uses_sft_exemplars(project: Path, tiny_model_dir: Path) -> None:
    m = stage.run(_params(tiny_model_dir), "tiny_fs")
    prompts = (paths.eval_dir("tiny_fs") / "prompts.txt").read_text()
    assert prompts.count("\nA: ") == 3 and "The answer is \\boxed{" in prompts  # 3 CoT exemplars
    assert m["generated"]["cot"]["greedy"]["n"] == 6 and m["prompting"] == "few_shot"


def test_interrupted_stage_resumes(project: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _params(tiny_model_dir)
    ref = stage.run(p, "tiny_zs")
    ref_rows = (paths.eval_dir("tiny_zs") / "generated_tir_greedy.jsonl").read_text()

    real = stage.make_generator(p.common, str(tiny_model_dir))

    class Killed(Exception):
        pass

    class DiesAfter:
        def __init__(self, n: int) -> None:
            self.n, self.calls = n, 0

        def generate(self, prompts, sp):
            self.calls += 1
            if self.calls > self.n:
                raise Killed
            return real.generate(prompts, sp)

    with pytest.raises(Killed):
        stage.run(p, "tiny_zs", generator=DiesAfter(6))  # greedy cot, pot done; tir interrupted
    counting = DiesAfter(10**6)
    m = stage.run(p, "tiny_zs", generator=counting)
    assert m["resumed_problems"] >= 12  # the finished cot and pot runs were not regenerated
    assert (paths.eval_dir("tiny_zs") / "generated_tir_greedy.jsonl").read_text() == ref_rows
    for mode in ("cot", "pot", "tir"):
        assert m["generated"][mode]["greedy"]["acc"] == ref["generated"][mode]["greedy"]["acc"]


def test_dtype_auto_resolution() -> None:
    assert stage.resolve_dtype("float32") == "float32"
    assert stage.resolve_dtype("auto") in {"float32", "bfloat16"}


def test_unknown_model_and_bad_combination(project: Path, tiny_model_dir: Path) -> None:
    p = _params(tiny_model_dir)
    with pytest.raises(PipelineError, match="unknown model 'nope'"):
        stage.run(p, "nope")
    bad = EvaluateParams.model_validate({**p.model_dump(), "models": {"x": {
        "path": str(tiny_model_dir), "prompting": "few_shot", "greedy_modes": ["pot"], "sample_modes": [],
        "n_samples": 1, "limit": None}}, "common": {**p.common.model_dump(), "benchmarks": ["absent"]}})
    with pytest.raises(PipelineError, match="test set 'absent' not found"):
        stage.run(bad, "x")
    missing = EvaluateParams.model_validate({**p.model_dump(), "models": {"y": {
        "path": "data/models/absent", "prompting": "zero_shot", "greedy_modes": ["cot"], "sample_modes": [],
        "n_samples": 1, "limit": None}}})
    with pytest.raises(PipelineError, match="model directory not found"):
        stage.run(missing, "y")


def test_gsm8k_real_mode_few_and_zero_shot(project: Path, tiny_model_dir: Path, shared_data: Path) -> None:
    gsm = str(shared_data / "gsm8k" / "test.jsonl")
    testsets.run(TestsetsParams.model_validate({
        "common": {"exec_timeout_s": 5.0, "exec_workers": 1, "samples": 1},
        "datasets": {"gsm8k": {"path": gsm, "hub": None, "adapter": "gsm8k", "fields": {}, "match": {}, "limit": 3}}}),
        "gsm8k")
    p = _params(tiny_model_dir, common={"benchmarks": ["gsm8k"], "limit": 3, "sample_limit": 2})
    zs = stage.run(p, "tiny_zs")
    fs = stage.run(p, "tiny_fs")
    for name, m in (("tiny_zs", zs), ("tiny_fs", fs)):
        assert set(m) >= {"gsm8k", "wall_s"} and "generated" not in m
        assert m["gsm8k"]["cot"]["greedy"]["n"] == 3
        assert paths.metrics_file(f"evaluate_{name}").is_file()
    assert zs["gsm8k"]["cot"]["sample"]["n"] == 2 and "pass@4" in zs["gsm8k"]["cot"]["sample"]
    prompts = (paths.eval_dir("tiny_fs") / "prompts.txt").read_text()
    assert "Q: There are 15 trees in the grove." in prompts  # the DeepSeekMath 8-shot prompt
    rows = [json.loads(x) for x in (paths.eval_dir("tiny_fs") / "gsm8k_cot_greedy.jsonl").read_text().splitlines()]
    gold = [json.loads(x)["answer"].split("####")[-1].strip() for x in open(gsm).read().splitlines()[:3]]
    assert [r["gold"] for r in rows] == [g.replace(",", "") for g in gold]


def test_model_limit_caps_below_common_limit(project: Path) -> None:
    """A model's own ``limit`` (the untrained base on the tiny default) cuts each benchmark further; it never
    raises common.limit."""
    c = _params(Path("unused")).common
    assert len(stage.load_benchmarks(c)["generated"]) == 6
    assert len(stage.load_benchmarks(c, 3)["generated"]) == 3
    assert len(stage.load_benchmarks(c, 50)["generated"]) == 6
    unlimited = c.model_copy(update={"limit": None})
    assert len(stage.load_benchmarks(unlimited, 2)["generated"]) == 2


def test_tir_evaluation_without_isolation_is_refused_unless_the_params_opt_in(
        project: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the sandbox has no file-system allow-list (here: switched off), a TIR evaluation refuses to start with one
    line naming what is missing and the fix; with ``runtime.allow_reduced_isolation: true`` it runs, and its metrics
    record that isolation was reduced (issue 46)."""
    from stages.core import sandbox
    from stages.schema import base

    reduced = sandbox.SandboxExecutor(disable=["allowlist_fs"], preload=["math"], prefork=1)
    monkeypatch.setattr(sandbox, "get_executor", lambda: reduced)
    p = _params(tiny_model_dir, common={"limit": 2})
    p = p.updated({"models.tiny_zs": {"greedy_modes": ["tir"], "sample_modes": []}})
    try:
        monkeypatch.setattr(base, "_REDUCED_ISOLATION", [False])
        with pytest.raises(PipelineError) as e:
            stage.run(p, "tiny_zs")
        msg = str(e.value)
        assert msg.startswith("evaluate@tiny_zs (tir) runs model-written programs, but the code sandbox lacks "
                              "allowlist_fs (disabled by configuration)") and "allow_reduced_isolation: true" in msg
        assert "\n" not in msg and not paths.eval_dir("tiny_zs").exists()
        monkeypatch.setattr(base, "_REDUCED_ISOLATION", [True])
        m = stage.run(p, "tiny_zs")
    finally:
        reduced.close()
    record = {"isolation": "reduced", "missing": ["allowlist_fs"], "why": "disabled by configuration"}
    assert m["sandbox"] == record and m["generated"]["tir"]["greedy"]["n"] == 2
    assert json.loads(paths.metrics_file("evaluate_tiny_zs").read_text())["sandbox"] == record

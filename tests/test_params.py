"""params.yaml against the schema: it validates, spells out every field, every field is documented,
and bad values fail fast with one line naming the key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from stages.core.errors import PipelineError
from stages.params import Params, load_params, parse_params

ROOT = Path(__file__).resolve().parent.parent


def _raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _model_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        out.append((key, field))
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_model_fields(ann, key + "."))
    return out


def test_committed_params_validate() -> None:
    params = load_params(ROOT / "params.yaml")
    assert isinstance(params, Params)


def _runtime_keys() -> set[str]:
    return {f"{name}.{path}" for name, f in Params.model_fields.items() for path in f.annotation.runtime_paths()}


def test_params_yaml_spells_out_every_field() -> None:
    # runtime fields (stages/schema/base.py) are spelled out under runtime:, at the same path
    raw = _raw()
    missing = []
    runtime = _runtime_keys()
    for key, _ in _model_fields(Params):
        node: Any = raw["runtime"] if key in runtime else raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    assert not missing, f"params.yaml lacks {missing}"


def test_every_field_has_a_docstring() -> None:
    undocumented = [k for k, f in _model_fields(Params) if not (f.description or "").strip()]
    assert not undocumented, f"fields without a docstring: {undocumented}"


def test_no_field_has_a_default() -> None:
    # DVC tracks params.yaml values, not schema defaults: every value must be written out.
    with_default = [k for k, f in _model_fields(Params) if not f.is_required()]
    assert not with_default, f"fields with schema defaults: {with_default}"


def _set(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    node = raw
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return raw


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("data.problems.n_sft", -5, "data.problems.n_sft: Input should be greater than 0"),
        ("data.seed", "abc", "data.seed: Input should be a valid integer"),
        ("base_model.hidden_size", [1], "base_model.hidden_size: Input should be a valid integer"),
        ("base_model.checkpoint", "/nonexistent/model", "base_model.checkpoint: model path '/nonexistent/model' does not exist"),
    ],
)
def test_bad_values_name_the_key(key: str, value: Any, expect: str) -> None:
    with pytest.raises(PipelineError) as e:
        parse_params(_set(_raw(), key, value))
    msg = str(e.value)
    assert expect in msg
    assert "\n" not in msg


def test_unknown_key_is_rejected() -> None:
    raw = _raw()
    raw["data"]["problems"]["n_tset"] = 3
    with pytest.raises(PipelineError, match=r"data\.problems\.n_tset: unknown key"):
        parse_params(raw)


def test_missing_key_is_reported() -> None:
    raw = _raw()
    del raw["base_model"]["vocab_size"]
    with pytest.raises(PipelineError, match=r"base_model\.vocab_size: missing"):
        parse_params(raw)


def test_model_path_that_is_not_a_hf_directory(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(PipelineError, match="is not a Hugging Face model directory"):
        parse_params(_set(_raw(), "base_model.checkpoint", str(tmp_path)))


# One subprocess per kind of bad input: the entry point prints one line and exits non-zero,
# before Prefect starts and before any output is touched.
BAD_INPUTS = {
    "unknown_key": ("data.problems.bogus", 1, "data.problems.bogus: unknown key"),
    "wrong_type": ("data.problems.max_value", "twenty", "data.problems.max_value: Input should be a valid integer"),
    "negative_size": ("data.problems.n_test", -1, "data.problems.n_test: Input should be greater than 0"),
    "missing_path": ("base_model.checkpoint", "./no/such/dir", "base_model.checkpoint: model path './no/such/dir' does not exist"),
    "not_a_model_dir": ("base_model.checkpoint", "stages", "base_model.checkpoint: 'stages' is not a Hugging Face model directory"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_entry_point_reports_bad_params_in_one_line(case: str, tmp_path: Path) -> None:
    key, value, expect = BAD_INPUTS[case]
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(_set(_raw(), key, value)))
    proc = subprocess.run([sys.executable, "-m", "flows.data", "--params", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and expect in lines[0]
    assert "Traceback" not in proc.stderr


def test_real_mode_params_file_validates(shared_data: Path) -> None:
    # params/deepseekmath-7b.yaml reads ../shared/data by path, so it only validates where that exists.
    path = ROOT / "params" / "deepseekmath-7b.yaml"
    raw = yaml.safe_load(path.read_text())
    sections = set(raw) - {"runtime"}
    assert sections == set(Params.model_fields), f"real-mode file sections {sections} != schema sections"
    load_params(path)


def test_runtime_values_live_under_runtime_only() -> None:
    runtime = _runtime_keys()
    assert {"grpo.checkpoint_every", "pretrain.train.log_every", "corpus.workers"} <= runtime
    raw = _raw()
    raw["grpo"]["checkpoint_every"] = raw["runtime"]["grpo"].pop("checkpoint_every")
    with pytest.raises(PipelineError, match=r"grpo\.checkpoint_every: a runtime value .* move it to "
                                            r"runtime\.grpo\.checkpoint_every"):
        parse_params(raw)
    raw = _raw()
    raw["runtime"]["grpo"]["optim"] = {"lr": 0.1}
    with pytest.raises(PipelineError, match=r"runtime\.grpo\.optim: not a runtime value .* move it to grpo\.optim"):
        parse_params(raw)
    raw = _raw()
    del raw["runtime"]["pretrain"]["train"]["log_every"]
    with pytest.raises(PipelineError, match=r"runtime\.pretrain\.train\.log_every: missing"):
        parse_params(raw)
    raw = _raw()
    raw["runtime"]["bogus"] = {}
    with pytest.raises(PipelineError, match=r"runtime\.bogus: unknown section"):
        parse_params(raw)


def test_one_section_loads_alone_with_its_runtime_values(tmp_path: Path) -> None:
    from stages.schema.grpo import GrpoParams

    p = GrpoParams.from_file(ROOT / "params.yaml")
    full = load_params(ROOT / "params.yaml").grpo
    assert p == full and p.checkpoint_every == _raw()["runtime"]["grpo"]["checkpoint_every"]
    assert "checkpoint_every" not in p.tracked_dump() and p.tracked_dump()["optim"]["lr"] == p.optim.lr
    assert "offload_idle_models" not in p.tracked_dump()["compute"] and p.compute.offload_idle_models is True
    raw = _raw()
    raw["grpo"]["optim"]["lr"] = -1.0
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(PipelineError, match=r"grpo\.optim\.lr: Input should be greater than or equal to 0"):
        GrpoParams.from_file(bad)


def test_stages_import_only_their_own_schema() -> None:
    # stages/params.py (every section) is validation only: no stage or library module imports it
    offenders = []
    for path in list((ROOT / "stages").rglob("*.py")) + list((ROOT / "flows").glob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in {"stages/params.py", "stages/preflight.py", "flows/_common.py", "flows/pipeline.py",
                   "stages/core/cli.py"}:
            continue
        if re.search(r"^\s*(from stages\.params import|import stages\.params\b)", path.read_text(), re.M):
            offenders.append(rel)
    assert not offenders, f"import the section's own schema (stages.schema.<section>) instead: {offenders}"


def test_one_gpu_recipe_validates_and_is_what_it_says(shared_data: Path) -> None:
    """params/qwen2.5-0.5b-gsm8k.yaml: GRPO on GSM8K train from an instruct model with its chat template (no
    pretraining, SFT or reward model), rule reward, evaluated on GSM8K test and MATH-500."""
    path = ROOT / "params" / "qwen2.5-0.5b-gsm8k.yaml"
    assert set(yaml.safe_load(path.read_text())) - {"runtime"} == set(Params.model_fields)
    p = load_params(path)
    assert p.base_model.checkpoint == "Qwen/Qwen2.5-0.5B-Instruct" and p.base_model.prompt_format == "chat_template"
    assert not (p.pretrain.enabled or p.sft.enabled or p.reward_model.enabled)
    assert p.grpo.algorithm == "grpo" and p.grpo.reward.source == "rule" and p.grpo.prompts_file == "data/ingest/rl"
    assert {(n, d.adapter, d.role) for n, d in p.ingest.datasets.items()} == {("gsm8k_rl", "gsm8k", "rl")}
    assert Path(p.ingest.datasets["gsm8k_rl"].path).name == "train.jsonl"
    assert p.evaluate.common.benchmarks == ["gsm8k", "math500"]
    assert {n: Path(d.path).name for n, d in p.testsets.datasets.items()} == {
        "gsm8k": "test.jsonl", "math500": "math500_test.jsonl"}
    assert all(m.prompting == "zero_shot" for m in p.evaluate.models.values())


def test_paper_file_trains_on_real_sets_with_a_model_reward(shared_data: Path) -> None:
    p = load_params(ROOT / "params" / "deepseekmath-7b.yaml")
    roles = {d.role for d in p.ingest.datasets.values()}
    assert roles == {"sft", "rl"} and p.sft.problems == "data/ingest/sft" and p.grpo.prompts_file == "data/ingest/rl"
    assert p.reward_model.prompts_file == "data/ingest/rl" and p.reward_model.enabled
    assert p.grpo.reward.source == "process_rm" and p.grpo.iterative.iterations == 2  # paper 4.1.3-4.1.4, Figure 6
    assert {"gsm8k", "math"} <= set(p.evaluate.common.benchmarks) and p.base_model.prompt_format == "deepseekmath"
    assert p.corpus.decontam.ngram == p.ingest.common.decontam.ngram == 10


@pytest.mark.parametrize("key, value, expect", [
    ("evaluate.common.benchmarks", ["absent"], "evaluate.common.benchmarks: ['absent'] are not test sets"),
    ("grpo.heldout.problems_file", "data/testsets/absent.jsonl", "is not a test set"),
    ("grpo.reward.source", "process_rm", "needs the reward model; set reward_model.enabled: true"),
    ("sft.problems", "data/ingest/sft", "no ingest data set has role sft"),
])
def test_sections_that_name_each_others_outputs_agree(key: str, value: Any, expect: str) -> None:
    raw = _raw()
    if key == "grpo.reward.source":
        raw["reward_model"]["enabled"] = False
    node = raw
    *parents, leaf = key.split(".")
    for k in parents:
        node = node[k]
    node[leaf] = value
    with pytest.raises(PipelineError, match=re.escape(expect)):
        parse_params(raw)


def test_validating_the_params_imports_no_torch() -> None:
    """stages.params and the schemas check registry names (algorithm, estimator, loss, reward source) against the
    torch-free specs of stages/rl/registry.py: validating the whole file loads neither torch nor the RL package."""
    code = ("import sys; import stages.params as sp; assert 'torch' not in sys.modules, 'import'; "
            "sp.load_params('params.yaml'); bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.') "
            "or m in ('stages.rl.algorithms', 'stages.rl.loop', 'transformers')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_grpo_keys_of_the_flat_layout_name_their_new_place() -> None:
    from stages.schema.grpo import MOVED, from_flat

    raw = _raw()
    raw["grpo"]["reward_source"] = raw["grpo"]["reward"].pop("source")
    with pytest.raises(PipelineError, match=r"grpo: reward_source: moved to grpo\.reward\.source"):
        parse_params(raw)
    raw = _raw()
    raw["grpo"]["iterative"]["rm_lr"] = raw["grpo"]["iterative"]["rm"].pop("lr")
    with pytest.raises(PipelineError, match=r"iterative\.rm_lr: moved to grpo\.iterative\.rm\.lr"):
        parse_params(raw)
    # from_flat is the inverse of the move: a flat rendering of today's section comes back equal
    grpo = _raw()["grpo"]
    flat: dict[str, Any] = {k: v for k, v in grpo.items() if not isinstance(v, dict)}
    for old, new in MOVED.items():
        node: Any = grpo
        for part in new.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and "." not in old:
            flat[old] = node
    assert from_flat(grpo) == grpo
    assert from_flat(flat)["optim"]["lr"] == grpo["optim"]["lr"] and from_flat(flat)["kl"] == grpo["kl"]


def test_one_name_per_concept_across_sections() -> None:
    """iterative RL's reward-model update uses the reward_model section's schema (its fields, their docstrings), and
    a concept spelled in several sections has one name there (max_grad_norm, exec_workers, lr ...)."""
    from stages.schema.grpo import GrpoIterativeRmParams
    from stages.schema.reward_model import RewardModelParams, RmDataParams
    from stages.schema.train import TrainLoopParams

    shared = set(RmDataParams.model_fields)
    assert shared <= set(RewardModelParams.model_fields) and shared <= set(GrpoIterativeRmParams.model_fields)
    for name in shared:
        assert RewardModelParams.model_fields[name].description == GrpoIterativeRmParams.model_fields[name].description
    p = load_params(ROOT / "params.yaml")
    assert "max_grad_norm" in TrainLoopParams.model_fields and "grad_clip" not in TrainLoopParams.model_fields
    assert p.grpo.optim.max_grad_norm and p.sft.train.max_grad_norm
    assert "exec_workers" in p.grpo.rollout.model_fields_set and p.evaluate.common.exec_workers


def test_updated_applies_dotted_changes_and_validates() -> None:
    p = load_params(ROOT / "params.yaml").grpo
    q = p.updated({"optim.lr": 0.5, "steps": 3, "reward": {"source": "process_rule"}})
    assert (q.optim.lr, q.steps, q.reward.source, q.reward.accuracy_weight) == (0.5, 3, "process_rule", 1.0)
    with pytest.raises(ValueError, match="unknown reward source 'nope'; registered: "):
        p.updated({"reward.source": "nope"})


def test_the_reduced_isolation_opt_in_is_spelled_out_and_read(tmp_path: Path) -> None:
    """``runtime.allow_reduced_isolation`` (issue 46): false in every committed file, required, a boolean; reading a
    params file sets what stages.core.sandbox.require_isolation consults."""
    from stages.schema import base

    for path in [ROOT / "params.yaml", *(ROOT / "params").glob("*.yaml")]:
        assert yaml.safe_load(path.read_text())["runtime"]["allow_reduced_isolation"] is False, path
    raw = _raw()
    del raw["runtime"]["allow_reduced_isolation"]
    with pytest.raises(PipelineError, match=r"runtime\.allow_reduced_isolation: missing; add it"):
        parse_params(raw)
    raw["runtime"]["allow_reduced_isolation"] = "yes please"
    with pytest.raises(PipelineError, match=r"runtime\.allow_reduced_isolation: expected true or false"):
        parse_params(raw)
    raw["runtime"]["allow_reduced_isolation"] = True
    opted = tmp_path / "params.yaml"
    opted.write_text(yaml.safe_dump(raw))
    try:
        assert isinstance(load_params(opted), Params) and base.reduced_isolation_allowed()
    finally:
        base.read_params_file(ROOT / "params.yaml")
    assert not base.reduced_isolation_allowed()

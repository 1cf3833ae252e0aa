"""params files against the schema: each is an overlay on the paper's values (the schema's defaults) that resolves
to what its full version spelled out, every field is documented, and bad values fail fast with one line naming the
key."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from stages.core.errors import PipelineError
from stages.params import Params, diff, load_params, parse_params, record, resolve
from tests.flows.test_dvc_yaml import dvc_reads

ROOT = Path(__file__).resolve().parent.parent


def _raw() -> dict[str, Any]:
    return resolve(ROOT / "params.yaml")


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        return {k: v for key, sub in node.items() for k, v in _leaves(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


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


def test_every_field_is_documented_and_defaults_but_what_dvc_yaml_reads() -> None:
    """A file naming only what dvc.yaml reads (the paths it interpolates, the named data sets and models, the groups
    it tracks) validates and takes the paper's values for everything else; without any one of those keys it fails in
    one line naming the key."""
    undocumented = [k for k, f in _model_fields(Params) if not (f.description or "").strip()]
    assert not undocumented, f"fields without a docstring: {undocumented}"
    full = yaml.safe_load((ROOT / "params" / "deepseekmath-7b.yaml").read_text())
    minimal: dict[str, Any] = {}
    for key, kind in dvc_reads().items():  # a value copied, a tracked group present
        node, src = minimal, full
        *parents, leaf = key.split(".")
        for part in parents:
            node, src = node.setdefault(part, {}), src[part]
        node.setdefault(leaf, src[leaf] if kind == "value" else {})
    p = parse_params(minimal)
    assert p.grpo.optim.lr == 1.0e-6 and p.grpo.rollout.group_size == 64 and p.sft.train.lr == 5.0e-5  # paper 4.2, 3.2
    assert p.pretrain.train.steps == 50_000 and p.corpus.classifier.dim == 256 and p.grpo.kl.beta == 0.04
    for key in dvc_reads():
        raw = copy.deepcopy(minimal)
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node[part]
        del node[leaf]
        with pytest.raises(PipelineError, match=rf"{re.escape(key)}: missing; add it"):
            parse_params(raw)


def test_the_paper_file_sets_only_data_launch_and_what_dvc_yaml_reads() -> None:
    """The schema's defaults are the paper's values: params/deepseekmath-7b.yaml changes none of them, it names its
    data (what dvc.yaml reads), its benchmarks, the report's title, how the run is launched and the reward-hacking
    guards around the paper's learned RM (the paper has none; each is off at its neutral default)."""
    full = yaml.safe_load((ROOT / "params" / "deepseekmath-7b.yaml").read_text())
    full.pop("runtime")
    reads = [k for k, kind in dvc_reads().items() if kind == "value"]
    allowed = ("evaluate.common.benchmarks", "report.title", "grpo.launcher.", "pretrain.launcher.", "sft.launcher.",
               "grpo.reward.rm_guards.")
    extra = [k for k, v in _leaves(full).items() if v != {} and not any(k == r or k.startswith(r + ".") for r in reads)
             and not k.startswith(allowed)]
    assert not extra, f"params/deepseekmath-7b.yaml changes paper defaults: {extra}"


FULL_FILES_OF = "a75a2a3"
"""The commit whose params files spelled out every value (before issue 44)."""
CHANGED_SINCE = {"params.yaml": {"evaluate.common.num_threads": 0, "reward_model.num_threads": 0},
                 "params/deepseekmath-7b.yaml": {"grpo.reward.rm_guards.divergence.action": "stop"}}
"""Values changed on purpose since :data:`FULL_FILES_OF`: evaluation and the reward model on every core (the same
bytes at any thread count); the 7B run's learned RM guarded by the divergence guard's stop (issue 48)."""


@pytest.mark.parametrize("name", ["params.yaml", "params/deepseekmath-7b.yaml", "params/qwen2.5-0.5b-gsm8k.yaml"])
def test_each_file_resolves_to_its_full_version_value_for_value(name: str) -> None:
    """Each overlay resolves to every value its full version of a75a2a3 spelled out, and both load to the same
    params (fields added since then take their defaults in both)."""
    show = subprocess.run(["git", "show", f"{FULL_FILES_OF}:{name}"], cwd=ROOT, capture_output=True, text=True)
    if show.returncode:
        pytest.skip(f"no git history of {FULL_FILES_OF} here: {show.stderr.strip()[:200]}")
    full = yaml.safe_load(show.stdout)
    for key, value in CHANGED_SINCE.get(name, {}).items():
        *parents, leaf = key.split(".")
        node = full
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    got = resolve(load_params(ROOT / name))
    old, new = _leaves(full), _leaves(got)
    different = {k: (v, new.get(k, "<absent>")) for k, v in old.items() if new.get(k, "<absent>") != v}
    assert not different, different
    assert got == resolve(parse_params(full)), diff(resolve(parse_params(full)), got)


def test_a_group_is_written_over_its_default_key_by_key() -> None:
    raw = _raw()
    raw["grpo"]["rollout"] = {"group_size": 4}
    raw["sft"]["train"] = {"lr": 1.0e-4}
    p = parse_params(raw)
    assert (p.grpo.rollout.group_size, p.grpo.rollout.max_new_tokens, p.grpo.rollout.vllm.gpu_memory_utilization) == \
        (4, 1024, 0.3)
    # sft.train's own defaults (paper 3.2), not the training loop's of pretrain
    assert (p.sft.train.lr, p.sft.train.steps, p.sft.train.deepspeed.zero_stage, p.pretrain.train.steps) == \
        (1.0e-4, 500, 3, 300)


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
    del raw["grpo"]["heldout"]["problems_file"]
    with pytest.raises(PipelineError, match=r"grpo\.heldout\.problems_file: missing; add it \(no default: dvc\.yaml reads it"):
        parse_params(raw)
    raw = _raw()
    del raw["report"]
    with pytest.raises(PipelineError, match=r"report: missing"):
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
    raw["grpo"]["checkpoint_every"] = 5
    with pytest.raises(PipelineError, match=r"grpo\.checkpoint_every: a runtime value .* move it to "
                                            r"runtime\.grpo\.checkpoint_every"):
        parse_params(raw)
    raw = _raw()
    raw["runtime"] = {"grpo": {"optim": {"lr": 0.1}}}
    with pytest.raises(PipelineError, match=r"runtime\.grpo\.optim: not a runtime value .* move it to grpo\.optim"):
        parse_params(raw)
    raw = _raw()
    raw["runtime"] = {"bogus": {}}
    with pytest.raises(PipelineError, match=r"runtime\.bogus: unknown section"):
        parse_params(raw)
    raw = _raw()  # a runtime value not given keeps its default (one local process); one given lands in its group
    raw["runtime"] = {"pretrain": {"train": {"log_every": 7}}, "grpo": {"rollout": {"exec_workers": 3}}}
    p = parse_params(raw)
    assert (p.pretrain.train.log_every, p.pretrain.train.checkpoint_every, p.pretrain.train.lr) == (7, 50, 1.0e-3)
    assert (p.grpo.rollout.exec_workers, p.grpo.rollout.group_size, p.grpo.launcher.kind) == (3, 8, "none")


def test_one_section_loads_alone_with_its_runtime_values(tmp_path: Path) -> None:
    from stages.schema.grpo import GrpoParams

    p = GrpoParams.from_file(ROOT / "params.yaml")
    full = load_params(ROOT / "params.yaml").grpo
    assert p == full and p.checkpoint_every == 10
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


@pytest.mark.parametrize("name", ["params.yaml", "params/deepseekmath-7b.yaml"])
def test_dvc_exp_run_set_param_changes_only_the_key_it_sets(name: str, tmp_path: Path) -> None:
    """``dvc exp run -S`` rewrites the params file with DVC's own YAML writer (dvc.utils.hydra.apply_overrides):
    the file is written as that writer writes it (block lists, flow maps under 80 columns), so a value set to what it
    is changes no byte, and ``-S '++grpo.kl.beta=1e-5'`` (``++``: add the key where the file has none) adds that key
    alone, written ``1e-05``: a number to DVC (YAML 1.2) and to the loader alike."""
    from dvc.utils.hydra import apply_overrides

    f = tmp_path / "params.yaml"
    f.write_text((ROOT / name).read_text())
    apply_overrides(f, ["grpo.prompts_file=" + load_params(f).grpo.prompts_file])
    assert f.read_text() == (ROOT / name).read_text()
    apply_overrides(f, ["++grpo.kl.beta=1e-5"])
    added = [ln for ln in f.read_text().splitlines() if ln not in (ROOT / name).read_text().splitlines()]
    assert added == ["  kl:", "    beta: 1e-05"], added
    assert load_params(f).grpo.kl.beta == 1e-05
    assert diff(resolve(ROOT / name), resolve(f)) == ["grpo.kl.beta: 0.04 -> 1e-05"]


def test_show_and_diff_print_resolved_values(tmp_path: Path) -> None:
    show = subprocess.run([sys.executable, "-m", "stages.params", "show"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert yaml.safe_load(show) == resolve(load_params(ROOT / "params.yaml"))
    out = subprocess.run([sys.executable, "-m", "stages.params", "diff", "params.yaml", "params/deepseekmath-7b.yaml"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "grpo.optim.lr: 2e-05 -> 1e-06\n" in out and "grpo.kl.beta" not in out
    bad = tmp_path / "p.yaml"
    bad.write_text("grpo: {steps: -1}\n")
    proc = subprocess.run([sys.executable, "-m", "stages.params", "show", str(bad)], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1


def test_each_stage_records_what_it_computes_with() -> None:
    p = load_params(ROOT / "params.yaml")
    rec = record(p, "evaluate@sft")
    assert set(rec["evaluate"]) == {"common", "models"} and list(rec["evaluate"]["models"]) == ["sft"]
    assert record(p, "grpo") == {"grpo": p.grpo.tracked_dump()} and "checkpoint_every" not in record(p, "grpo")["grpo"]
    assert list(record(p, "testsets@generated")["testsets"]["datasets"]) == ["generated"]


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
    assert "exec_workers" in type(p.grpo.rollout).model_fields and p.evaluate.common.exec_workers


def test_updated_applies_dotted_changes_and_validates() -> None:
    p = load_params(ROOT / "params.yaml").grpo
    q = p.updated({"optim.lr": 0.5, "steps": 3, "reward": {"source": "process_rule"}})
    assert (q.optim.lr, q.steps, q.reward.source, q.reward.accuracy_weight) == (0.5, 3, "process_rule", 1.0)
    with pytest.raises(ValueError, match="unknown reward source 'nope'; registered: "):
        p.updated({"reward.source": "nope"})


def test_the_reduced_isolation_opt_in_is_spelled_out_and_read(tmp_path: Path) -> None:
    """``runtime.allow_reduced_isolation`` (issue 46): never true in a committed file, false when absent (the schema's
    default), a boolean; reading a params file sets what stages.core.sandbox.require_isolation consults."""
    from stages.schema import base

    for path in [ROOT / "params.yaml", *(ROOT / "params").glob("*.yaml")]:
        assert (yaml.safe_load(path.read_text()).get("runtime") or {}).get("allow_reduced_isolation", False) is False, path
    raw = _raw()
    raw.setdefault("runtime", {}).pop("allow_reduced_isolation", None)
    assert isinstance(parse_params(raw), Params)
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


@pytest.mark.parametrize("name", ["params.yaml", "params/deepseekmath-7b.yaml", "params/qwen2.5-0.5b-gsm8k.yaml"])
def test_every_resolved_value_survives_dvcs_yaml_writer(name: str, tmp_path: Path) -> None:
    """``dvc exp run -S`` writes params.yaml back with DVC's own YAML writer, which leaves a string such as ``off`` or
    ``no`` unquoted; this project's loader reads those as YAML 1.1 booleans and refuses them. So every value of each
    file with every default spelled out (what a recorded or shown params file holds) must read back the same after
    DVC's writer: no option of the schema may be such a word."""
    from dvc.utils.serialize import dumps_yaml

    full = resolve(load_params(ROOT / name))
    written = tmp_path / "params.yaml"
    written.write_text(dumps_yaml(full))
    assert resolve(load_params(written)) == full

"""The whole params file: every section's schema (stages/schema/<section>.py) plus the ``runtime`` section.

A params file is an overlay on the schema's defaults, the paper's values (stages/schema/base.py): params.yaml holds
the tiny default's differences, params/*.yaml a recipe's. ``python -m stages.params show [FILE]`` prints every value
a file resolves to (runtime values under ``runtime:``), ``python -m stages.params diff A B`` the values two files
resolve differently; each stage records its resolved values with its outputs (data/params/<stage>.yaml, :func:`record`).

Stages never import this module: each imports only its own section's schema, so editing one section's schema
re-runs no other stage. This module validates the *whole* file before anything runs (``python -m flows.<stage>``
and ``python -m flows.pipeline`` call :func:`load_params` first), so a bad value anywhere fails fast in one line.
It can only refuse to run, never change what a stage computes: dvc.yaml does not list it as a code dep
(tests/flows/test_dvc_yaml.py, ``VALIDATION_ONLY``).

The section classes are re-exported here for tests and scripts (``from stages.params import GrpoParams``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from stages.core import paths
from stages.core.errors import PipelineError
from stages.rl.needs import run_needs
from stages.schema.base import (
    ALLOW_REDUCED_ISOLATION,
    RUNTIME,
    Section,
    _NoAliasLoader,
    format_error,
    merge_runtime,
    read_params_file,
)
from stages.schema.base_model import BaseModelParams
from stages.schema.corpus import (
    ClassifierParams,
    CorpusParams,
    DecontamParams,
    DedupParams,
    DomainParams,
    RecallParams,
)
from stages.schema.data import CrawlParams, DataParams, ProblemParams
from stages.schema.datasets import DatasetSpec, HubSource
from stages.schema.evaluate import EvalCommonParams, EvalMode, EvalModelParams, EvaluateParams
from stages.schema.grpo import (
    GrpoBaselineParams,
    GrpoHeldoutParams,
    GrpoIterativeParams,
    GrpoParams,
    GrpoRewardParams,
)
from stages.schema.ingest import IngestCommonParams, IngestDataset, IngestDecontamParams, IngestParams
from stages.schema.pretrain import MixtureSource, PretrainParams
from stages.schema.report import ReportParams
from stages.schema.reward_model import RewardModelParams
from stages.schema.sft import SftFormatMix, SftParams
from stages.schema.testsets import TestsetCommonParams, TestsetsParams
from stages.schema.train import DeepSpeedParams, TrainLoopParams

__all__ = [
    "RUNTIME", "BaseModelParams", "ClassifierParams", "CorpusParams", "CrawlParams", "DataParams", "DatasetSpec",
    "DecontamParams", "HubSource", "IngestCommonParams", "IngestDataset", "IngestDecontamParams", "IngestParams",
    "TestsetCommonParams", "TestsetsParams",
    "DedupParams", "DeepSpeedParams", "DomainParams", "EvalCommonParams", "EvalMode", "EvalModelParams",
    "EvaluateParams", "GrpoBaselineParams", "GrpoHeldoutParams", "GrpoIterativeParams", "GrpoParams",
    "GrpoRewardParams", "MixtureSource", "Params", "PretrainParams", "ProblemParams", "RecallParams",
    "ReportParams", "RewardModelParams", "Section", "SftFormatMix", "SftParams", "TrainLoopParams", "load_params", "parse_params",
    "record", "resolve",
]


class Params(BaseModel):
    """The whole params.yaml: one section per dvc.yaml stage (the ``runtime`` section is merged into them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    data: DataParams
    """Generated crawl, seed corpus and word problems."""
    testsets: TestsetsParams
    """Evaluation sets as pipeline rows (GSM8K / MATH test, MATH-500, GSM-Hard, the generated test problems)."""
    ingest: IngestParams
    """SFT and RL data sets as pipeline rows, checked and decontaminated (GSM8K / MATH train, instruction sets)."""
    base_model: BaseModelParams
    """Tokenizer and initial model."""
    corpus: CorpusParams
    """Math corpus: fastText recall over rounds, domain discovery, dedup, decontamination."""
    evaluate: EvaluateParams
    """Evaluation of every model (greedy, pass@k, maj@k; CoT / PoT / TIR)."""
    grpo: GrpoParams
    """GRPO from the SFT model (paper section 4), with a continued-SFT baseline."""
    pretrain: PretrainParams
    """Continual pretraining on the corpus mixture (paper section 2.3)."""
    report: ReportParams
    """The one-page HTML report of the whole run (the last stage)."""
    reward_model: RewardModelParams
    """Neural outcome / process reward model for GRPO (paper sections 4.1.3-4.1.4)."""
    sft: SftParams
    """Supervised fine-tuning on CoT / PoT / TIR solutions (paper section 3)."""

    @model_validator(mode="after")
    def _check_across_sections(self) -> Params:
        """What one section says about another's outputs: every named test set exists, a model reward has a reward
        model, and a stage reading the ingest stage's sft / rl rows has a data set of that role."""
        names = set(self.testsets.datasets)
        if Path(self.evaluate.common.testsets) == paths.TESTSETS:
            missing = [b for b in self.evaluate.common.benchmarks if b not in names]
            if missing:
                raise ValueError(f"evaluate.common.benchmarks: {missing} are not test sets (testsets.datasets has "
                                 f"{sorted(names)})")
        held = Path(self.grpo.heldout.problems_file)
        if held.parent == paths.TESTSETS and held.stem not in names:
            raise ValueError(f"grpo.heldout.problems_file: {held} is not a test set (testsets.datasets has "
                             f"{sorted(names)})")
        if run_needs(self.grpo).reward_model and not self.reward_model.enabled:
            raise ValueError(f"grpo (reward.source {self.grpo.reward.source}, algorithm {self.grpo.algorithm}) needs "
                             "the reward model; set reward_model.enabled: true (or a reward.source without one)")
        roles = {d.role for d in self.ingest.datasets.values()}
        for key, value in (("sft.problems", self.sft.problems), ("grpo.prompts_file", self.grpo.prompts_file),
                           ("reward_model.prompts_file", self.reward_model.prompts_file)):
            path = Path(value)
            for role in ("sft", "rl"):
                if (path == paths.INGEST / role or path.parent == paths.INGEST / role) and role not in roles:
                    raise ValueError(f"{key}: {value} is the ingest stage's {role} rows, but no ingest data set has "
                                     f"role {role}")
        return self


def section_classes() -> dict[str, type[Section]]:
    """Every top-level section's schema class by params.yaml key."""
    return {name: f.annotation for name, f in Params.model_fields.items()}  # type: ignore[misc]


def parse_params(raw: Any, source: str = "params") -> Params:
    """Validate an already-loaded mapping (``runtime`` included); raise a one-line :class:`PipelineError`."""
    if not isinstance(raw, dict):
        raise PipelineError(f"{source}: expected a mapping of sections (data:, base_model:, ...), got {type(raw).__name__}")
    raw = dict(raw)
    runtime = raw.pop("runtime", None) or {}
    if not isinstance(runtime, dict):
        raise PipelineError(f"{source}: runtime: expected a mapping of sections, got {type(runtime).__name__}")
    classes = section_classes()
    runtime = dict(runtime)
    if not isinstance(runtime.pop(ALLOW_REDUCED_ISOLATION, False), bool):  # default false (stages/schema/base.py)
        raise PipelineError(f"{source}: runtime.{ALLOW_REDUCED_ISOLATION}: expected true or false")
    for name in runtime:
        if name not in classes:
            raise PipelineError(f"{source}: runtime.{name}: unknown section; use one of {sorted(classes)}")
    merged = {name: merge_runtime(classes[name], raw[name], runtime.get(name), name, source) if name in classes
              and name in raw else value for name, value in raw.items()}
    try:
        params = Params.model_validate(merged)
    except ValidationError as e:
        raise PipelineError(format_error(source, e)) from None
    unknown = [m for m in params.report.models if m not in params.evaluate.models]
    if unknown:
        raise PipelineError(f"{source}: report.models: {unknown} not in evaluate.models ({sorted(params.evaluate.models)});"
                            " list only evaluated models")
    return params


def load_params(path: str | os.PathLike[str] = "params.yaml") -> Params:
    """Read and validate a whole params file (default ``params.yaml`` in the project root): YAML that loads
    ambiguously (:func:`check_yaml`) first, then every section's schema."""
    raw = read_params_file(path)
    check_yaml(path)
    return parse_params(raw, str(path))


def resolve(params: Params | str | os.PathLike[str]) -> dict[str, Any]:
    """Every value of a params file (a path, read with :func:`load_params`, or validated params), laid out as a
    complete file: each section without its runtime values, and those under ``runtime:`` (the mapping a file spelling
    out every key would load to; a script edits it and writes it out as a params file)."""
    if not isinstance(params, Params):
        params = load_params(params)
    out: dict[str, Any] = {name: getattr(params, name).tracked_dump() for name in Params.model_fields}
    out["runtime"] = {name: d for name in Params.model_fields if (d := getattr(params, name).runtime_dump())}
    return out


def record(params: Params, address: str) -> dict[str, Any]:
    """What the dvc.yaml stage ``address`` (``grpo``, ``evaluate@sft``) computes with: its section's tracked values,
    a foreach stage's own entry only (``evaluate: {common: ..., models: {sft: ...}}``). Stages write it beside their
    outputs (data/params/<stage>.yaml): the resolved values DVC's ``params:`` and the schema code dep track."""
    name, _, key = address.partition("@")
    values = getattr(params, name).tracked_dump()
    if key:
        values = {k: {key: v[key]} if isinstance(v, dict) and key in v else v for k, v in values.items()}
    return {name: values}


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        return {k: v for key, sub in node.items() for k, v in _leaves(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``key: value in a -> value in b`` for every dotted key whose value differs (``<absent>`` where one has none)."""
    la, lb = _leaves(a), _leaves(b)
    return [f"{k}: {la.get(k, '<absent>')!r} -> {lb.get(k, '<absent>')!r}" for k in sorted(set(la) | set(lb))
            if la.get(k, "<absent>") != lb.get(k, "<absent>")]


def main(argv: list[str] | None = None) -> int:
    """``python -m stages.params show [FILE]`` / ``diff A B``: a file's resolved values, or two files' differences."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stages.params", description="Resolved values of params files (an "
                                 "overlay on the paper's values, the schema's defaults).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("show", help="every value FILE resolves to").add_argument("file", nargs="?", default="params.yaml")
    d = sub.add_parser("diff", help="the values A and B resolve differently")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "show":
            print(yaml.safe_dump(resolve(load_params(args.file)), sort_keys=False, width=110), end="")
        else:
            print("\n".join(diff(resolve(load_params(args.a)), resolve(load_params(args.b)))) or "(no difference)")
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


_SEXAGESIMAL = re.compile(r"^[-+]?\d+(?::[0-5]?\d)+(?:\.\d*)?$")
_BOOL_WORDS = {"yes", "no", "on", "off", "y", "n"}


class _StrictLoader(_NoAliasLoader):
    """SafeLoader that reports (instead of silently resolving) what YAML 1.1 reads differently from what people mean."""

    problems: list[str]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                self.problems.append(f"line {line}: key {key!r} appears twice in one mapping (also line {seen[key]}; "
                                     "YAML keeps only the last); remove one")
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)

    def construct_scalar(self, node: yaml.ScalarNode) -> Any:  # type: ignore[override]
        value = super().construct_scalar(node)
        if node.style is None and isinstance(value, str):  # a plain (unquoted) scalar
            line = node.start_mark.line + 1
            word = value.strip()
            if node.tag == "tag:yaml.org,2002:bool" and word.lower() in _BOOL_WORDS:
                self.problems.append(f"line {line}: {word!r} is read as {str(word.lower() in ('yes', 'on', 'y')).lower()} "
                                     "(YAML 1.1); write true / false, or quote it for text")
            elif node.tag == "tag:yaml.org,2002:str" and _looks_numeric(word):
                self.problems.append(f"line {line}: {word!r} is read as the text {word!r}, not a number; write the "
                                     "number as 1.0e-4, 0.5 or 1000, or quote it for text")
            elif node.tag == "tag:yaml.org,2002:int" and (_SEXAGESIMAL.match(word) or
                                                          (len(word) > 1 and word.lstrip("+-").startswith("0")
                                                           and word.lstrip("+-").isdigit())):
                self.problems.append(f"line {line}: {word!r} is read as the number {yaml.safe_load(word)!r} (YAML 1.1 "
                                     "base 60 / octal); quote it, or write the number you mean")
        return value


def _looks_numeric(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return word.lower() not in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity")


def check_yaml(path: str | os.PathLike[str]) -> None:
    """Refuse YAML that loads other than it reads: duplicate keys (the first is silently dropped), unquoted
    yes / no / on / off (booleans in YAML 1.1), numbers read as text (``1_0.5``) and text read as numbers
    (``1:30``, ``010``). One line naming the file, the line and the fix."""
    text = Path(path).read_text(encoding="utf-8")
    loader = _StrictLoader(text)
    loader.problems = []
    try:
        loader.get_single_data()
    except yaml.YAMLError:
        return  # read_params_file reports syntax errors
    finally:
        loader.dispose()
    if loader.problems:
        raise PipelineError(f"{path}:{loader.problems[0].removeprefix('line ')}"
                            + (f" (and {len(loader.problems) - 1} more)" if len(loader.problems) > 1 else ""))


if __name__ == "__main__":
    raise SystemExit(main())

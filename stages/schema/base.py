"""What every params schema shares: the ``Section`` base, reusable field types, runtime fields, one-line errors
and loading one section from a params file.

Rules (tests/test_params.py checks them):
- every field has a default, the paper's value (arXiv 2402.03300; its docstring cites the section, or says the paper
  gives none), except what dvc.yaml reads to build the graph (the paths it interpolates, the named data sets and
  models, the groups it tracks): a params file names those, and holds only what differs from the paper for the rest;
- a params file is an overlay: a group it gives (``grpo: {rollout: {group_size: 8}}``) is written over the group's
  default field by field, however deep (:meth:`Section._over_defaults`); lists and named entries are replaced whole;
- DVC tracks what a file spells (``params: [section]``) and each schema module is a code dep of the stages that import
  it (dvc.yaml, generated from the import closure), so a file edit or a default edit re-runs the stages that read it;
  each stage records its resolved values beside its outputs (data/params/, ``stages.params.record``);
- extra keys are forbidden and every field has a docstring (pydantic's ``use_attribute_docstrings``);
- a bad value is reported as one line naming the key and what is expected, before any stage does work;
- no number is infinite or NaN (``allow_inf_nan=False`` for every section, nested models and containers
  included); timeouts, pool sizes and counts have upper bounds (:data:`TimeoutS`, :data:`Workers`,
  :data:`PosInt`), so a value that validates cannot overflow or hang a stage later;
- YAML anchors and aliases are refused (:func:`load_yaml`: an alias bomb is one line, not minutes at GBs); numbers
  read as YAML 1.2 does (DVC writes ``dvc exp run -S x=1e-5`` as ``1e-05``, a number to it and to the loader).

Runtime fields. A field annotated with :data:`RUNTIME` does not change what a stage computes (checkpoint and
logging intervals, worker counts, task-runner addresses). It is written under the top-level ``runtime:`` section
of params.yaml, at the same path as it has in its stage's section (``runtime.grpo.checkpoint_every``,
``runtime.pretrain.train.log_every``), and no dvc.yaml stage tracks ``runtime``: changing it re-runs nothing.
Their defaults run one local process. The loader merges ``runtime.<section>`` into ``<section>`` before validation,
so the stage code reads ``p.checkpoint_every`` as usual; a runtime field written in the tracked section (or a tracked
one under runtime) is a one-line error naming where it belongs. :meth:`Section.tracked_dump` is the section without
its runtime fields: what stages record with their outputs and hash for resumable runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from stages.core.errors import PipelineError


class _Runtime:
    """Marker (in ``Annotated[...]``) of a field that does not change results: see the module docstring."""

    def __repr__(self) -> str:
        return "RUNTIME"


RUNTIME = _Runtime()
"""Annotate a field ``Annotated[T, RUNTIME]`` to move it to params.yaml's untracked ``runtime:`` section."""


def _section_type(annotation: Any) -> type[Section] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


class Section(BaseModel):
    """Base for every params section: frozen, no unknown keys, docstrings as descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    SECTION: ClassVar[str | None] = None
    """The top-level params.yaml key of a stage's section class (None for nested models)."""

    @model_validator(mode="before")
    @classmethod
    def _over_defaults(cls, data: Any) -> Any:
        """A group given as a mapping is written over its field's default, key by key and as deep as the default
        has groups (``sft: {train: {lr: 1e-4}}`` keeps the default sft.train's other values); a mapping for a field
        without a default group is validated as it is (its own fields' defaults fill it)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if field is not None and isinstance(field.default, Section) and isinstance(value, dict):
                out[name] = _overlay(field.default, value)
        return out

    @classmethod
    def runtime_fields(cls) -> set[str]:
        """Names of this model's own fields marked :data:`RUNTIME` (not those of nested models)."""
        return {n for n, f in cls.model_fields.items() if any(m is RUNTIME for m in f.metadata)}

    @classmethod
    def runtime_paths(cls, prefix: str = "") -> list[str]:
        """Dotted paths of every runtime field below this model (nested models included)."""
        out = [f"{prefix}{n}" for n in sorted(cls.runtime_fields())]
        for n, f in cls.model_fields.items():
            sub = _section_type(f.annotation)
            if sub is not None:
                out.extend(sub.runtime_paths(f"{prefix}{n}."))
        return out

    def tracked_dump(self) -> dict[str, Any]:
        """``model_dump()`` without the runtime fields (recursively): the values DVC tracks for this section."""
        out = {}
        for n in type(self).model_fields:
            if n in type(self).runtime_fields():
                continue
            v = getattr(self, n)
            out[n] = v.tracked_dump() if isinstance(v, Section) else (
                {k: x.tracked_dump() if isinstance(x, Section) else x for k, x in v.items()} if isinstance(v, dict)
                else [x.tracked_dump() if isinstance(x, Section) else x for x in v] if isinstance(v, list)
                else (v.model_dump() if isinstance(v, BaseModel) else v))
        return out

    def runtime_dump(self) -> dict[str, Any]:
        """The runtime fields only (recursively; groups without any left out): the section's ``runtime:`` part."""
        out: dict[str, Any] = {}
        for n in type(self).model_fields:
            v = getattr(self, n)
            if n in type(self).runtime_fields():
                out[n] = v
            elif isinstance(v, Section) and type(v).runtime_paths():
                out[n] = v.runtime_dump()
        return out

    def updated(self, changes: dict[str, Any]) -> Any:
        """A validated copy with ``changes`` applied: keys are dotted paths below this model (``"optim.lr"``,
        ``"steps"``); a mapping value is merged into the group it names. Unlike ``model_copy(update=...)``, the
        validators run (a bad value is a ValidationError)."""
        data = self.model_dump()
        for key, value in changes.items():
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                node = node[part]
            node[leaf] = {**node[leaf], **value} if isinstance(value, dict) and isinstance(node.get(leaf), dict) \
                else value
        return type(self).model_validate(data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] = "params.yaml") -> Any:
        """Read ``path`` and validate this stage's section (``SECTION``) with its runtime values merged in.

        Only this section is validated; ``python -m flows.<stage>`` validates the whole file first
        (stages/params.py), so a bad value in another section still stops it before any work."""
        if cls.SECTION is None:
            raise TypeError(f"{cls.__name__} is not a top-level section")
        raw = read_params_file(path)
        return validate_section(cls, raw, str(path))


def _overlay(default: Section, over: dict[str, Any]) -> dict[str, Any]:
    """``default``'s values (a mapping) with ``over`` written over them; groups merged key by key."""
    merged = default.model_dump()
    for k, v in over.items():
        cur = getattr(default, k) if k in type(default).model_fields else None
        merged[k] = _overlay(cur, v) if isinstance(cur, Section) and isinstance(v, dict) else v
    return merged


# ---------------------------------------------------------------------------------------------
# reusable field types

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _check_model_ref(value: str | None) -> str | None:
    """A local HF model directory (must hold config.json) or a hub id ``org/name``."""
    if value is None:
        return None
    p = Path(os.path.expanduser(value))
    if p.exists():
        if not p.is_dir() or not (p / "config.json").is_file():
            raise ValueError(f"{value!r} is not a Hugging Face model directory (no config.json in it)")
        return value
    if _HUB_ID.match(value) and not value.startswith((".", "/", "~")):
        return value  # a hub id: resolved (downloaded) by transformers when the stage runs
    raise ValueError(f"model path {value!r} does not exist; give a HF model directory or a hub id org/name")


ModelRef = Annotated[str | None, AfterValidator(_check_model_ref)]
"""null, a local Hugging Face model directory, or a hub id (``org/name``)."""


def _check_data_path(value: str) -> str:
    if not value.strip():
        raise ValueError("give a path (a file, or a directory of *.jsonl files)")
    return value


DataPath = Annotated[str, AfterValidator(_check_data_path)]
"""A file or directory a stage reads (relative to the project root): a dvc dependency of that stage (dvc.yaml
templates it), checked when the stage runs (an earlier stage may write it), never null."""

MAX_COUNT = 2**53
"""The largest count or size a params file may give (exact in a float64 and in JSON; 9e15 tokens, steps, ...)."""
MAX_TIMEOUT_S = 3600.0
"""The longest timeout a params file may give, in seconds (the sandbox itself refuses more than a day)."""
MAX_WORKERS = 1024

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
PosInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PosFloat = Annotated[float, Field(gt=0.0)]
TimeoutS = Annotated[float, Field(gt=0.0, le=MAX_TIMEOUT_S)]
"""A timeout in seconds: more than 0, at most :data:`MAX_TIMEOUT_S`."""
DelayS = Annotated[float, Field(ge=0.0, le=MAX_TIMEOUT_S)]
"""A wait in seconds: 0 to :data:`MAX_TIMEOUT_S`."""
Workers = Annotated[int, Field(gt=0, le=MAX_WORKERS)]
"""A pool size (threads or processes): 1 to :data:`MAX_WORKERS`."""


# ---------------------------------------------------------------------------------------------
# reading and validating


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses anchors (``&name``) and aliases (``*name``) where they appear, before any
    value is built: a 12 KB alias bomb ("billion laughs") otherwise expands to gigabytes when the values are
    walked. Params and the pipeline's other YAML files need neither."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, "YAML anchors and aliases (&name / *name) are not allowed; "
                                              "write the values out", event.start_mark)
        return super().compose_node(parent, index)


# YAML 1.2's floats that YAML 1.1 (PyYAML) reads as text: an exponent without a dot or a sign (``1e-05``, ``1e5``),
# as DVC (ruamel, YAML 1.2) reads and writes them (``dvc exp run -S grpo.optim.lr=1e-5`` writes ``lr: 1e-05``).
_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_NoAliasLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))

MAX_YAML_BYTES = 16 << 20


def load_yaml(path: str | os.PathLike[str], *, what: str = "YAML file") -> Any:
    """Read a YAML file the pipeline takes as input (params files, dvc.yaml, dvc.lock): at most
    :data:`MAX_YAML_BYTES`, no anchors or aliases, no nesting deeper than Python's recursion allows. Every
    problem is one :class:`PipelineError` line naming the file (and the line)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_YAML_BYTES:
            raise PipelineError(f"{p}: {size} bytes, more than a {what} may have ({MAX_YAML_BYTES}); is it the "
                                "right file?")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipelineError(f"{p}: {what} not found") from None
    except UnicodeDecodeError:
        raise PipelineError(f"{p}: not UTF-8 text; is it the right file?") from None
    except OSError as e:
        raise PipelineError(f"{p}: cannot read the {what}: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}:" if where is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        fix = "" if "anchors" in problem else "; fix the syntax"
        raise PipelineError(f"{p}:{line} {problem}{fix}") from None
    except RecursionError:
        raise PipelineError(f"{p}: nested too deeply to read; is it the right file?") from None


def read_params_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The params file as a mapping; a missing file, bad YAML (anchors and aliases included: :func:`load_yaml`) or a
    non-mapping is a one-line error."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: params file not found; run from the project root or pass --params PATH")
    raw = load_yaml(p, what="params file")
    if not isinstance(raw, dict):
        raise PipelineError(f"{p}: expected a mapping of sections (data:, base_model:, ...), got {type(raw).__name__}")
    _protect_named_paths(raw)
    runtime = raw.get("runtime")
    _REDUCED_ISOLATION[0] = isinstance(runtime, dict) and runtime.get(ALLOW_REDUCED_ISOLATION) is True
    return raw


ALLOW_REDUCED_ISOLATION = "allow_reduced_isolation"
"""``runtime.allow_reduced_isolation`` (true / false, default false; the one runtime key of no single stage): run model-written programs
(PoT / TIR evaluation and rollouts) even where the code sandbox cannot keep them from the caller's files (no file-system
allow-list: a kernel without unprivileged user namespaces, macOS, ...). false: such a run refuses to start with one
line naming what is missing and the fix (``stages.core.sandbox.require_isolation``); true: it runs, and its metrics
record that isolation was reduced. (stages/params.py validates it.)"""
_REDUCED_ISOLATION = [False]


def reduced_isolation_allowed() -> bool:
    """``runtime.allow_reduced_isolation`` of the params file this process read last."""
    return _REDUCED_ISOLATION[0]


_NAMED_PATHS: set[str] = set()


def named_paths() -> set[str]:
    """Every absolute (or ``~``) path the params files read by this process name: the code sandbox never shows them,
    even where one lies inside its allow-list (``stages.core.sandbox.get_executor``). Relative paths lie in the
    project, which the sandbox never shows."""
    return set(_NAMED_PATHS)


def _protect_named_paths(raw: Any) -> None:
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str) and node.startswith(("/", "~")) and "\n" not in node and len(node) < 4096:
            _NAMED_PATHS.add(node)

    walk(raw)


def format_error(source: str, err: ValidationError, prefix: str = "") -> str:
    """One line for a pydantic error: ``<source>: <key>: <what is wrong> (got <value>)`` per problem."""
    parts = []
    for e in err.errors():
        key = (prefix + ".".join(str(x) for x in e["loc"])).rstrip(".") or "(top level)"
        if e["type"] == "missing":
            parts.append(f"{key}: missing; add it (no default: dvc.yaml reads it, or it describes your data)")
        elif e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key; remove it or check its spelling")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = repr(e.get("input"))
            # a cross-field check's input is the whole mapping: the message names the fields already
            parts.append(f"{key}: {msg}" + (f" (got {got})" if len(got) <= 80 else ""))
    return f"{source}: " + "; ".join(parts)


def merge_runtime(cls: type[Section], tracked: Any, runtime: Any, where: str, source: str) -> Any:
    """``tracked`` (a section's mapping) with the runtime values of ``runtime`` merged in, checked both ways.

    ``where`` is the section's dotted key (``grpo``, ``pretrain.train``). Raises a one-line PipelineError when a
    runtime field sits in the tracked section or a tracked field under runtime (a runtime value not given keeps its
    default)."""
    if not isinstance(tracked, dict):
        return tracked  # pydantic reports the wrong type
    runtime = {} if runtime is None else runtime
    if not isinstance(runtime, dict):
        raise PipelineError(f"{source}: runtime.{where}: expected a mapping, got {type(runtime).__name__}")
    own = cls.runtime_fields()
    merged = dict(tracked)
    for name in own & set(tracked):
        raise PipelineError(f"{source}: {where}.{name}: a runtime value (it does not change results, so DVC does not "
                            f"track it); move it to runtime.{where}.{name}")
    for name, value in runtime.items():
        field = cls.model_fields.get(name)
        sub = _section_type(field.annotation) if field is not None else None
        if name in own:
            merged[name] = value
        elif sub is not None and sub.runtime_paths():
            merged[name] = merge_runtime(sub, tracked.get(name, {}), value, f"{where}.{name}", source)
        elif field is not None:
            raise PipelineError(f"{source}: runtime.{where}.{name}: not a runtime value (it changes results); "
                                f"move it to {where}.{name}")
        else:
            raise PipelineError(f"{source}: runtime.{where}.{name}: unknown key; remove it or check its spelling")
    for name, field in cls.model_fields.items():
        sub = _section_type(field.annotation)
        if sub is not None and sub.runtime_paths() and name not in runtime and name in tracked:
            merged[name] = merge_runtime(sub, tracked[name], None, f"{where}.{name}", source)
    return merged


def validate_section(cls: type[Section], raw: dict[str, Any], source: str) -> Any:
    """Validate section ``cls.SECTION`` of a loaded params mapping, its runtime values merged in."""
    name = cls.SECTION
    assert name is not None
    if name not in raw:
        raise PipelineError(f"{source}: section {name}: missing; add it ({name}: {{}} for the paper's values; dvc.yaml "
                            "tracks the section)")
    runtime = raw.get("runtime") or {}
    if not isinstance(runtime, dict):
        raise PipelineError(f"{source}: runtime: expected a mapping of sections, got {type(runtime).__name__}")
    merged = merge_runtime(cls, raw[name], runtime.get(name), name, source)
    try:
        return cls.model_validate(merged)
    except ValidationError as e:
        raise PipelineError(format_error(source, e, prefix=f"{name}.")) from None

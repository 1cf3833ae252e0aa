"""Every check that needs none of a stage's own computation, run when params are loaded, before any work.

``python -m flows.<stage>``, ``python -m flows.pipeline`` and ``python -m stages.<stage>`` (the rank entry) call
:func:`check` right after validating the params file (stages/params.py), before Prefect starts and before any
output is touched. What it checks, for the stages about to run:

- input files and directories named in params (``corpus.crawl_path``, ``pretrain.mixture[*].path``,
  ``sft.problems``, prompt and benchmark files, ``corpus.domains.approve``, a launcher's hostfile), skipping the
  paths that an earlier stage of the same run writes (``produced``);
- model directories (``base_model.checkpoint``, ``evaluate.models.<m>.path`` when no stage writes it): config,
  weights and tokenizer (stages/core/model_files.py);
- the rows of the problem files that exist already (question, answer and the fields the stage needs; an empty
  file), read with the stages' own reader (stages/core/problems.py), naming the file and line to edit;
- cross-section constraints: each training stage's ``seq_len`` within the start model's context length;
- custom reward functions (``grpo.reward.custom``): each ``module:function`` imports and is callable;
- the launcher: torchrun / deepspeed installed when asked for.

One problem is one :class:`~stages.core.errors.PipelineError` line naming the key and the fix. Files an upstream
stage writes during the run are checked by the stage that reads them, where they enter (its own command runs
these checks again before its flow starts). Like stages/params.py this module can only refuse to run, never change what a stage
computes: dvc.yaml does not list it as a code dep (tests/flows/test_dvc_yaml.py, ``VALIDATION_ONLY``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from stages.core import paths, problems
from stages.core.errors import PipelineError
from stages.core.model_files import context_length, model_dir_problem
from stages.params import Params
from stages.rl.needs import run_needs


def _norm(path: str | os.PathLike[str]) -> str:
    return os.path.normpath(os.path.expanduser(str(path)))


def _is_produced(path: str, produced: Collection[str]) -> bool:
    """``path`` is (inside) an output of a stage that runs before the one reading it, or a directory that such an
    output is in (``data/testsets``, where each testsets@ stage writes its file)."""
    p = _norm(path)
    return any(p == q or p.startswith(q.rstrip(os.sep) + os.sep) or q.startswith(p.rstrip(os.sep) + os.sep)
               for q in map(_norm, produced))  # the last: a directory an earlier stage writes into


def _remote(path: str) -> bool:
    return "://" in str(path)  # fsspec URLs (s3://, gs://, hf://): checked by the stage that opens them


def _need_file(key: str, path: str | None, produced: Collection[str], hint: str = "fix the path") -> None:
    if path is None or _remote(path) or _is_produced(path, produced):
        return
    p = Path(os.path.expanduser(path))
    if not p.exists():
        raise PipelineError(f"{key}: {path} not found; {hint}")
    if not p.is_file():
        raise PipelineError(f"{key}: {path} is a directory; give a file")


def _rows(path: str | None, produced: Collection[str], what: str, *, sft: bool = False,
          fields: Iterable[str] = (), key: str = "") -> None:
    """The rows of a problem file (or directory of them) that exists now (not one an earlier stage of this run
    writes): checked here, with the stages' own reader (stages/core/problems.py), so a bad row stops the run before
    any work; every row must also have ``fields`` (what ``key`` needs)."""
    if path is None or _remote(path) or _is_produced(path, produced) or not Path(path).exists():
        return
    rows = problems.load_sft_rows(path) if sft else problems.load_rows(path, what)
    for name in fields:
        missing = sum(1 for r in rows if name not in r)
        if missing:
            raise PipelineError(f"{key} needs a {name!r} field in every row of {path}; {missing} of {len(rows)} rows "
                                "have none (use a source that does not, or rows that have it)")


def _need_input(key: str, path: str, produced: Collection[str], hint: str) -> None:
    """A file, or a directory of *.jsonl / *.parquet files, or a datasets save_to_disk directory."""
    if _remote(path) or _is_produced(path, produced):
        return
    p = Path(os.path.expanduser(path))
    if not p.exists():
        raise PipelineError(f"{key}: {path} not found; {hint}")
    if p.is_dir() and not ((p / "dataset_info.json").is_file() or (p / "state.json").is_file()
                           or any(f.suffix in (".jsonl", ".parquet") for f in p.iterdir())):
        raise PipelineError(f"{key}: {path} holds no *.jsonl or *.parquet files and is not a datasets directory")


def _need_model(key: str, path: str | None, produced: Collection[str], *, tokenizer: bool = True,
                writer: str | None = None) -> None:
    """``writer``: the stage that writes this directory (a missing one is then a stage to run, not a bad path)."""
    if path is None or _is_produced(path, produced):
        return
    p = Path(os.path.expanduser(path))
    if not p.exists():
        if writer is not None:
            raise PipelineError(f"{key}: {path} not found; run the {writer} stage first (dvc repro {writer})")
        if str(path).count("/") == 1 and not str(path).startswith((".", "/", "~")):
            return  # a hub id (org/name): resolved by transformers when the stage runs
        raise PipelineError(f"{key}: {path} not found; give a Hugging Face model directory or a hub id org/name")
    problem = model_dir_problem(p, tokenizer=tokenizer)
    if problem is not None:
        raise PipelineError(f"{key}: {path} {problem}; point it at a complete save_pretrained() directory")


def _start_context(params: Params, model_dir: str, produced: Collection[str]) -> tuple[int | None, str]:
    """The context length of the model a training stage starts from, and where it comes from."""
    bm = params.base_model
    if Path(model_dir).exists() and not _is_produced(model_dir, produced):
        return context_length(model_dir), f"{model_dir}/config.json"
    if bm.checkpoint is None:
        return bm.max_position_embeddings, "base_model.max_position_embeddings"
    if Path(os.path.expanduser(bm.checkpoint)).exists():
        return context_length(bm.checkpoint), f"{bm.checkpoint}/config.json"
    return None, ""


def _check_seq_len(stage: str, seq_len: int, params: Params, model_dir: str, produced: Collection[str]) -> None:
    n, source = _start_context(params, model_dir, produced)
    if n is not None and seq_len > n:
        raise PipelineError(f"{stage}.train.seq_len: {seq_len} is above the start model's context length {n} "
                            f"({source}); use at most {n}")


def _check_launcher(stage: str, launcher: Any) -> None:
    if launcher.kind == "torchrun" and importlib.util.find_spec("torch.distributed.run") is None:
        raise PipelineError(f"runtime.{stage}.launcher.kind: torchrun needs torch.distributed; install torch with it")
    if launcher.kind == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            raise PipelineError(f"runtime.{stage}.launcher.kind: deepspeed is not installed (pip install deepspeed, "
                                "see .ci/setup); or use kind torchrun")
        if launcher.nnodes > 1 and launcher.hostfile is None:
            raise PipelineError(f"runtime.{stage}.launcher.hostfile: {launcher.nnodes} nodes need a hostfile "
                                "('host slots=N' per node)")
    if launcher.hostfile is not None and not Path(os.path.expanduser(launcher.hostfile)).is_file():
        raise PipelineError(f"runtime.{stage}.launcher.hostfile: {launcher.hostfile} not found; give an existing "
                            "hostfile or null")
    if launcher.kind != "none" and shutil.which("ssh") is None and launcher.nnodes > 1:
        raise PipelineError(f"runtime.{stage}.launcher: {launcher.nnodes} nodes need ssh on this machine")


def _corpus(p: Params, produced: Collection[str]) -> None:
    c = p.corpus
    data_hint = "run the data stage (dvc repro data) or fix the path"
    paths.write_target(c.work_dir or str(paths.DATA), "corpus.work_dir")  # where it writes: the project or a data root
    _need_input("corpus.crawl_path", c.crawl_path, produced, data_hint)
    _need_input("corpus.seed_path", c.seed_path, produced, data_hint)
    for split in ("sft", "rl", "test"):
        _need_file("corpus.problems_dir", str(Path(c.problems_dir) / f"{split}.jsonl"), produced, data_hint)
    _need_input("corpus.decontam.testsets", c.decontam.testsets, produced,
                "run the testsets stage (dvc repro testsets) or fix the path")
    for split in ("sft", "rl"):  # copied into data/corpus/problems: the rows the corpus stage reads as they are
        path = str(Path(c.problems_dir) / f"{split}.jsonl")
        if not _is_produced(path, produced) and Path(path).is_file():
            problems.read_rows(path, what=f"{split.upper()} problem")
    if c.domains.approve != "auto":
        _need_file("corpus.domains.approve", c.domains.approve, produced, "set it to auto or to an existing file")
        from stages.corpus.domains import read_approved  # its format, checked by its own reader

        read_approved(c.domains.approve)


def _base_model(p: Params, produced: Collection[str]) -> None:
    _need_model("base_model.checkpoint", p.base_model.checkpoint, produced)


def _pretrain(p: Params, produced: Collection[str]) -> None:
    _need_model("pretrain (start model data/models/base)", "data/models/base", produced, writer="base_model")
    for i, src in enumerate(p.pretrain.mixture):
        _need_file(f"pretrain.mixture[{i}].path", src.path, produced,
                   "run the stage that writes it (dvc repro corpus) or fix the path")
    _check_seq_len("pretrain", p.pretrain.train.seq_len, p, "data/models/base", produced)
    _check_launcher("pretrain", p.pretrain.launcher)


def _sft(p: Params, produced: Collection[str]) -> None:
    if not p.sft.enabled:
        return
    _need_input("sft.problems", p.sft.problems, produced, "run the stage that writes it (dvc repro) or fix the path")
    _rows(p.sft.problems, produced, "SFT problem", sft=True)
    _check_launcher("sft", p.sft.launcher)
    _need_model("sft (start model data/models/pretrain)", "data/models/pretrain", produced, writer="pretrain")
    _check_seq_len("sft", p.sft.train.seq_len, p, "data/models/pretrain", produced)


def _reward_model(p: Params, produced: Collection[str]) -> None:
    if not p.reward_model.enabled:
        return
    _need_input("reward_model.prompts_file", p.reward_model.prompts_file, produced,
                "run the stage that writes it (dvc repro) or fix the path")
    _rows(p.reward_model.prompts_file, produced, "RL prompt")
    _need_model("reward_model (start model data/models/sft)", "data/models/sft", produced, writer="sft")


def _grpo(p: Params, produced: Collection[str]) -> None:
    g = p.grpo
    from stages.rl.algorithms import get_algorithm  # the stage's own call: imports every custom reward function

    get_algorithm(g.algorithm).reward_functions(g)
    needs = run_needs(g)  # what the algorithm and the reward source declare they need (stages/rl/needs.py)
    hint = "run the stage that writes it (dvc repro) or fix the path"
    _need_input("grpo.prompts_file", g.prompts_file, produced, hint)
    _need_input("grpo.heldout.problems_file", g.heldout.problems_file, produced, hint)
    _rows(g.prompts_file, produced, "RL prompt", fields=needs.row_fields, key=f"grpo.reward.source {g.reward.source}")
    _check_launcher("grpo", g.launcher)
    start = g.start  # the SFT model, or the pretrained one (R1-Zero style)
    _need_model(f"grpo.start ({start}: data/models/{start})", f"data/models/{start}", produced, writer=start)
    if needs.reward_model:  # the reward source's spec, or PPO's value model initialised from the RM
        _need_model(f"grpo.reward.source {g.reward.source} / algorithm {g.algorithm} (data/models/reward_model)",
                    "data/models/reward_model", produced, tokenizer=False, writer="reward_model")


def _evaluate(p: Params, model: str, produced: Collection[str]) -> None:
    e = p.evaluate
    if model not in e.models:
        raise PipelineError(f"evaluate: unknown model {model!r}; evaluate.models has {sorted(e.models)}")
    _need_model(f"evaluate.models.{model}.path", e.models[model].path, produced)
    for name in e.common.benchmarks:
        base = Path(e.common.testsets)
        path = str(base if base.is_file() and base.stem == name else base / f"{name}.jsonl")  # as the stage reads it
        _need_file("evaluate.common.benchmarks", path, produced, f"run dvc repro testsets@{name} or fix the name")
        if not _is_produced(path, produced):
            problems.load_problem_file(path)  # the evaluation's own loader: a bad row named before any model loads


def _datasets(section: str, specs: dict[str, Any], item: str, produced: Collection[str]) -> None:
    for name, d in specs.items():
        if item and name != item:
            continue
        if d.hub is None:  # a hub data set is fetched (and its snapshot checked) by the stage
            _need_input(f"{section}.datasets.{name}.path", d.path, produced,
                        "fix the path (a JSONL / Parquet file, a directory of them, or a save_to_disk directory)")


_CHECKS = {"corpus": _corpus, "base_model": _base_model, "pretrain": _pretrain, "sft": _sft,
           "reward_model": _reward_model, "grpo": _grpo}


def check(params: Params, stages: Iterable[str], produced: Collection[str] = ()) -> None:
    """Run the checks of ``stages`` (dvc.yaml addresses: ``sft``, ``evaluate@grpo``) in order; raise the first
    problem as a one-line :class:`PipelineError`. ``produced``: paths written by stages that run before these
    ones in the same run (their existence is not required yet)."""
    for stage in stages:
        group, _, item = stage.partition("@")
        if group == "evaluate":
            if item:
                _evaluate(params, item, produced)
            continue
        if group in ("testsets", "ingest"):
            _datasets(group, getattr(params, group).datasets, item, produced)
            continue
        fn = _CHECKS.get(group)
        if fn is not None:
            fn(params, produced)

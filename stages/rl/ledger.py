"""The rollout ledger: every RL step's rollouts as a Parquet file, an output of the grpo stage.

``data/ledger/grpo/step-000012.parquet`` (``step-000012-rank1.parquet`` for rank 1 of a multi-rank launch) holds one
row per output of the step, with every input of the step's update and what it logged::

    step, iteration, rank, output        int       the output's row in the step's rollout (n = q * G + g)
    question, row_id, question_text      the prompt row (its index in the prompt file, its id, its question)
    answer, mode, finish_reason, text    gold answer, rollout mode (cot / pot / tir), "stop" / "length", completion text
    prompt_ids, completion_ids           list<int32>: exactly the ids the sampler got and produced (token in / out)
    sampler_logprobs                     list<float32>: the sampler's log-prob of each completion token (0 on injected)
    loss_mask                            list<float32>: the update's loss mask (0: tool output, excluded, skipped group)
    reward, reward_parts                 float64, and struct<part: float64> (the rule functions' values)
    advantage / advantage_tokens         float32 per output, or list<float32> per token (process supervision); for
                                         rft / online rft the gradient coefficient
    ref_logprobs, old_logprobs           list<float32> or null: pi_ref's log-probs (the KL), pi_old's separate pass
    weight_hash                          a fingerprint of the policy's weights that sampled the step (blake2b-128
                                         of names, dtypes, shapes and exact byte checksums: :func:`weight_hash`)
    loss, grad_norm                      the step's logged loss and gradient norm
    checker, checker_version             the answer checker mode and version that judged correctness

The file's metadata (``ledger`` key, JSON) holds the ledger version, the whole grpo params section (runtime values
included), the start model, the step's tensor layout (prompt width P, completion width T, group size) and the dtypes
of the targets, so that :mod:`stages.rl.replay` rebuilds the step's tensors exactly and runs the same update.

During a run the files go to the run's checkpoint directory (``checkpoints/grpo/<run hash>/ledger``: a resumed run
rewrites the steps after its checkpoint with the same bytes); the stage then moves them to ``data/ledger/grpo`` at
once (atomically). Each file is written atomically too. Size: ~70-100 kB per step on the tiny default (16 x 8 outputs
of up to 64 tokens), dominated by the three per-token float lists (zstd).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from stages.core.dist import rank, world_size
from stages.core.io import atomic_path

LEDGER_VERSION = 1
README = "_README.md"  # a leading underscore: pyarrow.dataset skips it when reading the directory


_P = 65521
_CHUNK = _P * 64  # a multiple of _P: every chunk's position weights are the same tensor
_WEIGHTS: dict[str, torch.Tensor] = {}


def _checksums(t: torch.Tensor) -> tuple[int, int]:
    """Two exact integer checksums of a tensor's bytes, computed where it lives (no copy to the host): its 16-bit words
    (bytes for 1-byte dtypes) u_i as integers, sum_i u_i and sum_i u_i (i mod 65521 + 1). Each chunk of 65521 x 64
    words is summed in float64, exactly: every term and partial sum is an integer below 2^53 (|u_i| < 2^15, the weights
    <= 2^16, 2^22 terms), and an exact sum does not depend on the order of the additions, so the same bytes give the
    same numbers on every device; the chunks add up in Python integers."""
    x = t.detach().contiguous().reshape(-1)
    u = x.view(torch.uint8) if x.element_size() == 1 else x.view(torch.int16)
    key = str(u.device)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = torch.arange(_CHUNK, device=u.device, dtype=torch.float64).remainder_(_P).add_(1)
    w = _WEIGHTS[key]
    s1 = s2 = 0
    for i in range(0, u.numel(), _CHUNK):
        c = u[i : i + _CHUNK].to(torch.float64)
        s1 += int(c.sum())
        s2 += int(torch.dot(c, w[: c.numel()]))
    return s1, s2


def weight_hash(model: Any) -> str:
    """A fingerprint of a model's weights: blake2b-128 over every state-dict tensor's name, dtype, shape and the two
    byte checksums of :func:`_checksums`, in name order: nothing is copied to the host (a GPU's weights are summed on
    the GPU); ~0.1 s for the tiny default's 3.9M parameters on this CPU (blake2b over the bytes: ~0.05 s, but it
    needs them on the host). Any changed or swapped byte changes a checksum."""
    h = hashlib.blake2b(digest_size=16)
    net = getattr(model, "module", model)
    for name, t in sorted(net.state_dict().items()):
        s1, s2 = _checksums(t)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|{s1}|{s2};".encode())
    return h.hexdigest()


def checker_info(p: Any) -> tuple[str, str]:
    """(mode, version) of the answer checker the rule reward judges with: ``grpo.reward.checker`` where the params have
    it (else DeepSeekMath's rules, the only mode), and stages/core/answers.py's ``CHECKER_VERSION`` (else "1")."""
    from stages.core import answers

    return str(getattr(p.reward, "checker", "deepseekmath")), str(getattr(answers, "CHECKER_VERSION", "1"))


def step_file(directory: Path, step: int, rank_: int | None = None) -> Path:
    """The ledger file of ``step`` (of this rank, when several)."""
    r = rank() if rank_ is None else rank_
    suffix = f"-rank{r}" if (world_size() > 1 or r) else ""
    return Path(directory) / f"step-{step:06d}{suffix}.parquet"


def _lists(x: torch.Tensor, lengths: list[int], offset: int = 0) -> list[list[float]]:
    rows = x.tolist()
    return [r[offset : offset + n] for r, n in zip(rows, lengths, strict=True)]


class LedgerWriter:
    """Writes each step's Parquet file into ``directory`` (:func:`record`, called by the step)."""

    def __init__(self, directory: str | os.PathLike[str], p: Any, init: str | os.PathLike[str] | None = None) -> None:
        self.dir = Path(directory)
        self.p = p
        self.init = str(init) if init is not None else None
        self.hash: str | None = None
        self.bytes_written = 0

    def begin(self, policy: Any) -> None:
        """Before the step samples: hash the policy's weights (the sampler's, checked by stages/rl/sync.py)."""
        self.hash = weight_hash(policy)

    def _meta(self, pad_id: int, tg: Any, lp: Any, P: int, T: int, G: int) -> dict[str, Any]:
        """The file's metadata: the params, the start model, the tensor layout, which log-probs it holds."""
        w = tg.weights
        return {
            "ledger_version": LEDGER_VERSION,
            "params": self.p.model_dump(mode="json"),
            "init": self.init,
            "pad_id": pad_id,
            "prompt_len": P,
            "completion_len": T,
            "group_size": G,
            "world_size": world_size(),
            "weights_dtype": None if w is None else str(w.dtype).removeprefix("torch."),
            "loss_mask_dtype": str(tg.loss_mask.dtype).removeprefix("torch."),
            "has_ref": lp.ref is not None,
            "has_old": lp.old is not None,
            "has_values": lp.values is not None,
        }

    def record(self, models: Any, iteration: int, batch: Any, rewards: Any, tg: Any, lp: Any,
               row: dict[str, Any]) -> Path | None:
        """Write the step's file (None when the step had no rollout: rft kept nothing)."""
        ro = batch.rollout
        if ro is None:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        N, P, T, G = ro.input_ids.shape[0], ro.prompt_len, ro.completion_mask.shape[1], ro.group_size
        plens, clens = ro.attention_mask[:, :P].sum(-1).tolist(), ro.completion_mask.sum(-1).long().tolist()
        ids = ro.input_ids.tolist()
        prompt_ids = [r[P - k : P] for r, k in zip(ids, plens, strict=True)]
        completion_ids = [r[P : P + k] for r, k in zip(ids, clens, strict=True)]
        qs = list(batch.questions)
        question = [qs[n // G] if len(qs) * G == N else -1 for n in range(N)]
        out = rewards.output.reshape(-1).tolist() if rewards.output.numel() == N else [math.nan] * N
        w = tg.weights
        per_token = w is not None and w.dim() == 2
        checker, version = checker_info(self.p)
        cols: dict[str, Any] = {
            "step": pa.array([batch.step] * N, pa.int32()),
            "iteration": pa.array([iteration] * N, pa.int16()),
            "rank": pa.array([rank()] * N, pa.int16()),
            "output": pa.array(list(range(N)), pa.int32()),
            "question": pa.array(question, pa.int32()),
            "row_id": pa.array([str(r.get("id", "")) for r in ro.rows], pa.string()),
            "question_text": pa.array([str(r.get("question", "")) for r in ro.rows], pa.string()),
            "answer": pa.array([str(r.get("answer", "")) for r in ro.rows], pa.string()),
            "mode": pa.array(list(ro.modes) if ro.modes else ["cot"] * N, pa.string()),
            "finish_reason": pa.array(list(ro.finish_reasons), pa.string()),
            "text": pa.array(list(ro.texts), pa.string()),
            "prompt_ids": pa.array(prompt_ids, pa.list_(pa.int32())),
            "completion_ids": pa.array(completion_ids, pa.list_(pa.int32())),
            "sampler_logprobs": pa.array(_lists(ro.sampler_logprobs, clens), pa.list_(pa.float32())),
            "loss_mask": pa.array(_lists(tg.loss_mask, clens), pa.list_(pa.float32())),
            "reward": pa.array(out, pa.float64()),
            "advantage": pa.array(w.tolist() if w is not None and not per_token else [None] * N, pa.float32()),
            "advantage_tokens": pa.array(_lists(w, clens) if per_token else [None] * N, pa.list_(pa.float32())),
            "ref_logprobs": pa.array(_lists(lp.ref, clens) if lp.ref is not None else [None] * N, pa.list_(pa.float32())),
            "old_logprobs": pa.array(_lists(lp.old, clens) if lp.old is not None else [None] * N, pa.list_(pa.float32())),
            "weight_hash": pa.array([self.hash] * N, pa.string()),
            "loss": pa.array([float(row.get("loss", math.nan))] * N, pa.float64()),
            "grad_norm": pa.array([float(row.get("grad_norm", math.nan))] * N, pa.float64()),
            "checker": pa.array([checker] * N, pa.string()),
            "checker_version": pa.array([version] * N, pa.string()),
        }
        if rewards.parts:
            cols["reward_parts"] = pa.StructArray.from_arrays(
                [pa.array([float(v) for v in vals], pa.float64()) for vals in rewards.parts.values()],
                names=list(rewards.parts),
            )
        meta = self._meta(models.tokenizer.pad_token_id, tg, lp, P, T, G)
        table = pa.table(cols).replace_schema_metadata({"ledger": json.dumps(meta)})
        path = step_file(self.dir, batch.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self.bytes_written += path.stat().st_size
        return path


def run_writer(p: Any, ckpt_dir: Path | None, init: str | os.PathLike[str] | None) -> LedgerWriter | None:
    """The stage's writer: into ``ckpt_dir/ledger`` (kept across a resume) when ``grpo.ledger.enabled``."""
    return LedgerWriter(Path(ckpt_dir) / "ledger", p, init) if p.ledger.enabled and ckpt_dir is not None else None


def finish(src: Path | None, dest: str | os.PathLike[str], enabled: bool, steps: int) -> dict[str, Any]:
    """Move the run's ledger files from ``src`` to ``dest`` at once (atomically, with a README), keeping only the
    files of steps < ``steps`` (a resumed run's earlier ones are rewritten anyway); returns size figures for the
    stage's metrics."""
    with atomic_path(dest) as tmp:
        tmp.mkdir(parents=True)
        files = sorted(src.glob("step-*.parquet")) if enabled and src is not None and src.is_dir() else []
        files = [f for f in files if int(f.name[5:11]) < steps]
        total = 0
        for f in files:
            shutil.move(f, tmp / f.name)
            total += (tmp / f.name).stat().st_size
        (tmp / README).write_text(
            "# The grpo stage's rollout ledger\n\n"
            + (
                "One Parquet file per RL step (stages/rl/ledger.py has the columns). Read: "
                "`pandas.read_parquet('data/ledger/grpo')`; replay a step: `python -m stages.rl.replay --step N`.\n"
                if enabled
                else "grpo.ledger.enabled is false: no ledger was written.\n"
            )
        )
    n = len({f.name[:11] for f in files})
    return {"ledger_files": len(files), "ledger_bytes": total, "ledger_bytes_per_step": round(total / n) if n else 0}


def read_step(directory: str | os.PathLike[str], step: int) -> tuple[Any, dict[str, Any]]:
    """(pyarrow table, metadata) of one step's ledger (rank 0's file)."""
    import pyarrow.parquet as pq

    path = step_file(Path(directory), step, 0)
    if not path.exists():
        raise FileNotFoundError(str(path))
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"ledger"])
    return table, meta


def steps_in(directory: str | os.PathLike[str]) -> list[int]:
    """The steps the ledger has a (rank-0) file for, in order."""
    return sorted(int(f.name[5:11]) for f in Path(directory).glob("step-*.parquet") if "-rank" not in f.name)

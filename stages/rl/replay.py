"""Replay RL steps from the rollout ledger: recompute a step's loss and gradient norm from the ledger and the saved
checkpoint, and compare them with the logged values.

::

    python -m stages.rl.replay --step 12                 # data/ledger/grpo, the run's checkpoints if still there
    python -m stages.rl.replay --step 0 1 2 --ledger DIR --checkpoints checkpoints/grpo/<run hash>

How. The ledger file of a step (stages/rl/ledger.py) holds every input of its update: the exact token ids, the loss
mask, the advantages, pi_ref's (and a separate pass's pi_old) log-probs, the sampler's log-probs (the rollout
correction's input), the grpo params and the tensor layout. The weights before step N come from

- the latest resumable checkpoint at or before N (stages/rl/checkpoint.py; ``checkpoint_every``; the run directory is
  the stage's own, ``checkpoints/grpo/<run hash>``, found from the ledger's params and inputs, or ``--checkpoints``),
  which also restores the optimizer state; or
- the start model (``init`` in the ledger; step 0, a fresh optimizer),

and are rolled forward through steps c .. N - 1 by running each step's update again from the ledger: the weight hash
before every step must equal the logged one (else the replay stops: the weights diverged). Then step N's update runs
(``stages.rl.loop.update``, the very code of the run, on the rebuilt :class:`Batch` / :class:`Targets` /
:class:`LogProbs`) and its loss and gradient norm are compared with the ledger's: equal to ``--tol`` (1e-6, relative
with an absolute floor of the same size) in float32 on the machine that ran it. The exit status is 0 when every
replayed step matches.

Not replayed: PPO (its value model is not in the ledger), multi-rank runs (each rank's file is its share of the
step's batch: replay with the same launch), steps without a rollout (rft kept nothing: nothing was updated).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import torch

from stages.core import paths
from stages.core.errors import PipelineError
from stages.rl.ledger import read_step, steps_in, weight_hash
from stages.rl.rollout import Rollout
from stages.rl.types import Batch, LogProbs, Models, RewardStats, RunSpec, Targets


def _dense(lists: list[list[float] | None], N: int, T: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(N, T, dtype=dtype)
    for n, x in enumerate(lists):
        if x is not None and len(x):
            out[n, : len(x)] = torch.tensor(x, dtype=dtype)
    return out


def rebuild(table: Any, meta: dict[str, Any]) -> tuple[Batch, Targets, LogProbs]:
    """The step's :class:`Batch`, :class:`Targets` and :class:`LogProbs` as the update saw them, from its ledger file."""
    cols = table.to_pydict()
    N, P, T, G = table.num_rows, int(meta["prompt_len"]), int(meta["completion_len"]), int(meta["group_size"])
    pad = int(meta["pad_id"])
    ids = torch.full((N, P + T), pad, dtype=torch.long)
    att = torch.zeros(N, P + T, dtype=torch.long)
    cmask = torch.zeros(N, T)
    for n, (p_ids, c_ids) in enumerate(zip(cols["prompt_ids"], cols["completion_ids"], strict=True)):
        ids[n, P - len(p_ids) : P] = torch.tensor(p_ids, dtype=torch.long)
        att[n, P - len(p_ids) : P] = 1
        if c_ids:
            ids[n, P : P + len(c_ids)] = torch.tensor(c_ids, dtype=torch.long)
            att[n, P : P + len(c_ids)] = 1
            cmask[n, : len(c_ids)] = 1
    mask_dtype = getattr(torch, meta["loss_mask_dtype"])
    loss_mask = _dense(cols["loss_mask"], N, T, mask_dtype)
    sampler = _dense(cols["sampler_logprobs"], N, T, torch.float32)
    rows = [
        {"id": i, "question": q, "answer": a}
        for i, q, a in zip(cols["row_id"], cols["question_text"], cols["answer"], strict=True)
    ]
    ro = Rollout(
        rows=rows,
        texts=cols["text"],
        finish_reasons=cols["finish_reason"],
        input_ids=ids,
        attention_mask=att,
        completion_mask=cmask,
        loss_mask=loss_mask.clone(),
        sampler_logprobs=sampler,
        prompt_len=P,
        group_size=G,
        modes=cols["mode"],
    )
    w_dtype = getattr(torch, meta["weights_dtype"] or "float32")
    if any(x is not None for x in cols["advantage_tokens"]):
        weights = _dense(cols["advantage_tokens"], N, T, w_dtype)
    else:
        weights = torch.tensor(cols["advantage"], dtype=w_dtype)
    rewards = torch.tensor([math.nan if r is None else r for r in cols["reward"]], dtype=torch.float64)
    tg = Targets(loss_mask, weights, RewardStats(0, 0, 0, 0, 0, 0, 0, 0), rewards)
    lp = LogProbs(
        _dense(cols["old_logprobs"], N, T, torch.float32) if meta["has_old"] else None,
        _dense(cols["ref_logprobs"], N, T, torch.float32) if meta["has_ref"] else None,
        None,
    )
    step = int(cols["step"][0])
    qs = sorted({q for q in cols["question"] if q >= 0}, key=cols["question"].index)
    return Batch(step, qs, ro), tg, lp


def _params(meta: dict[str, Any]) -> Any:
    from stages.schema.grpo import GrpoParams

    return GrpoParams.model_validate(meta["params"])


def checkpoint_dir(p: Any, meta: dict[str, Any]) -> Path:
    """The stage's resumable-checkpoint directory of the ledger's run (stages/grpo.py's run hash)."""
    from stages.rl.checkpoint import run_dir
    from stages.rl.needs import run_needs

    inputs = [meta["init"], p.prompts_file or paths.RL_PROMPTS] + (
        [paths.REWARD_MODEL] if run_needs(p).reward_model else []
    )
    return run_dir(paths.CHECKPOINTS / "grpo", p.tracked_dump(), inputs)


def _checkpoint_at_or_before(rdir: Path | None, step: int) -> tuple[int, Path] | None:
    from stages.train import checkpoint as ck

    if rdir is None or not Path(rdir).is_dir():
        return None
    found = []
    for d in Path(rdir).iterdir():
        if d.name.startswith("step-") and d.name[5:].isdigit() and (d / "manifest.json").is_file():
            found.append((int(d.name[5:]), d))
    found = [(s, d) for s, d in found if s <= step]
    if not found:
        return None
    s, d = max(found)
    ck.verify_manifest(d)
    return s, d


class Replayer:
    """The policy, its update path and the run to call :func:`stages.rl.loop.update` with on ledger steps."""

    def __init__(self, ledger_dir: Path, meta: dict[str, Any], checkpoints: Path | None, target: int) -> None:
        from stages.core.dist import train_device
        from stages.core.modeling import enable_checkpointing, load_model, load_tokenizer
        from stages.rl.algorithms import get_algorithm
        from stages.rl.checkpoint import load_updaters
        from stages.rl.rewards import RewardSet
        from stages.rl.update import rl_updater
        from stages.train.update import use_bf16, use_deepspeed

        p = _params(meta)
        algo = get_algorithm(p.algorithm)
        if algo.spec.critic:
            raise PipelineError(
                f"replay: algorithm {p.algorithm} also trains a value model, which the ledger does not "
                "hold; replay covers the algorithms without one (grpo, online_rft, rft)"
            )
        if int(meta.get("world_size", 1)) > 1:
            raise PipelineError(
                "replay: the ledger's run had several ranks (each file is one rank's share); replay "
                "it under the same launch"
            )
        if p.compute.num_threads:
            torch.set_num_threads(p.compute.num_threads)
        self.p, self.dir, self.init = p, ledger_dir, meta["init"]
        dev = train_device()
        bf16 = use_deepspeed(p.deepspeed.enabled) and use_bf16(p.compute.precision, dev)
        model = load_model(
            self.init,
            dtype=torch.bfloat16 if bf16 else torch.float32,
            device=dev,
            attn_implementation=p.compute.attn_implementation,
        )
        enable_checkpointing(model, p.compute.gradient_checkpointing)
        upd = rl_updater(model, p)
        ck = _checkpoint_at_or_before(checkpoints, target)
        self.start, self.source = 0, f"the start model {self.init} (step 0, fresh optimizer)"
        if ck is not None:
            state = torch.load(ck[1] / "state.pt", map_location="cpu", weights_only=False)
            state["path"] = str(ck[1])
            load_updaters(state, {"policy": upd})
            self.start, self.source = ck[0], f"checkpoint {ck[1]}"
        model.eval()
        self.run_spec = RunSpec(p, [], algo, p.steps * p.iterative.iterations)
        self.models = Models(model, load_tokenizer(self.init), upd, None, RewardSet([]))

    def run(self, step: int) -> dict[str, Any]:
        """Replay one step (the weights must be those before it): its update's metrics and the comparison."""
        from stages.rl.loop import update

        table, meta = read_step(self.dir, step)
        cols = table.select(["weight_hash", "loss", "grad_norm", "iteration"]).slice(0, 1).to_pylist()[0]
        h = weight_hash(self.models.policy)
        if h != cols["weight_hash"]:
            raise PipelineError(
                f"replay: the weights before step {step} are not the run's (hash {h} vs the ledger's "
                f"{cols['weight_hash']}); replayed from {self.source}"
            )
        batch, tg, lp = rebuild(table, meta)
        m = update(self.run_spec, self.models, batch, tg, lp)
        return {
            "step": step,
            "loss_logged": cols["loss"],
            "loss_replayed": m["loss"],
            "grad_norm_logged": cols["grad_norm"],
            "grad_norm_replayed": m["grad_norm"],
            "weight_hash": h,
        }


def _close(a: float, b: float, tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tol * max(1.0, abs(a))


def replay(
    step: int, ledger_dir: str | Path = paths.GRPO_LEDGER, checkpoints: str | Path | None = "auto", tol: float = 1e-6
) -> dict[str, Any]:
    """Replay step ``step`` (module docstring): the weights from the latest checkpoint at or before it (``auto``: the
    stage's run directory; None: the start model), rolled forward through the ledger. Returns the step's row:
    logged and replayed loss / gradient norm, their differences, ``match``, ``rolled`` (steps rolled forward) and
    ``source``."""
    ledger_dir = Path(ledger_dir)
    have = steps_in(ledger_dir)
    if step not in have:
        raise PipelineError(
            f"replay: {ledger_dir} has no file for step {step} (steps {have[:1]}..{have[-1:]}); "
            "check --ledger and --step"
        )
    _, meta = read_step(ledger_dir, step)
    ck = (
        checkpoint_dir(_params(meta), meta)
        if checkpoints == "auto"
        else (Path(checkpoints) if checkpoints is not None else None)
    )
    r = Replayer(ledger_dir, meta, ck, step)
    rolled = 0
    for k in range(r.start, step):
        if k not in have:  # a step without a rollout (rft kept nothing) changed nothing
            continue
        r.run(k)
        rolled += 1
    row = r.run(step)
    row["loss_diff"] = abs(row["loss_logged"] - row["loss_replayed"])
    row["grad_norm_diff"] = abs(row["grad_norm_logged"] - row["grad_norm_replayed"])
    row["match"] = _close(row["loss_logged"], row["loss_replayed"], tol) and _close(
        row["grad_norm_logged"], row["grad_norm_replayed"], tol
    )
    row.update(rolled=rolled, source=r.source, tol=tol)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.rl.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", type=int, nargs="+", required=True, help="the step(s) to replay")
    ap.add_argument("--ledger", default=str(paths.GRPO_LEDGER), help="the ledger directory (default: %(default)s)")
    ap.add_argument(
        "--checkpoints",
        default="auto",
        help="a run directory of resumable checkpoints, 'auto' (the stage's, when it is still there) or "
        "'none' (roll forward from the start model)",
    )
    ap.add_argument("--tol", type=float, default=1e-6, help="relative tolerance, absolute floor (default %(default)s)")
    a = ap.parse_args(argv)
    ck = None if a.checkpoints == "none" else a.checkpoints
    ok = True
    try:
        for s in a.step:
            row = replay(s, a.ledger, ck, a.tol)
            ok &= row["match"]
            print(
                f"step {s}: loss logged {row['loss_logged']:.9g} replayed {row['loss_replayed']:.9g} "
                f"(|d| {row['loss_diff']:.2e}); grad norm logged {row['grad_norm_logged']:.9g} replayed "
                f"{row['grad_norm_replayed']:.9g} (|d| {row['grad_norm_diff']:.2e}); "
                f"{'match' if row['match'] else 'MISMATCH'} at tol {a.tol:g}; from {row['source']}, "
                f"{row['rolled']} step(s) rolled forward"
            )
    except (PipelineError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The rollout ledger and its replay (issue 31 item 5; stages/rl/ledger.py, stages/rl/replay.py): the grpo stage writes
one Parquet file per step as a DVC output, and ``python -m stages.rl.replay --step N`` recomputes a step's loss and
gradient norm from it and the saved checkpoint (or the start model, rolled forward) equal to the logged ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from stages import grpo
from stages.core import answers, paths
from stages.core.errors import PipelineError
from stages.rl.ledger import LedgerWriter, read_step, weight_hash
from stages.rl.loop import begin_iteration, close, setup, train
from stages.rl.replay import main, replay
from stages.schema.grpo import GrpoParams

from .test_grpo_stage import _load, tiny_params

torch.set_num_threads(1)


def default_params(**changes) -> GrpoParams:
    """The committed params.yaml's grpo section (the tiny default's settings: 16 questions x G = 8, 64 tokens, beta
    0.04, ...) on the test project, with ``changes``; plus the tests' length reward, since the random test model never
    answers right (all-equal rewards would train nothing)."""
    root = Path(__file__).resolve().parents[2]
    p = GrpoParams.from_file(root / "params.yaml")
    return p.updated({"heldout.every": 0, "compute.num_threads": 1, "reward.custom": [
        "tests.rl.custom_rewards:length_reward"], "reward.custom_weights": [1.0], **changes})


def test_the_stage_writes_the_ledger_and_replay_matches_3_steps_of_a_default_run(project, capsys):
    p = default_params(steps=3, **{"baseline.enabled": False})
    m = grpo.run(p)
    files = sorted(f.name for f in paths.GRPO_LEDGER.iterdir())
    assert files == ["_README.md", "step-000000.parquet", "step-000001.parquet", "step-000002.parquet"]
    info = m["ledger"]
    assert info["ledger_files"] == 3 and info["ledger_bytes_per_step"] == round(info["ledger_bytes"] / 3)
    table, meta = read_step(paths.GRPO_LEDGER, 1)
    assert table.num_rows == p.questions_per_step * p.rollout.group_size
    cols = set(table.column_names)
    assert {
        "prompt_ids",
        "completion_ids",
        "sampler_logprobs",
        "reward",
        "reward_parts",
        "advantage",
        "ref_logprobs",
        "weight_hash",
        "loss",
        "grad_norm",
        "checker",
        "checker_version",
        "question_text",
        "mode",
    } <= cols
    assert meta["params"]["steps"] == 3 and meta["init"] == str(paths.SFT_MODEL)
    assert json.loads(paths.details_file("grpo").read_text())["ledger"] == info
    rows = []
    for step in (0, 1, 2):  # the checkpoints are gone (the stage removes them): the start model, rolled forward
        r = replay(step, checkpoints="auto")
        assert r["rolled"] == step and "start model" in r["source"]
        assert math.isfinite(r["loss_logged"]) and r["grad_norm_logged"] > 0  # the step trained
        assert r["match"], r
        assert r["loss_diff"] <= 1e-6 * max(1.0, abs(r["loss_logged"]))
        assert r["grad_norm_diff"] <= 1e-6 * max(1.0, abs(r["grad_norm_logged"]))
        rows.append(r)
    print([(r["loss_diff"], r["grad_norm_diff"]) for r in rows])  # measured: 0.0 and 0.0 (bit for bit) on CPU
    assert main(["--step", "2", "--checkpoints", "none"]) == 0
    assert "step 2: loss logged" in capsys.readouterr().out


def _run_with_checkpoints(tmp: Path, steps: int = 3) -> tuple[GrpoParams, Path, Path]:
    p = tiny_params(steps=steps, checkpoint_every=1)
    model, tok, rows = _load()
    ckpt, led = tmp / "ckpt", tmp / "ledger"
    run, models, state = setup(p, model, tok, rows=rows, ledger=LedgerWriter(led, p, paths.SFT_MODEL))
    try:
        begin_iteration(run, models, state, 1, ckpt)
        train(run, models, state, 0, steps)
    finally:
        close(run, models, state)
    return p, ckpt, led


def test_replay_from_the_saved_checkpoint(project, tmp_path):
    _, ckpt, led = _run_with_checkpoints(tmp_path)
    assert sorted(d.name for d in ckpt.iterdir() if d.name.startswith("step-")) == ["step-00000001", "step-00000002"]
    r = replay(2, led, ckpt)
    assert r["match"] and r["rolled"] == 0 and "step-00000002" in r["source"]
    r = replay(1, led, ckpt)  # step-1 holds the weights before step 1
    assert r["match"] and r["rolled"] == 0
    r = replay(0, led, ckpt)  # no checkpoint at or before step 0: the start model
    assert r["match"] and "start model" in r["source"]


def test_a_changed_ledger_or_other_weights_are_caught(project, tmp_path):
    _, ckpt, led = _run_with_checkpoints(tmp_path, steps=2)
    f = led / "step-000001.parquet"
    table = pq.read_table(f)
    adv = table.column("advantage").to_pylist()
    i = next(k for k, a in enumerate(adv) if a)
    adv[i] = adv[i] * 3  # one output's advantage changed: its gradient changes
    pq.write_table(
        table.set_column(table.column_names.index("advantage"), "advantage", pa.array(adv, pa.float32())), f
    )
    r = replay(1, led, ckpt)
    assert not r["match"] and r["grad_norm_diff"] > 1e-4
    assert main(["--step", "1", "--ledger", str(led), "--checkpoints", str(ckpt)]) == 1
    # the weights before a step must be the run's (the ledger's hash): other weights are refused
    model, _, _ = _load()
    h = weight_hash(model)
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert weight_hash(model) != h
    table0 = pq.read_table(led / "step-000000.parquet")
    wh = table0.column("weight_hash").to_pylist()
    pq.write_table(
        table0.set_column(
            table0.column_names.index("weight_hash"), "weight_hash", pa.array(["0" * 32] * len(wh), pa.string())
        ),
        led / "step-000000.parquet",
    )
    with pytest.raises(PipelineError, match=r"the weights before step 0 are not the run's"):
        replay(0, led, None)


def test_ledger_values_are_the_steps(project, tmp_path):
    """The ledger's ids, masks and log-probs are the rollout's, and the per-step loss / gradient norm the logged row."""
    p = tiny_params(steps=2, checkpoint_every=0)
    model, tok, rows = _load()
    seen = []
    run, models, state = setup(p, model, tok, rows=rows, ledger=LedgerWriter(tmp_path / "led", p, paths.SFT_MODEL),
                               on_step=seen.append)
    try:
        begin_iteration(run, models, state, 1, None)
        train(run, models, state, 0, 2)
    finally:
        close(run, models, state)
    for r in seen:
        table, meta = read_step(tmp_path / "led", r["step"])
        c = table.to_pydict()
        assert c["loss"][0] == r["loss"] and c["grad_norm"][0] == r["grad_norm"]
        assert all(
            len(a) == len(b) == len(x)
            for a, b, x in zip(c["completion_ids"], c["sampler_logprobs"], c["loss_mask"], strict=True)
        )
        assert all(math.isfinite(x) for lps in c["sampler_logprobs"] for x in lps)
        assert meta["prompt_len"] == max(len(x) for x in c["prompt_ids"])
        assert c["checker"][0] == p.reward.checker and c["checker_version"][0] == answers.CHECKER_VERSION
        assert c["weight_hash"][0] == c["weight_hash"][-1] and len(c["weight_hash"][0]) == 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_weight_checksums_are_exact_and_see_every_byte(dtype):
    import struct

    from stages.rl.ledger import _checksums

    g = torch.Generator().manual_seed(0)
    t = (torch.randn(1000, generator=g) * 50).to(dtype)
    raw = t.numpy().tobytes() if dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
    words = [b for b in raw] if t.element_size() == 1 else list(struct.unpack(f"<{len(raw) // 2}h", raw))
    want = (sum(words), sum(u * (i % 65521 + 1) for i, u in enumerate(words)))
    assert _checksums(t) == want
    swapped = t.clone()
    swapped[3], swapped[4] = t[4].clone(), t[3].clone()
    if not torch.equal(t[3], t[4]):
        assert _checksums(swapped) != want

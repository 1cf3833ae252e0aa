"""The validation split of the RL prompts and the stage's model chosen on it (grpo.validation; stages/rl/validation.py),
and every step's results logged with dvclive (grpo.tracking; stages/rl/tracking.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from stages import grpo
from stages.core import paths
from stages.rl import heldout as heldout_mod
from stages.rl import validation as val
from stages.rl.data import load_prompts
from stages.rl.tracking import StepLog

from .conftest import write_prompts
from .test_grpo_stage import tiny_params

torch.set_num_threads(1)


def _write_test_sets(project, questions: list[str]) -> None:
    """data/testsets/generated.jsonl holding ``questions`` (with whitespace / case changed) plus one more."""
    paths.TESTSETS.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": f"t{i}", "question": "  " + q.upper().replace(" ", "  ") + " ", "answer": "1"}
        for i, q in enumerate(questions)
    ]
    rows.append({"id": "other", "question": "What is 100 + 1?", "answer": "101"})
    (paths.TESTSETS / "generated.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_split_never_draws_a_test_question_and_is_disjoint(project) -> None:
    write_prompts(paths.RL_PROMPTS, 12)
    rows = load_prompts(paths.RL_PROMPTS)
    in_tests = [rows[i]["question"] for i in (0, 3, 5, 7, 9, 11)]
    _write_test_sets(project, in_tests)
    p = tiny_params(validation=dict(size=5))
    for seed in range(6):
        train, v, excluded = val.split(rows, 5, seed, val.test_questions(p.heldout.problems_file))
        assert excluded == 6 and len(v) == 5 and len(train) == 7
        assert not {r["question"] for r in v} & set(in_tests)  # never a test question
        assert not {r["id"] for r in v} & {r["id"] for r in train}  # disjoint
        assert sorted(r["id"] for r in v + train) == sorted(r["id"] for r in rows)
    # the same seed draws the same split; another seed another one (6 non-test rows: 6 possible splits of 5)
    a = val.split(rows, 5, 0, set())[1]
    assert a == val.split(rows, 5, 0, set())[1] and a != val.split(rows, 5, 1, set())[1]
    # more than the non-test rows: all of them, and the stage refuses a split that leaves nothing to train on
    _, v_all, _ = val.split(rows, 50, 0, val.test_questions(None))
    assert len(v_all) == 6
    with pytest.raises(Exception, match="grpo.validation.size"):
        val.prepare(tiny_params(validation=dict(size=6)), [r for r in rows if r["question"] not in in_tests], None)


def test_grpo_with_validation_trains_on_the_rest_and_logs_the_curve(project) -> None:
    """4 of 8 prompts validate (every 2 steps, before the first and after the last): the policy never samples them, the
    curve comes from the evaluation stage's code (HeldoutEval), and every step's results go to dvclive's files."""
    write_prompts(paths.RL_PROMPTS, 8)
    seen: list[str] = []
    real = heldout_mod.HeldoutEval.evaluate

    def spy(self, done, generator):
        seen.append(self.problems[0].question)
        return real(self, done, generator)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heldout_mod.HeldoutEval, "evaluate", spy)
        m = grpo.run(tiny_params(steps=3, validation=dict(size=4, every=2), baseline=dict(enabled=False)))
    v = m["validation"]
    assert v["n"] == 4 and v["select"] == "last" and v["selected_step"] == 3
    assert sorted(v["accuracy_at_step"]) == ["0", "2", "3"] and len(seen) == 3
    val_q = set(json.loads((paths.GRPO_MODEL / "pipeline.json").read_text())["validation"]["accuracy_at_step"])
    assert val_q == {"0", "2", "3"}
    trained = {json.loads(line)["question"] for line in (paths.GRPO_MODEL / "samples.jsonl").read_text().splitlines()}
    rows = load_prompts(paths.RL_PROMPTS)
    train, vrows, _ = val.split(rows, 4, 0, set())
    assert trained and trained <= {r["question"] for r in train} and not trained & {r["question"] for r in vrows}
    # dvclive: the latest step's results and one curve row per step, no timings
    live = paths.DVCLIVE / "grpo"
    summary = json.loads((live / "metrics.json").read_text())
    assert summary["step"] == 3 and set(summary) == {"step", "grpo"}  # grpo.<metric> in dvc exp show
    assert "reward_mean" in summary["grpo"] and "validation_accuracy" in summary["grpo"]
    assert not any(k.startswith(("t_", "cpu_")) or k.endswith("_s") for k in summary["grpo"])
    curves = live / "plots" / "metrics" / "grpo"
    curve = (curves / "reward_mean.tsv").read_text().splitlines()
    assert curve[0].split("\t") == ["step", "reward_mean"] and [c.split("\t")[0] for c in curve[1:]] == ["1", "2", "3"]
    vcurve = (curves / "validation_accuracy.tsv").read_text().splitlines()
    assert [c.split("\t")[0] for c in vcurve[1:]] == ["2", "3"]
    assert not (curves / "t_generation.tsv").exists()


def test_select_best_saves_the_best_validated_checkpoint_lora(project, monkeypatch) -> None:
    """Scripted validation accuracies 0.2, 0.6, 0.4, 0.5 (before step 1, after steps 1, 2, 3): select best saves the
    policy after step 1 (equal to a 1-step run's), merged, with the adapter of that step; select last after step 3."""
    from peft import PeftModel

    from stages.core.modeling import load_model

    write_prompts(paths.RL_PROMPTS, 8)
    accs = iter([0.2, 0.6, 0.4, 0.5])
    monkeypatch.setattr(heldout_mod.HeldoutEval, "score", lambda self, gen: {"acc": next(accs)})
    lora = dict(enabled=True, rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    kw = dict(lora=lora, baseline=dict(enabled=False), validation=dict(size=2, every=1, keep_top_k=2))
    m = grpo.run(tiny_params(steps=3, **{**kw, "validation": {**kw["validation"], "select": "best"}}))
    assert m["validation"]["selected_step"] == 1 and m["validation"]["selected_accuracy"] == 0.6
    best = load_file(str(paths.GRPO_MODEL / "model.safetensors"))
    adapter_best = PeftModel.from_pretrained(load_model(paths.SFT_MODEL), str(paths.GRPO_MODEL / "adapter"))
    merged = adapter_best.merge_and_unload().state_dict()
    assert max(float((merged[k] - v).abs().max()) for k, v in best.items() if k in merged) < 1e-6
    accs2 = iter([0.2, 0.6])
    monkeypatch.setattr(heldout_mod.HeldoutEval, "score", lambda self, gen: {"acc": next(accs2)})
    m1 = grpo.run(tiny_params(steps=1, **kw))  # the same first step (question order and seeds follow the step)
    assert m1["validation"]["selected_step"] == 1
    one = load_file(str(paths.GRPO_MODEL / "model.safetensors"))
    assert all(torch.allclose(one[k], best[k], atol=1e-6) for k in one)
    accs3 = iter([0.2, 0.6, 0.4, 0.5])
    monkeypatch.setattr(heldout_mod.HeldoutEval, "score", lambda self, gen: {"acc": next(accs3)})
    m3 = grpo.run(tiny_params(steps=3, **kw))
    last = load_file(str(paths.GRPO_MODEL / "model.safetensors"))
    assert m3["validation"]["selected_step"] == 3 and m3["validation"]["best_accuracy"] == 0.6
    assert any(not torch.equal(last[k], best[k]) for k in best)


def test_keep_top_k_keeps_the_k_best_on_disk(project, tmp_path) -> None:
    from stages.core.modeling import load_model

    write_prompts(paths.RL_PROMPTS, 8)
    rows = load_prompts(paths.RL_PROMPTS)[:3]
    v = val.Validation(rows, tiny_params(validation=dict(size=3, select="best", keep_top_k=2)), "deepseekmath")
    v.dir = tmp_path / "best"
    model = load_model(paths.SFT_MODEL)
    for step, acc in enumerate([0.3, 0.5, 0.1, 0.5, 0.7]):
        v.eval.score = lambda gen, a=acc: {"acc": a}  # type: ignore[method-assign]
        with torch.no_grad():
            next(model.parameters()).add_(1.0)  # a different policy per step
        v.evaluate(step, None, model, 1)
    assert [(a, s) for a, s, _ in v.snapshots] == [(0.7, 4), (0.5, 1)]  # ties: the earlier step
    assert sorted(f.name for f in v.dir.iterdir()) == ["step-1.pt", "step-4.pt"]
    step, best = v.selected(5)
    assert step == 4 and best["accuracy"] == 0.7
    assert torch.equal(best["weights"][next(iter(best["weights"]))], next(iter(model.state_dict().values())))


def test_step_log_replays_a_resumed_runs_rows(tmp_path) -> None:
    """A resumed run's logger (rows 0-1 restored from the checkpoint, then row 2 logged) writes the bytes of an
    uninterrupted run's; a rerun writes the same bytes (no timestamps); timings are left out."""
    rows = [
        {
            "step": i,
            "reward_mean": 0.1 * i,
            "kl": 0.01 * i,
            "t_update": 1.5 + i,
            "step_s": 3.0,
            "ok": True,
            "iteration": 1,
        }
        for i in range(3)
    ]

    def files(d):
        return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}

    one = StepLog(tmp_path / "one")
    for i, r in enumerate(rows):
        one.log(r, rows[: i + 1])
    one.close(rows)
    resumed = StepLog(tmp_path / "two")
    resumed.log(rows[2], rows)
    resumed.close(rows)
    at_end = StepLog(tmp_path / "three", live=False)
    at_end.close(rows)
    a, b, c = files(tmp_path / "one"), files(tmp_path / "two"), files(tmp_path / "three")
    assert a == b == c and "metrics.json" in a
    assert sorted(a) == ["metrics.json", "plots/metrics/grpo/kl.tsv", "plots/metrics/grpo/reward_mean.tsv"]
    assert json.loads(a["metrics.json"]) == {"grpo": {"reward_mean": 0.2, "kl": 0.02}, "step": 3}

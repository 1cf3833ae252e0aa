"""End-to-end GRPO on a tiny random model: parameters change, metrics/plots/models are written,
non-finite steps are skipped, resume continues from the checkpoint, and the ratio is 1 on-policy."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from stages import grpo
from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.io import untimed
from stages.params import GrpoParams
from stages.rl.loop import fit

torch.set_num_threads(1)


def tiny_params(**over: Any) -> GrpoParams:
    """A small valid grpo section (the RL tests' tiny model and prompts) with ``over`` applied: keys are fields of the
    section, or ``group__field`` for a field of a group (``optim__lr=1e-2``); a mapping value is merged into the group
    it names (:meth:`stages.schema.base.Section.updated`)."""
    raw = dict(
        algorithm="grpo", start="sft", template="deepseekmath", seed=0, prompts_file="data/corpus/problems/rl.jsonl",
        steps=2, questions_per_step=3, log_completions_every=1, checkpoint_every=1,
        rollout=dict(group_size=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12, backend="hf",
                     vllm=dict(gpu_memory_utilization=0.1, tensor_parallel_size=1, enable_sleep_mode=False),
                     mode="cot", mixture=dict(cot=0.5, pot=0.0, tir=0.5), tir_max_rounds=2, exec_timeout_s=10.0,
                     chunks=2, exec_workers=2),
        reward=dict(source="rule", accuracy_weight=1.0, format_weight=0.0,
                    custom=["tests.rl.custom_rewards:length_reward"], custom_weights=[1.0], checker="strict",
                    rm_guards=dict(normalize=False, clip=None, rule_weight=0.0, length_penalty=0.0,
                                   length_target=None),
                    overlong=dict(factor=0.0, buffer_len=4)),
        advantage=dict(estimator="grpo", scale_rewards="group", eps=1e-4, skip_zero_std_groups=True),
        loss=dict(policy="clipped", clip_eps=0.2, clip_eps_high=None, aggregation="seq-mean-token-mean",
                  mask_truncated=False, mask_written_outputs=True, cispo=dict(max_ratio=5.0, min_ratio=None),
                  entropy_coef=0.0),
        kl=dict(beta=0.04),
        optim=dict(lr=1e-3, weight_decay=0.0, max_grad_norm=1.0, mu=1, minibatches=1, micro_batch_size=5),
        lora=dict(enabled=False, rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]),
        ppo=dict(value_init="policy", value_lr=1e-3, gamma=1.0, lam=0.95, value_clip=0.2, whiten=True),
        iterative=dict(iterations=1, rm=dict(replay_fraction=0.1, questions=4, samples_per_question=2,
                                             labels="values", rollouts_per_step=2, train_on="process",
                                             heldout_fraction=0.25, epochs=1, lr=1e-3, batch_size=4)),
        baseline=dict(enabled=True, lr=1e-3),
        heldout=dict(every=0, problems_file="data/generated/problems/test.jsonl", limit=4, max_new_tokens=12),
        validation=dict(size=0, every=1, max_new_tokens=12, select="last", metric="accuracy", keep_top_k=1),
        tracking=dict(live=True),
        dynamic_sampling=dict(enabled=False, metric="accuracy", max_rounds=3, max_per_round=None, oversample=1.0),
        curriculum=dict(enabled=False, low=0.0, high=1.0, hard_weight=0.1, easy_weight=0.1, normal_weight=1.0,
                        unseen_weight=1.0, ema=1.0),
        correction=dict(method="none", low=None, high=2.0),
        sync=dict(probe_tokens=4, tolerance=dict(hf_fp32=0.0, hf_bf16=0.05, vllm_fp32=1e-3, vllm_bf16=0.1)),
        ledger=dict(enabled=True),
        compute=dict(num_threads=1, precision="fp32", attn_implementation="sdpa", share_prompt_prefix=True,
                     offload_idle_models=True, gradient_checkpointing=False, logprob_chunk_tokens=256),
        deepspeed=dict(enabled=False, zero_stage=2, offload_optimizer=False),
        launcher=dict(nproc_per_node=1, nnodes=1, kind="none", rdzv_endpoint=None, hostfile=None, retries=0,
                      retry_delay_s=0.0),
    )
    for key, value in over.items():
        *groups, leaf = key.split("__")
        node = raw
        for g in groups:
            node = node[g]
        node[leaf] = {**node[leaf], **value} if isinstance(value, dict) and isinstance(node.get(leaf), dict) else value
    return GrpoParams.model_validate(raw)


def rl_train(model: Any, tok: Any, rows: list[dict[str, Any]], p: GrpoParams, **kw: Any
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """RL on ``model`` in place through the loop (stages.rl.loop.fit: setup, one iteration of train, close; ``kw``:
    ckpt_dir and setup's options); returns (metric rows, completion rows, info)."""
    _, _, state = fit(p, model, tok, rows=rows, **kw)
    return state.history, state.samples, state.info


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def test_tiny_grpo_run_end_to_end(project):
    m = grpo.run(tiny_params())
    before, after, base = _weights(paths.SFT_MODEL), _weights(paths.GRPO_MODEL), _weights(paths.SFT_CONTINUED)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # GRPO changed the policy
    assert any(not torch.equal(before[k], base[k]) for k in before)  # the baseline trained too
    saved = json.loads(paths.details_file("grpo").read_text())
    assert saved["grpo"]["steps"] == 2 and saved == untimed(json.loads(json.dumps(m)))  # timings: data/timings
    assert json.loads(paths.timings_file("grpo").read_text())["wall_s"] == m["wall_s"] > 0
    assert saved["grpo"]["skipped_nonfinite"] == 0
    plots = paths.plots_dir("grpo")
    for name in ("reward_mean", "kl", "entropy", "grad_norm", "t_generation", "mismatch_abs_mean"):
        where = paths.TIMINGS / "grpo" if name.startswith("t_") else plots  # per-step timings: no DVC output
        lines = (where / f"{name}.csv").read_text().splitlines()
        assert lines[0] == f"step,{name}" and len(lines) == 3
    assert not (plots / "t_generation.csv").exists()
    assert (plots / "baseline_sft_loss.csv").is_file()
    samples = (paths.GRPO_MODEL / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 3 and "completion" in json.loads(samples[0])


def test_on_policy_ratio_is_one_and_kl_zero_at_start(project):
    """mu = 1, one minibatch: old log-probs are the update's own forward, so ratio == 1 exactly;
    at step 0 the policy equals the reference, so the k3 KL is exactly 0."""
    rows = []
    rl_train(*_load(), tiny_params(steps=1), ckpt_dir=None, on_step=rows.append)
    assert rows[0]["ratio_mean"] == 1.0 and rows[0]["kl"] == 0.0
    assert rows[0]["clip_frac_low"] == 0.0 and rows[0]["clip_frac_high"] == 0.0
    # mu = 2: the second pass is off-policy (ratio != 1) and the old log-probs come from a separate pass
    rows2 = []
    rl_train(*_load(), tiny_params(steps=1, optim__mu=2, optim__minibatches=2), ckpt_dir=None, on_step=rows2.append)
    assert rows2[0]["optimizer_steps"] == 4 and rows2[0]["ratio_mean"] != 1.0


def _load():
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.data import load_prompts

    return load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)


def test_nonfinite_step_is_skipped_and_counted(project, monkeypatch):
    from stages.rl.losses import POLICY_LOSSES

    real = POLICY_LOSSES.impls["clipped"]

    def nan_loss(*a, **k):
        loss, m = real(*a, **k)
        return loss * math.nan, m

    monkeypatch.setitem(POLICY_LOSSES.impls, "clipped", nan_loss)
    model, tok, rows = _load()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hist, _, _ = rl_train(model, tok, rows, tiny_params(steps=1), ckpt_dir=None)
    assert hist[0]["skipped_nonfinite"] == 1 and hist[0]["optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_resume_continues_from_checkpoint(project):
    p = tiny_params(steps=3, checkpoint_every=1)
    ckpt = Path("checkpoints/grpo/run")

    def crash_at_1(row):
        if row["step"] == 1:
            raise KeyboardInterrupt

    model, tok, rows = _load()
    with pytest.raises(KeyboardInterrupt):
        rl_train(model, tok, rows, p, ckpt_dir=ckpt, on_step=crash_at_1)
    assert [d.name for d in ckpt.iterdir()] == ["step-00000001"]  # saved after step 0; step 1 crashed before its save
    model, tok, rows = _load()
    hist, _, info = rl_train(model, tok, rows, p, ckpt_dir=ckpt)
    assert info["resumed_from_step"] == 1 and [r["step"] for r in hist] == [0, 1, 2]
    assert sorted(d.name for d in ckpt.iterdir()) == ["step-00000001", "step-00000002"]
    (ckpt / "step-00000002" / "state.pt").write_bytes(b"garbage")
    with pytest.raises(PipelineError, match="corrupt checkpoint"):
        rl_train(*_load(), p, ckpt_dir=ckpt)


def test_run_removes_its_checkpoints_when_done(project):
    grpo.run(tiny_params(steps=2, checkpoint_every=1, baseline=dict(enabled=False, lr=1e-3)))
    assert not any(Path("checkpoints/grpo").iterdir())
    assert json.loads((paths.SFT_CONTINUED / "pipeline.json").read_text())["baseline"].startswith("disabled")


@pytest.mark.slow
def test_completions_table_artifact_inside_a_flow(project, prefect_api):
    """Inside a flow run the stage publishes the sampled completions as a Prefect table artifact."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    @flow(name="grpo-artifact-test")
    def f() -> None:
        grpo.run(tiny_params(steps=1, baseline=dict(enabled=False, lr=1e-3)))

    f()

    import asyncio

    async def fetch():
        async with get_client() as c:
            return await c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["grpo-completions"])))

    arts = asyncio.run(fetch())
    assert arts and "completion" in str(arts[0].data)

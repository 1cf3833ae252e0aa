"""LoRA for the RL policy (grpo.lora, stages/rl/lora.py): GRPO steps train the adapter alone, with and without
DeepSpeed (ZeRO-2 on the CPU accelerator equals the plain update); the merged weights are W + (alpha / r) B A computed
here from the adapter's tensors; the sampler (hf here; vllm in tests/core/test_generation_vllm.py's environment) holds
exactly them after every sync; the reference model is the frozen base (the KL against it equals the KL against a
separate copy of the start model); the stage saves the merged plain model and the adapter, both loadable (the adapter
through peft's own ``PeftModel.from_pretrained``); iterative RL folds the adapter so that pi_ref is the policy again."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from stages import grpo
from stages.core import paths
from stages.core.errors import PipelineError
from stages.core.modeling import frozen_copy, load_model, load_tokenizer
from stages.rl import lora
from stages.rl.data import load_prompts
from stages.rl.loop import fit
from stages.rl.rollout import token_logprobs

from .test_grpo_deepspeed import ds_env  # noqa: F401 - the fixture
from .test_grpo_stage import tiny_params

torch.set_num_threads(1)

LORA = dict(enabled=True, rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])


def _load():
    return load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)


def _explicit_merge(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """W + (alpha / r) B A of every adapted map, from the adapter's own tensors (the oracle of the merge)."""
    out = {}
    scale = LORA["alpha"] / LORA["rank"]
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            a, b = mod.lora_A["default"].weight.detach(), mod.lora_B["default"].weight.detach()
            out[f"{name}.weight"] = mod.base_layer.weight.detach() + b @ a * scale
    return out


def _lora_steps(**over):
    model, tok, rows = _load()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, models, state = fit(tiny_params(lora=LORA, **over), model, tok, rows=rows, ckpt_dir=None)
    return model, before, (models, state)


def test_lora_grpo_trains_the_adapter_alone_and_the_sampler_gets_the_merged_weights(project) -> None:
    model, before, (models, state) = _lora_steps(steps=2, checkpoint_every=0)
    assert models.policy is model and lora.has_lora(model)
    hist = state.history
    assert [h["optimizer_steps"] for h in hist] == [1, 1] and hist[0]["kl"] == 0.0 and hist[1]["kl"] > 0.0
    info = state.info["lora"]
    n_adapter = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert info["adapter_parameters"] == n_adapter == state.info["trained_parameters"]["policy"] > 0
    assert info["adapted_maps"] == 2 * 3  # 2 layers x (q_proj, v_proj, up_proj)
    # the base weights are frozen: unchanged to the bit; the adapter moved
    merged = lora.merged_state_dict(model)
    assert set(merged) == set(before)  # the plain model's names, nothing of the adapter
    explicit = _explicit_merge(model)
    assert len(explicit) == 6
    for k, w in before.items():
        if k in explicit:
            assert torch.equal(model.get_parameter(k.replace(".weight", ".base_layer.weight")), w)
            assert torch.allclose(merged[k], explicit[k], rtol=0, atol=1e-7)
            assert not torch.equal(merged[k], w)  # the adapter trained (B moved off 0)
        else:
            assert torch.equal(merged[k], w)
    # the hf sampler decodes with a plain model that holds exactly the merged weights
    gen = models.generator
    assert isinstance(gen, lora.MergedSampler) and not lora.has_lora(gen.inner.model)
    sampler = gen.inner.model.state_dict()
    assert all(torch.equal(sampler[k], merged[k]) for k in merged)
    # so the sampler's log-probs are the trainer's (unmerged forward) up to float rounding
    assert max(h["mismatch_abs_max"] for h in hist) < 1e-4
    # and the checked weight sync (stages/rl/sync.py) passes bit for bit: hf fp32 against the trainer's merge
    assert state.info["sync_probe_max_abs"] == 0.0 and all(h["sync_probe_max_abs"] == 0.0 for h in hist)


def test_weight_sync_check_catches_a_skipped_lora_sync(project) -> None:
    """A LoRA sync that does not take effect (the sampler keeps the start weights) stops the run at the next check."""
    from stages.rl.sync import WeightSyncError, planted_skip

    model, tok, rows = _load()
    with planted_skip(1), pytest.raises(WeightSyncError, match="before step 1"):
        fit(tiny_params(lora=LORA, steps=2, checkpoint_every=0), model, tok, rows=rows, ckpt_dir=None)


def test_merged_weights_equal_base_plus_scaled_product(project) -> None:
    """Before any step (B = 0) the merge is the base; with B and A set at random it is W + (alpha / r) B A."""
    model, _, _ = _load()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    p = tiny_params(lora=LORA)
    lora.attach(model, p.lora, seed=0)
    assert all(torch.equal(lora.merged_state_dict(model)[k], v) for k, v in base.items())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in lora.lora_layers(model):
            layer.lora_B["default"].weight.copy_(torch.randn(layer.lora_B["default"].weight.shape, generator=g))
    merged, explicit = lora.merged_state_dict(model), _explicit_merge(model)
    for k, w in explicit.items():
        assert torch.allclose(merged[k], w, rtol=0, atol=1e-6) and not torch.allclose(w, base[k], atol=1e-3)
    # the forward of the plain copy equals the LoRA forward
    ids = torch.tensor([[1, 5, 9, 17, 33, 2]])
    plain = lora.plain_copy(model)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
        with lora.adapter_disabled(model):  # the reference: the base model
            off = model(input_ids=ids).logits
    ref = load_model(paths.SFT_MODEL).eval()
    with torch.no_grad():
        assert torch.allclose(off, ref(input_ids=ids).logits, atol=1e-6)


def test_reference_is_the_frozen_base(project) -> None:
    """After two LoRA steps, pi_ref's log-probs (the policy with its adapter disabled, no second copy) equal those of
    a separate copy of the start model, and differ from the policy's."""
    model, _, (models, _) = _lora_steps(steps=2, checkpoint_every=0)
    ref = models.reference
    assert isinstance(ref, lora.BaseReference) and not list(ref.children()) and not list(ref.buffers(recurse=False))
    start = frozen_copy(load_model(paths.SFT_MODEL))
    ids = torch.tensor([[1, 5, 9, 17, 33, 2, 7, 8], [1, 6, 9, 17, 40, 2, 7, 3]])
    att = torch.ones_like(ids)
    with torch.no_grad():
        a, _ = token_logprobs(ref, ids, att, 4, 1.0, share_prompts=True)
        b, _ = token_logprobs(start, ids, att, 4, 1.0, share_prompts=True)
        c, _ = token_logprobs(model, ids, att, 4, 1.0, share_prompts=True)
    assert torch.allclose(a, b, atol=1e-6) and not torch.allclose(a, c, atol=1e-4)
    assert all(layer._disable_adapters is False for layer in lora.lora_layers(model))  # enabled again after the pass


def test_lora_under_deepspeed_equals_plain(ds_env, project) -> None:  # noqa: F811 - the fixture
    """ZeRO-2 on the CPU accelerator (one process, gloo, fp32), AdamW over the adapter alone: the plain LoRA update's
    grad norms and merged weights after two steps."""
    plain_model, _, (_, plain) = _lora_steps(steps=2, checkpoint_every=0, optim__micro_batch_size=4)
    ds_model, _, (ds_models, ds) = _lora_steps(
        steps=2,
        checkpoint_every=0,
        optim__micro_batch_size=4,
        deepspeed=dict(enabled=True, zero_stage=2, offload_optimizer=False),
    )
    assert ds.info["deepspeed_zero_stage"] == 2 and plain.info["deepspeed_zero_stage"] is None
    assert ds_models.updater.engine.module is ds_model and lora.has_lora(ds_model)
    for a, b in zip(plain.history, ds.history, strict=True):
        assert a["optimizer_steps"] == b["optimizer_steps"] == 1
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    m1, m2 = lora.merged_state_dict(plain_model), lora.merged_state_dict(ds_model)
    assert max(float((m1[k] - m2[k]).abs().max()) for k in m1) < 1e-6
    assert any(not torch.equal(m2[k], v) for k, v in load_model(paths.SFT_MODEL).state_dict().items())
    sampler = ds_models.generator.inner.model.state_dict()
    assert all(torch.equal(sampler[k], m2[k]) for k in m2)


def test_stage_saves_merged_model_and_adapter(project) -> None:
    from peft import PeftModel

    m = grpo.run(tiny_params(lora=LORA, steps=2))
    out = paths.GRPO_MODEL
    merged = load_model(out)  # a plain HF model: what evaluate loads
    assert not lora.has_lora(merged)
    saved = load_file(str(out / "model.safetensors"))
    assert not any("lora" in k or "base_layer" in k for k in saved)
    pipeline = json.loads((out / "pipeline.json").read_text())
    assert pipeline["run"]["lora"]["rank"] == 4 and m["lora"]["adapter_parameters"] > 0
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and cfg["base_model_name_or_path"] == str(paths.SFT_MODEL)
    # peft's own loader: the start model + the saved adapter, merged, is the saved merged model
    restored = PeftModel.from_pretrained(load_model(paths.SFT_MODEL), str(out / "adapter")).merge_and_unload()
    sd = restored.state_dict()
    assert max(float((sd[k] - v).abs().max()) for k, v in merged.state_dict().items()) < 1e-6
    start = load_model(paths.SFT_MODEL).state_dict()
    assert any(not torch.equal(start[k], v) for k, v in merged.state_dict().items())
    # the continued-SFT baseline trained a LoRA adapter too, and was saved merged
    base = load_model(paths.SFT_CONTINUED)
    assert not lora.has_lora(base) and any(not torch.equal(start[k], v) for k, v in base.state_dict().items())


def test_iterative_rl_folds_the_adapter_into_the_reference(project) -> None:
    """Two iterations: the second starts with pi_ref = the policy after the first (KL exactly 0 at its first step),
    the saved iter1 policy is plain and equals the merged policy after iteration 1."""
    snaps = {}

    def keep(k, model, rm):
        snaps[k] = {key: v.clone() for key, v in lora.merged_state_dict(model).items()}

    from stages.rl.iterative import run_iterations
    from stages.rl.loop import close, setup

    model, tok, rows = _load()
    p = tiny_params(lora=LORA, steps=2, checkpoint_every=0, iterative__iterations=2)
    run, models, state = setup(p, model, tok, rows=rows)
    try:
        run_iterations(run, models, state, ckpt_dir=None, out_dir=paths.GRPO_ITERS, on_iteration=keep)
    finally:
        close(run, models, state)
    h = state.history
    assert len(h) == 4 and h[0]["kl"] == 0.0 and h[2]["kl"] == 0.0 and h[1]["kl"] > 0 and h[3]["kl"] > 0
    it1 = load_model(paths.GRPO_ITERS / "iter1").state_dict()
    assert max(float((it1[k] - v).abs().max()) for k, v in snaps[1].items()) < 1e-6


def test_bad_lora_params_are_one_line_errors(project) -> None:
    with pytest.raises(ValueError, match="PPO's value model"):
        tiny_params(lora=LORA, algorithm="ppo", advantage__estimator="gae")
    with pytest.raises(ValueError, match="lm_head"):
        tiny_params(lora={**LORA, "target_modules": ["q_proj", "lm_head"]})
    with pytest.raises(ValueError, match="at least one"):
        tiny_params(lora={**LORA, "target_modules": []})
    model, tok, rows = _load()
    with pytest.raises(PipelineError, match="grpo.lora.target_modules"):
        fit(tiny_params(lora={**LORA, "target_modules": ["no_such_proj"]}), model, tok, rows=rows, ckpt_dir=None)


_SAVE_CHILD = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from stages.rl import lora
from stages.schema.grpo_lora import GrpoLoraParams
cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
model = lora.attach(LlamaForCausalLM(cfg), GrpoLoraParams(enabled=True, target_modules=sys.argv[2].split(",")), 0)
lora.save_adapter(model, sys.argv[1], "base")
"""


def test_the_saved_adapter_config_is_the_same_bytes_under_any_hash_seed(tmp_path) -> None:
    """peft keeps ``target_modules`` in a set, which it writes in the process's string-hash order: save_adapter sorts
    them, so two runs of one LoRA config write the same ``adapter_config.json`` (DVC sees no change)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    targets = "q_proj,k_proj,v_proj,o_proj,up_proj,gate_proj,down_proj"
    got = []
    for seed in ("1", "2", "3"):
        out = tmp_path / seed
        subprocess.run([sys.executable, "-c", _SAVE_CHILD, str(out), targets], check=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONHASHSEED": seed})
        got.append((out / "adapter_config.json").read_bytes())
    assert got[0] == got[1] == got[2]
    assert json.loads(got[0])["target_modules"] == sorted(targets.split(","))

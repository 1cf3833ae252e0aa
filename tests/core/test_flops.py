"""stages.core.flops counts a watched model's passes: its matmuls as torch's own FLOP counter does
(``torch.utils.flop_counter.FlopCounterMode``, the oracle), plus causal attention; the backward twice the forward;
a decode step's attention over its KV cache; and the stage's timings record the count."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from stages.core import flops
from stages.core.logprobs import lm_logprobs


@pytest.fixture()
def model(tmp_path):
    """A tiny random Llama as the stages load one (stages.core.modeling.load_model watches it)."""
    from stages.core.modeling import load_model

    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    flops.counts.update(forward=0.0, backward=0.0)
    yield load_model(tmp_path / "m")
    flops.counts.update(forward=0.0, backward=0.0)


def _attention(cfg, rows: int, new: int, past: int = 0) -> float:
    width = cfg.num_hidden_layers * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    return 4.0 * width * rows * (new * past + new * (new + 1) / 2)


def test_a_forward_counts_torchs_matmul_flops_plus_causal_attention(model) -> None:
    ids = torch.randint(3, model.config.vocab_size, (3, 17))
    with torch.no_grad(), FlopCounterMode(display=False) as oracle:
        model(input_ids=ids, use_cache=False)
    # torch counts every matmul; on the CPU it counts no FLOPs for the fused attention kernel, which flops adds
    assert flops.counts["forward"] == pytest.approx(oracle.get_total_flops() + _attention(model.config, 3, 17), rel=1e-9)
    assert flops.counts["backward"] == 0


def test_training_counts_the_backward_twice_and_a_chunked_head_only_where_it_scores(model) -> None:
    ids = torch.randint(3, model.config.vocab_size, (2, 12))
    targets = ids.clone()
    targets[:, :8] = -100  # four scored positions per row (an SFT answer)
    _, lp, _ = lm_logprobs(model, targets, chunk_tokens=4, input_ids=ids, use_cache=False)
    lp.sum().backward()
    cfg = model.config
    body = sum(2.0 * m.in_features * m.out_features for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()) * 2 * 12
    head = 2.0 * cfg.hidden_size * cfg.vocab_size * 2 * 4
    assert flops.counts["forward"] == pytest.approx(body + head + _attention(cfg, 2, 12), rel=1e-9)
    assert flops.counts["backward"] == pytest.approx(2 * flops.counts["forward"], rel=1e-9)


def test_a_decode_step_attends_over_its_cache(model) -> None:
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
        before = flops.counts["forward"]
        model(input_ids=ids[:, :1], cache=cache, use_cache=True, logits_to_keep=1)
    linear = sum(2.0 * m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)) * 2
    assert flops.counts["forward"] - before == pytest.approx(linear + _attention(model.config, 2, 1, past=9), rel=1e-9)


def test_the_timings_record_the_count(model, tmp_path, monkeypatch) -> None:
    from stages.core import io, paths

    monkeypatch.chdir(tmp_path)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 50, (1, 5)), use_cache=False)
    io.write_metrics("x", {"acc": 1.0, "wall_s": 2.0}, ["acc"])
    timings = io.read_json(paths.timings_file("x"))
    assert timings["model_flops"]["forward"] == pytest.approx(flops.counts["forward"], rel=1e-3)
    assert "model_flops" not in io.read_json(paths.details_file("x"))  # never in the tracked bytes

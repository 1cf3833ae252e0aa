"""stages/core/threads.py: the torch thread count follows the machine's load where the stages' kernels give the same
bits at 1 and 2 threads: checked here for the tiny default's shapes (pretraining's and packed SFT's bf16-autocast
steps, float32 training steps under MKL's strict mode, GRPO's shared-prompt log-prob pass, sampled generation in
float32 and bf16, decode attention). Other training steps hold the thread limit (bf16 ones at varying shapes, and
float32 ones without strict MKL, are not invariant on a CPU with AMX; tested below). The test process runs in
strict MKL mode as every project command does (conftest.py calls flows/_common.py ``begin``). If a torch or CPU change breaks one of these, the adaptation must go for that work (DSM_THREADS=fixed, or take it out): results would then depend on the load
(issue 29)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.core import threads


def _default_model() -> LlamaForCausalLM:
    """params.yaml base_model's sizes, random weights."""
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=512)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _at(n: int, fn: Callable[[], Any]) -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.md5()
    for t in tensors:
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def _native_bf16_or_skip() -> None:
    """Skip a bf16 check on a CPU whose bf16 matmuls are emulated (stages.core.hardware.fast_bf16: no AMX, no
    AVX512_BF16), where the stages run bf16 only when a params file asks for it."""
    from stages.core.hardware import fast_bf16

    native, why = fast_bf16("cpu")
    if not native:
        pytest.skip(f"bf16 is emulated on this {why}: precision auto runs fp32 here")


def _packed_batch(g: torch.Generator, rows: int, seq: int) -> dict[str, torch.Tensor]:
    """Random tokens packed as the pretraining stream packs documents: position_ids restart at each document start
    (block-diagonal attention), labels = input ids."""
    x = torch.randint(0, 2048, (rows, seq), generator=g)
    pos = torch.zeros(rows, seq, dtype=torch.long)
    for r in range(rows):
        cuts = sorted(torch.randint(1, seq, (3,), generator=g).tolist())
        start = 0
        for c in [*cuts, seq]:
            pos[r, start:c] = torch.arange(c - start)
            start = c
    return {"input_ids": x, "labels": x.clone(), "position_ids": pos}


@pytest.mark.parametrize(("chunk_tokens", "rows", "seq"), [(256, 16, 256), (1024, 16, 256), (0, 16, 256), (256, 8, 512)])
def test_a_bf16_training_step_of_the_loop_is_the_same_bits_at_1_and_2_threads(chunk_tokens: int, rows: int,
                                                                               seq: int) -> None:
    """Two AdamW steps through the training loop's own loss (stages.train.loop.forward_nll: bf16 autocast, packed
    position_ids, the chunked LM head at params.yaml's ``logprob_chunk_tokens`` 256 and others, 0 = whole logits;
    pretraining's 16 x 256 micro-batch, the only shape its packed stream makes, and packed SFT's 8 x 512) with gradient
    clipping: the same bits
    at 1 and 2 threads, so pretraining's bf16 steps may follow the load (threads.TRAINING). Before the chunked head's
    backward products ran on one thread (threads.single) its ``gz @ W`` at 256 rows and ``gz.T @ h`` at 1024 rows
    rounded by thread count, and so did this test. Skipped on a CPU without native bf16 (no AMX, no AVX512_BF16):
    ``precision: auto`` never trains in bf16 there, and its emulated bf16 matmuls make this the suite's slowest test by
    far (docs/ci.md); CPUs with AMX or AVX512_BF16 run it."""
    _native_bf16_or_skip()
    from stages.train.loop import forward_nll

    def train() -> tuple[str, list[float]]:
        model = _default_model()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)  # as stages/train/loop.py
        g = torch.Generator().manual_seed(1)
        norms = []
        for _ in range(2):
            b = _packed_batch(g, rows, seq)
            nll, n = forward_nll(model, b, True, torch.device("cpu"), chunk_tokens)
            (nll / n).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            opt.step()
            opt.zero_grad(set_to_none=True)
        return _digest(list(model.state_dict().values())), norms

    assert _at(1, train) == _at(2, train)


def test_the_fixed_shape_streams_make_one_shape() -> None:
    """Pretraining's packed stream and SFT's packed rows (padded to seq_len) make one shape, so their bf16 steps may
    adapt; SFT's one-example rows are padded to each batch's longest and hold the limit."""
    from stages.train.data import Example, PackedExamples, PackedMixture

    exs = [Example(tuple(range(1, n + 1)), tuple(range(1, n + 1))) for n in (30, 50, 70, 20, 90, 40)]
    packed = PackedExamples(exs, 128, seed=0, pad_id=0, pack=True)
    single = PackedExamples(exs, 128, seed=0, pad_id=0, pack=False)
    assert PackedMixture.fixed_shape is True and packed.fixed_shape is True and single.fixed_shape is False
    assert [tuple(packed.next_batch(2)["input_ids"].shape) for _ in range(3)] == [(2, 128)] * 3
    assert max(tuple(single.next_batch(2)["input_ids"].shape)[1] for _ in range(3)) < 128
    assert threads.training_adapts(autocast_bf16=True, fixed_shape=True)
    assert not threads.training_adapts(autocast_bf16=True, fixed_shape=False)
    assert not threads.training_adapts(autocast_bf16=False, fixed_shape=True, deepspeed=True)
    assert threads.training_adapts(autocast_bf16=False, fixed_shape=False) is threads.strict_blas()


def _grads(bf16: bool, rows: int, seq: int) -> str:
    """One forward + backward of the default model's loss (stages.train.loop.forward_nll) on a packed batch."""
    from stages.train.loop import forward_nll

    model = _default_model()
    model.train()
    b = _packed_batch(torch.Generator().manual_seed(1), rows, seq)
    nll, n = forward_nll(model, b, bf16, torch.device("cpu"), 256)
    (nll / n).backward()
    return _digest([q.grad for q in model.parameters()])


def test_a_bf16_step_of_a_varying_shape_is_not_the_same_bits_at_1_and_2_threads_with_amx() -> None:
    """Why bf16 steps of varying shape hold the limit (threads.TRAINING): at 8 x 498 tokens (an SFT batch when it was
    padded to its longest row) the weight gradients round by thread count (oneDNN splits their reductions over the
    tokens; MKL's strict mode does not govern oneDNN). Asserted where it was measured (an AMX CPU)."""
    if not getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        pytest.skip("measured on CPUs with AMX")
    assert _at(1, lambda: _grads(True, 8, 498)) != _at(2, lambda: _grads(True, 8, 498))


@pytest.mark.parametrize(("rows", "seq"), [(16, 256), (8, 498), (4, 137), (8, 61), (24, 83)])
def test_a_float32_step_is_the_same_bits_at_1_and_2_threads_under_strict_mkl(rows: int, seq: int) -> None:
    """float32 training steps (GRPO's update and its baseline: micro-batches of any shape) follow the load because
    strict MKL makes their gradients the same bits at 1 and 2 threads (threads.MKL_CBWR), in this process as in a
    stage's."""
    if not threads.strict_blas():
        pytest.skip("torch without MKL: float32 training steps hold the limit")
    assert _at(1, lambda: _grads(False, rows, seq)) == _at(2, lambda: _grads(False, rows, seq))


_FP32_CHILD = """
import sys
import torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from stages.core import threads
from test_threads import _at, _grads
if sys.argv[3] == "switch":
    threads.strict_blas()
same = _at(1, lambda: _grads(False, 16, 256)) == _at(2, lambda: _grads(False, 16, 256))
print(threads.strict_blas(), same)
"""


@pytest.mark.parametrize("mode", ["AUTO", "AUTO,STRICT", None])
def test_strict_mkl_is_what_makes_float32_steps_the_same_bits(mode: str | None) -> None:
    """In a new process: MKL's default mode (``AUTO``) gives a float32 step other bits at 1 and 2 threads on this
    CPU (MKL splits the weight gradients' reductions over the tokens by thread count), ``AUTO,STRICT`` (the project's,
    threads.MKL_CBWR) the same bits; with MKL_CBWR unset, :func:`threads.strict_blas` switches strict mode on before
    MKL first runs (a user's ``AUTO`` it leaves, and says so). Asserted where measured (AVX-512 with AMX)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not torch.backends.mkl.is_available():
        pytest.skip("torch without MKL")
    if not getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        pytest.skip("measured on CPUs with AMX")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mode is not None:
        env["MKL_CBWR"] = mode
    here = Path(__file__).resolve()
    out = subprocess.run([sys.executable, "-c", _FP32_CHILD, str(here.parents[2]), str(here.parent), "switch"], env=env,
                         capture_output=True, text=True, check=True, timeout=300).stdout.split()
    strict = mode != "AUTO"
    assert out == [str(strict), str(strict)]


def test_grpo_shared_prompt_logprobs_are_the_same_bits_at_1_and_2_threads() -> None:
    from stages.rl.rollout import token_logprobs

    g = torch.Generator().manual_seed(0)
    U, G, P, T = 5, 8, 40, 32
    prompts = torch.randint(5, 2000, (U, P), generator=g)
    pmask = torch.ones(U, P, dtype=torch.long)
    for i in range(U):
        pmask[i, : int(torch.randint(0, 20, (1,), generator=g))] = 0
    cmask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (U * G, 1), generator=g)).long()
    ids = torch.cat([prompts.repeat_interleave(G, 0), torch.randint(5, 2000, (U * G, T), generator=g)], 1)
    att = torch.cat([pmask.repeat_interleave(G, 0), cmask], 1)

    def run() -> str:
        model = _default_model().train()
        out = []
        # 4 groups, one group alone (U = 1), and completions of 2 tokens (the cached pass sees one query position)
        for rows, width in ((slice(0, 32), P + T), (slice(32, 40), P + T), (slice(0, 16), P + 2)):
            model.zero_grad(set_to_none=True)
            lp, ent = token_logprobs(model, ids[rows, :width], att[rows, :width], P, 1.0, entropy=True,
                                     share_prompts=True)
            (lp * cmask[rows, : width - P]).sum().backward()
            out.append(([lp, ent], [p.grad for p in model.parameters()]))
        return out

    one, two = _at(1, run), _at(2, run)
    # the forward (log-probs, entropies) is the same bits; the float32 gradients are on CPUs without AMX and are not
    # with AMX, so GRPO's update holds the limit (the next test)
    assert _digest([t for fwd, _ in one for t in fwd]) == _digest([t for fwd, _ in two for t in fwd])


def test_held_training_steps_keep_the_limit_while_the_load_halves_the_other_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine: an adapting step (generation, evaluation batches, a pretraining step) drops to 1 thread,
    ``step(adapt=False)`` (SFT, the continued-SFT baseline) and ``held()`` (GRPO's update) run at the limit, and after
    ``held()`` the step's count is back."""
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "_procs_running", lambda: 2)  # one other runnable task besides our one
    monkeypatch.setattr(threads, "_own_running", lambda: 1)
    monkeypatch.setattr(threads, "SAMPLE_S", 0.01)
    before = torch.get_num_threads()
    try:
        with threads.ThreadPolicy(2, adaptive=True) as pol:
            time.sleep(0.1)
            assert pol.step() == 1 and torch.get_num_threads() == 1
            with pol.held():
                assert torch.get_num_threads() == 2
            assert torch.get_num_threads() == 1 and pol.threads == 1
            time.sleep(0.1)
            assert pol.step(adapt=False) == 2 and torch.get_num_threads() == 2
            assert pol.stats()["steps_at_threads"] == {"1": 1, "2": 1}
    finally:
        torch.set_num_threads(before)


def test_sampled_generation_is_the_same_at_1_and_2_threads() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from stages.core.generation import HFGenerator, SamplingParams

    vocab = {f"w{i}": i for i in range(2046)} | {"<unk>": 2046, "</s>": 2047}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="</s>", pad_token="</s>")
    texts = [" ".join(f"w{(7 * i + j) % 500}" for j in range(10 + 3 * i)) for i in range(8)]

    from stages.core.hardware import fast_bf16

    # the evaluation generates in bf16 on AMX / CUDA; bf16 is emulated (and not used) on a CPU without native bf16
    for dtype in (torch.float32, torch.bfloat16) if fast_bf16("cpu")[0] else (torch.float32,):

        def run(dtype: torch.dtype = dtype) -> list[tuple[list[int], list[float]]]:
            gen = HFGenerator(_default_model().to(dtype).eval(), tok)
            outs = gen.generate(texts, SamplingParams(temperature=1.0, n=4, max_new_tokens=24, seed=3))
            greedy = gen.generate(texts, SamplingParams(temperature=0.0, max_new_tokens=24))
            return [(list(c.token_ids), list(c.logprobs)) for group in outs + greedy for c in group]

        assert _at(1, run) == _at(2, run), dtype


def test_the_policy_drops_to_one_thread_while_other_work_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 2 cores: one other runnable task -> 1 thread; none -> 2; DSM_THREADS=fixed -> always the limit."""
    others = {"n": 1}
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "_procs_running", lambda: others["n"] + 1)
    monkeypatch.setattr(threads, "_own_running", lambda: 1)
    monkeypatch.setattr(threads, "SAMPLE_S", 0.01)
    before = torch.get_num_threads()
    try:
        with threads.ThreadPolicy(2, adaptive=True) as pol:
            assert pol.threads == 2
            time.sleep(0.2)
            assert pol.step() == 1 and torch.get_num_threads() == 1
            others["n"] = 0
            time.sleep(0.2)
            assert pol.step() == 2 and torch.get_num_threads() == 2
            assert pol.stats()["steps_at_threads"] == {"1": 1, "2": 1}
        monkeypatch.setenv(threads.ENV, "fixed")
        others["n"] = 1
        with threads.ThreadPolicy(2) as pol:
            time.sleep(0.1)
            assert not pol.adaptive and pol.step() == 2
        with threads.ThreadPolicy(1) as pol:  # a limit of 1 never adapts
            assert not pol.adaptive and pol.step() == 1
    finally:
        torch.set_num_threads(before)


def test_the_sampler_sees_a_busy_process() -> None:
    """The real counters: beside one spinning process, the mean of other runnable tasks is at least ~1."""
    import subprocess
    import sys

    if threads._procs_running() is None:
        pytest.skip("no /proc/stat")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with threads.ThreadPolicy(2, adaptive=True) as pol:
            time.sleep(1.5)
            pol.step()
            assert pol.stats()["others_mean"] >= 0.8, pol.stats()
    finally:
        hog.kill()
        hog.wait()


def test_decode_steps_take_the_flash_kernel_unless_rows_times_heads_are_fewer_than_the_threads() -> None:
    """The math backend only where the flash kernel could split one query's keys across threads; the flash kernel at
    the tiny default's decode shapes (4 heads) gives the same bits at 1 and 2 threads."""
    import contextlib

    import torch.nn.functional as F

    n = threads.max_threads()
    assert isinstance(threads.invariant_attention(torch.zeros(n, 1, dtype=torch.long), 1), contextlib.nullcontext)
    assert isinstance(threads.invariant_attention(torch.zeros(1, 5, dtype=torch.long), 1), contextlib.nullcontext)
    if n > 1:
        assert not isinstance(threads.invariant_attention(torch.zeros(1, 1, dtype=torch.long), 1),
                              contextlib.nullcontext)
    g = torch.Generator().manual_seed(0)
    for rows in (1, 3, 16):
        for dt in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(rows, 4, m, 64, generator=g).to(dt) for m in (1, 300, 300))
            mask = torch.ones(rows, 1, 1, 300, dtype=torch.bool)
            mask[::2, :, :, :9] = False
            outs = [_at(t, lambda q=q, k=k, v=v, m=mask: _digest([F.scaled_dot_product_attention(q, k, v, attn_mask=m)]))
                    for t in (1, 2)]
            assert outs[0] == outs[1], (rows, dt)

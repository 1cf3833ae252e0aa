"""Run by tests/core/test_generation_vllm.py under torchrun (2 CPU ranks): a gloo process group first (as the update
path's DeepSpeed initialisation does), then one colocated vLLM engine built from the model object (dummy weights,
then the in-memory sync) with ``tensor_parallel_size`` from argv; each rank generates for its own prompts and
compares with the hf backend. Prints one JSON line per rank."""

from __future__ import annotations

import json
import os
import sys

import torch

if __name__ == "__main__":
    sys.path.insert(0, os.environ["PROJECT_ROOT"])
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    from stages.core.generation import HFGenerator, SamplingParams
    from stages.core.vllm_backend import VLLMGenerator
    from tests.core.test_generation import tiny_model, tiny_prompts, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model(tok)
    eng = VLLMGenerator(model, tok, max_model_len=256, tensor_parallel_size=int(sys.argv[1]))
    tmp_files = sorted(os.listdir(eng._tmpdir)) if eng._tmpdir else []
    rank = torch.distributed.get_rank()
    prompts = tiny_prompts(4)[rank * 2:(rank + 1) * 2]  # each rank its own prompts
    sp = SamplingParams(max_new_tokens=12, n=2)
    got, want = eng.generate(prompts, sp), HFGenerator(model, tok).generate(prompts, sp)
    with torch.no_grad():  # the weights are the policy's: change them, sync, and the engine follows
        for prm in model.parameters():
            prm.mul_(0.5)
    eng.sync_weights(model)
    got2, want2 = eng.generate(prompts, sp), HFGenerator(model, tok).generate(prompts, sp)
    executor = type(eng.llm.llm_engine.model_executor).__name__
    print("RESULT " + json.dumps({
        "rank": rank, "executor": executor, "tmp_files": tmp_files,
        "same": [[c.token_ids for c in g] == [c.token_ids for c in w] for g, w in zip(got, want, strict=True)],
        "same_after_sync": [[c.token_ids for c in g] == [c.token_ids for c in w]
                            for g, w in zip(got2, want2, strict=True)],
        "changed": [g[0].token_ids != h[0].token_ids for g, h in zip(got, got2, strict=True)],
    }), flush=True)
    eng.close()

"""Run by tests/rl/test_grpo_deepspeed.py under torchrun (2 CPU ranks, gloo) and as one plain process; prints one
JSON line per rank.

    python _ds_two_ranks.py PROJECT [grpo | rm_baseline | recipes]

grpo: two steps of GRPO on scripted rollouts (world size, per-step grad norms, weight checksum). rm_baseline: one RM
update of iterative RL (stages.rl.iterative.update_reward_model: hf sampling of the policy, value labels, RM
training) and the continued-SFT baseline (stages.rl.baseline.continued_sft) through the policy's update path
(DeepSpeed ZeRO-2 on the two ranks, plain PyTorch in one process): losses, AUCs, example count, weight checksums.
recipes: three steps of GRPO with dynamic sampling and the curriculum on scripted rollouts with planted all-equal
groups (tests/rl/test_recipes_two_ranks.py)."""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch

if __name__ == "__main__":
    sys.path.insert(0, os.environ["PROJECT_ROOT"])
    torch.set_num_threads(1)
    if os.environ.get("WORLD_SIZE", "1") != "1" or os.environ.get("FORCE_DS") == "1":
        os.environ["DS_ACCELERATOR"] = "cpu"
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build (speed-up only)
    os.chdir(sys.argv[1])
    from stages.core import paths
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl.data import load_prompts
    from tests.rl.test_grpo_stage import rl_train, tiny_params
    from tests.rl.test_paradigm import ScriptedGenerator, _texts

    model, tok, rows = load_model(paths.SFT_MODEL), load_tokenizer(paths.SFT_MODEL), load_prompts(paths.RL_PROMPTS)
    ds = os.environ.get("WORLD_SIZE", "1") != "1" or os.environ.get("FORCE_DS") == "1"
    mode = sys.argv[2] if len(sys.argv) > 2 else "grpo"
    if mode == "rm_baseline":
        from stages.rl.baseline import continued_sft
        from stages.rl.iterative import update_reward_model
        from stages.rl.rm.model import init_reward_model
        from stages.rl.update import rl_updater

        def checksum(m):
            return float(sum(v.double().sum() for v in m.state_dict().values()))

        p = tiny_params(steps=2, optim__micro_batch_size=1, reward__source="process_rm",
                        deepspeed=dict(enabled=ds, zero_stage=2, offload_optimizer=False))
        torch.manual_seed(0)
        rm = init_reward_model(paths.SFT_MODEL)
        new, m = update_reward_model(rm, tok, model, rows, [], p, iteration=1)
        base = load_model(paths.SFT_MODEL)
        bh = continued_sft(base, tok, rows, steps=2, per_step=3, seed=0, lr=1e-3, max_grad_norm=1.0,
                           micro_batch_size=1, updater=rl_updater(base, p, lr=1e-3, weight_decay=0.0))
        out = {"rank": int(os.environ.get("RANK", "0")), "n_new": len(new), "rm_loss": m["loss_per_epoch"],
               "auc_after": m["heldout_after_update"], "rm_checksum": checksum(rm),
               "baseline_loss": [r["sft_loss"] for r in bh], "baseline_checksum": checksum(base)}
        sys.stdout.write("RESULT " + json.dumps(out) + "\n")  # one write: the ranks share stdout
        sys.stdout.flush()
        raise SystemExit(0)
    if mode == "recipes":  # dynamic sampling and the curriculum: every rank agrees on what to keep and draw
        from tests.rl.test_recipes import Scripted, _easy_even

        p = tiny_params(steps=3, questions_per_step=3, optim__micro_batch_size=3, checkpoint_every=0,
                        reward__custom=[], reward__custom_weights=[],
                        dynamic_sampling=dict(enabled=True, metric="accuracy", max_rounds=3, max_per_round=None,
                                              oversample=1.0),
                        curriculum=dict(enabled=True, low=0.0, high=1.0, hard_weight=0.0, easy_weight=0.0,
                                        normal_weight=1.0, unseen_weight=0.5, ema=1.0),
                        deepspeed=dict(enabled=ds, zero_stage=2, offload_optimizer=False))
        gen = Scripted(tok, rows, _easy_even)  # even answers: all-equal groups
        h, _, info = rl_train(model, tok, rows, p, ckpt_dir=None, generator=gen)
        keys = ("ds_rounds", "ds_generated_groups", "ds_kept_groups", "ds_shortfall", "n_train_outputs",
                "curriculum_sampled_unseen", "curriculum_sampled_normal")
        out = {"rank": int(os.environ.get("RANK", "0")), "world": info["world_size"],
               "grad_norm": [r["grad_norm"] for r in h], "rows": [{k: r[k] for k in keys} for r in h],
               "questions": sorted(q for call in gen.calls for q in call),
               "checksum": float(sum(v.double().sum() for v in model.state_dict().values()))}
        sys.stdout.write("RESULT " + json.dumps(out) + "\n")
        sys.stdout.flush()
        raise SystemExit(0)
    p = tiny_params(steps=2, questions_per_step=3, optim__micro_batch_size=3, checkpoint_every=0,
                    deepspeed=dict(enabled=ds, zero_stage=2, offload_optimizer=False))
    h, _, info = rl_train(model, tok, rows, p, ckpt_dir=None, generator=ScriptedGenerator(tok, rows, _texts))
    out = {"rank": int(os.environ.get("RANK", "0")), "world": info["world_size"],
           "grad_norm": [r["grad_norm"] for r in h], "steps": [r["optimizer_steps"] for r in h],
           "checksum": float(sum(v.double().sum() for v in model.state_dict().values()))}
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()

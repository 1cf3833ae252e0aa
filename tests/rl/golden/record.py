"""Golden record of the RL step (issue 17): the first steps of every algorithm on the tiny default, in float32 with
one torch thread, so that a refactor of the step can be checked against the code it replaced.

    python tests/rl/golden/record.py --models DIR [--prompts FILE] [--out tests/rl/golden/record.json] [--steps 3]

``DIR`` holds ``sft/`` (the tiny default's SFT model) and ``reward_model/`` (its reward model; the outcome_rm /
process_rm entries are left out when it is absent). The prompt file defaults to ``DIR/../corpus/problems/rl.jsonl``
(a pipeline run's layout). The grpo section is params.yaml's (the tiny default) with steps = ``--steps``, one thread,
no held-out evaluation, no baseline, no checkpoints, no completion tables; the record stores that section, the
fingerprints of the models and prompts, and per configuration and step: loss (the sum of the micro-batch losses of
the step's optimizer step), grad norm, KL, reward mean, accuracy, the (Q, G) rewards, and a few more metrics; after
the last step, a checksum of the policy's weights. tests/rl/golden/test_golden.py recomputes it with the current code.

The entry points used are the stage's: the RL loop (``stages.rl.loop.setup``, ``stages.rl.iterative.run_iterations``
around ``stages.rl.loop.train``; ``stages.rl.baseline.train_sft`` for sft); the rewards are read by wrapping the loop's
``run_step``. The committed records were made with the code of their day (before issue 17's refactor; their params,
recorded in the flat layout of that day, were rewritten once into today's groups); this script records today's code.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "sft": {"algorithm": "sft", "reward": {"source": "rule"}},
    "rft": {"algorithm": "rft", "reward": {"source": "rule"}},
    "online_rft": {"algorithm": "online_rft", "reward": {"source": "rule"}},
    "grpo_rule": {"algorithm": "grpo", "reward": {"source": "rule"}},
    "grpo_process_rule": {"algorithm": "grpo", "reward": {"source": "process_rule"}},
    "grpo_outcome_rm": {"algorithm": "grpo", "reward": {"source": "outcome_rm"}},
    "grpo_process_rm": {"algorithm": "grpo", "reward": {"source": "process_rm"}},
}
NEEDS_RM = ("grpo_outcome_rm", "grpo_process_rm")
STEP_KEYS = ("loss", "grad_norm", "kl", "reward_mean", "reward_std", "accuracy", "zero_std_frac", "entropy",
             "n_train_outputs", "optimizer_steps", "completion_len", "ratio_mean", "nll", "rm_steps_mean",
             "clip_frac_low", "clip_frac_high", "sft_loss")


def fingerprint(path: Path) -> str:
    """sha256 of a file, or of a model directory's model.safetensors."""
    f = path / "model.safetensors" if path.is_dir() else path
    return hashlib.sha256(f.read_bytes()).hexdigest()


def grpo_section(steps: int, params_file: Path = ROOT / "params.yaml") -> dict[str, Any]:
    """params.yaml's grpo section, resolved (runtime values included), for the record: ``steps`` steps, one thread, no
    side outputs."""
    from stages.schema.grpo import GrpoParams

    raw = GrpoParams.from_file(params_file).model_dump()
    raw.update(steps=steps, checkpoint_every=0, log_completions_every=0)
    raw["compute"]["num_threads"] = 1
    raw["baseline"]["enabled"] = False
    raw["heldout"]["every"] = 0
    raw["iterative"]["iterations"] = 1
    return raw


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` written over it, mappings merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return None if not math.isfinite(x) else x
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def weights_checksum(model: torch.nn.Module) -> dict[str, float]:
    """Sum and sum of squares of every weight, in float64."""
    s = sq = 0.0
    for v in model.state_dict().values():
        d = v.detach().double()
        s += float(d.sum())
        sq += float((d * d).sum())
    return {"sum": s, "sum_sq": sq}


@contextlib.contextmanager
def _project(models: Path, prompts: Path) -> Iterator[Path]:
    """A temporary working directory with data/models/{sft,reward_model} and the RL prompts linked in."""
    from stages.core import paths

    old = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        os.chdir(tmp)
        try:
            paths.MODELS.mkdir(parents=True)
            os.symlink(models / "sft", paths.SFT_MODEL)
            if (models / "reward_model").is_dir():
                os.symlink(models / "reward_model", paths.REWARD_MODEL)
            paths.RL_PROMPTS.parent.mkdir(parents=True)
            shutil.copy(prompts, paths.RL_PROMPTS)
            yield Path(tmp)
        finally:
            os.chdir(old)


def run_config(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration from the working directory's data/ through the stage's own path (the RL loop: setup,
    Algorithm 1 with one iteration, close; continued SFT for sft) and return its record. The (Q, G) rewards of each
    step are read by wrapping the loop's ``run_step``."""
    from stages.core import paths
    from stages.core.modeling import load_model, load_tokenizer
    from stages.rl import loop
    from stages.rl.baseline import train_sft
    from stages.rl.data import load_prompts
    from stages.rl.iterative import run_iterations
    from stages.schema.grpo import GrpoParams

    torch.set_num_threads(1)
    p = GrpoParams.model_validate(raw)
    tok, model = load_tokenizer(paths.SFT_MODEL), load_model(paths.SFT_MODEL)
    rows = load_prompts(paths.RL_PROMPTS)
    torch.manual_seed(p.seed)
    rewards: list[Any] = []
    real_step = loop.run_step

    def step(*a: Any, **k: Any) -> Any:
        m, ro, r = real_step(*a, **k)
        rewards.append([[float(x) for x in row] for row in r.tolist()])
        return m, ro, r

    loop.run_step = step
    try:
        if p.algorithm == "sft":
            hist, _, _ = train_sft(model, tok, rows, p)
            for r in hist:
                r["loss"] = r["sft_loss"]
        else:
            parts = loop.setup(p, model, tok, rows=rows, rm_dir=paths.REWARD_MODEL)
            with tempfile.TemporaryDirectory() as out:
                try:
                    hist = run_iterations(*parts, ckpt_dir=None, out_dir=Path(out) / "iters")
                finally:
                    loop.close(*parts)
    finally:
        loop.run_step = real_step
    steps = []
    for i, r in enumerate(hist):
        row = {k: _clean(float(r[k])) for k in STEP_KEYS if k in r and r[k] is not None}
        if i < len(rewards):
            row["rewards"] = _clean(rewards[i])
        steps.append(row)
    return {"steps": steps, "weights": weights_checksum(model)}


def build_tiny_inputs(root: Path) -> tuple[Path, Path]:
    """The fast record's inputs, rebuilt deterministically: the RL tests' ~60k-parameter Llama as ``sft/``, a reward
    model initialised from it (seed 0, no training) as ``reward_model/`` and their 8-row prompt file. Returns
    (models dir, prompt file)."""
    from stages.core.modeling import load_tokenizer
    from stages.rl.rm.model import init_reward_model, save_reward_model
    from tests.rl.conftest import make_tiny_model_dir, write_prompts

    models = root / "models"
    make_tiny_model_dir(models / "sft")
    torch.manual_seed(0)
    save_reward_model(init_reward_model(models / "sft"), load_tokenizer(models / "sft"), models / "reward_model", [],
                      None, {"stage": "golden"})
    return models, write_prompts(root / "rl.jsonl", 8)


def record(models: Path, prompts: Path, steps: int, names: list[str] | None = None,
           raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of ``names`` (default: every configuration whose inputs exist)."""
    base = raw if raw is not None else grpo_section(steps)
    have_rm = (models / "reward_model").is_dir()
    names = names or [n for n in CONFIGS if have_rm or n not in NEEDS_RM]
    out: dict[str, Any] = {
        "threads": 1, "dtype": "float32", "torch": torch.__version__, "params": base,
        "fingerprints": {"sft": fingerprint(models / "sft"), "prompts": fingerprint(prompts),
                         **({"reward_model": fingerprint(models / "reward_model")} if have_rm else {})},
        "configs": {},
    }
    with _project(models.resolve(), prompts.resolve()):
        for n in names:
            cfg = merge(json.loads(json.dumps(base)), CONFIGS[n])
            out["configs"][n] = run_config(n, cfg)
            print(f"{n}: " + json.dumps(out["configs"][n]["steps"][0])[:300], flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="directory with sft/ and reward_model/")
    ap.add_argument("--tiny", action="store_true", help="record the fast test's inputs (build_tiny_inputs) instead")
    ap.add_argument("--prompts", default=None, help="RL prompt JSONL (default: DIR/../corpus/problems/rl.jsonl)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, choices=list(CONFIGS))
    ap.add_argument("--out", default=str(Path(__file__).with_name("record.json")))
    args = ap.parse_args()
    if args.tiny:
        with tempfile.TemporaryDirectory() as tmp:
            models, prompts = build_tiny_inputs(Path(tmp))
            rec = record(models, prompts, args.steps, args.only)
    else:
        if not args.models:
            ap.error("--models DIR (or --tiny) is required")
        models = Path(args.models)
        prompts = Path(args.prompts) if args.prompts else models.parent / "corpus" / "problems" / "rl.jsonl"
        rec = record(models, prompts, args.steps, args.only)
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

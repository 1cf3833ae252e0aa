"""Real mode scaled down, as a DVC graph: `dvc repro` in a clean temporary repo runs testsets -> ingest -> sft ->
grpo -> evaluate on real rows (a few hundred GSM8K + MATH train rows, a few GSM8K test and MATH-500 problems, copied
out of ../shared/data) with a tiny local Qwen2 whose tokenizer has its own chat template
(params/qwen2.5-0.5b-gsm8k.yaml with SFT turned on and everything sized down). Then one row of one real input file
is edited: `dvc status` names exactly the stages that read the file, and `dvc repro` re-runs those and what depends
on their outputs, nothing else.

Heavy (a few minutes): marked slow, run by .ci/slow real-graph (`pytest -m slow tests/flows/test_real_graph.py`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.params import resolve
from tests.flows._project import copy_sources
from tests.tiny_models import tiny_qwen2

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

N_TRAIN, N_TEST = 150, 4


def _run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", PYTHONPATH=str(cwd),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def _ran(out: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", out))


def _changed(status: str) -> set[str]:
    """Stage names `dvc status` reports as changed (lines `name:` at the start)."""
    return {m.group(1) for m in re.finditer(r"^([\w@.-]+):\s*$", status, re.M)}


def _copy_rows(src: Path, dst: Path, n: int) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)
    return dst


def _ds(path: Path, adapter: str, role: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"path": str(path), "hub": None, "adapter": adapter, "fields": {}, "match": {}, "limit": None}
    return {**d, "role": role} if role else d


def _params(real: Path, model: Path) -> dict[str, Any]:
    raw = resolve(ROOT / "params" / "qwen2.5-0.5b-gsm8k.yaml")
    raw["data"]["problems"].update(n_sft=60, n_rl=30, n_test=20)
    raw["data"]["crawl"].update(n_pages=400, n_seed_pages=80, n_math_domains=4, n_general_domains=12, n_contaminated=4)
    raw["corpus"].update(n_shards=1)
    raw["corpus"]["recall"].update(rounds=1)
    raw["corpus"]["classifier"].update(dim=16, bucket=20000)
    raw["testsets"]["datasets"] = {"gsm8k": _ds(real / "gsm8k_test.jsonl", "gsm8k"),
                                   "math500": _ds(real / "math500.jsonl", "math")}
    raw["ingest"]["datasets"] = {
        "gsm8k_sft": _ds(real / "gsm8k_train.jsonl", "gsm8k", "sft"), "math_sft": _ds(real / "math_train.jsonl", "math", "sft"),
        "gsm8k_rl": _ds(real / "gsm8k_train.jsonl", "gsm8k", "rl"), "math_rl": _ds(real / "math_train.jsonl", "math", "rl")}
    raw["base_model"].update(checkpoint=str(model), prompt_format="chat_template")
    raw["sft"].update(enabled=True, problems="data/ingest/sft", formats={"cot": 1.0, "pot": 0.0, "tir": 0.0},
                      verify_programs=False, val_problems=4)
    raw["sft"]["train"].update(steps=2, micro_batch_size=2, seq_len=1024, lr=1e-3, warmup_steps=0, eval_every=0,
                               precision="fp32", num_threads=1)
    raw["grpo"].update(steps=2, questions_per_step=2)
    raw["grpo"]["rollout"].update(group_size=2, max_new_tokens=12, backend="hf")
    raw["grpo"]["optim"].update(lr=1e-4, micro_batch_size=4)
    raw["grpo"]["compute"].update(num_threads=1)
    raw["grpo"]["heldout"].update(every=0, limit=N_TEST, max_new_tokens=12)
    raw["evaluate"]["common"].update(backend="hf", dtype="float32", num_threads=1, batch_size=8, max_new_tokens=12,
                                     limit=N_TEST, sample_limit=2)
    greedy = {"prompting": "zero_shot", "greedy_modes": ["cot"], "sample_modes": [], "n_samples": 1, "limit": None}
    raw["evaluate"]["models"] = {  # every model the report stage reads
        **{m: {"path": f"data/models/{m}", **greedy} for m in ("base", "pretrain", "sft", "sft_continued")},
        "grpo": {**greedy, "path": "data/models/grpo", "sample_modes": ["cot"], "n_samples": 2}}
    raw["report"].update(models=["base", "pretrain", "sft", "sft_continued", "grpo"])
    raw["runtime"]["grpo"]["checkpoint_every"] = 0
    for s in ("pretrain", "sft"):
        raw["runtime"][s]["train"]["checkpoint_every"] = 0
    return raw


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory, prefect_api: str, shared_data: Path) -> dict[str, Any]:
    """The project copied into a fresh git repo, real rows beside it, one `dvc repro` of the whole graph."""
    base = tmp_path_factory.mktemp("realgraph")
    real = base / "real"
    _copy_rows(shared_data / "gsm8k" / "train.jsonl", real / "gsm8k_train.jsonl", N_TRAIN)
    _copy_rows(shared_data / "math" / "train.jsonl", real / "math_train.jsonl", N_TRAIN)
    _copy_rows(shared_data / "gsm8k" / "test.jsonl", real / "gsm8k_test.jsonl", N_TEST)
    _copy_rows(shared_data / "math" / "math500_test.jsonl", real / "math500.jsonl", N_TEST)
    texts = [json.loads(x)["question"] + "\n" + json.loads(x)["answer"] for x in (real / "gsm8k_train.jsonl").open()]
    texts += [json.loads(x)["problem"] + "\n" + json.loads(x)["solution"] for x in (real / "math_train.jsonl").open()]
    model = tiny_qwen2(texts, base / "tiny-qwen2", vocab_size=700)
    proj = base / "proj"
    copy_sources(proj)
    (proj / "params.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(_params(real, model))), sort_keys=False))  # written out: params refuse YAML aliases
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
    subprocess.run(["git", "add", "-A"], cwd=proj, check=True)
    subprocess.run(git + ["commit", "-qm", "init"], cwd=proj, check=True)
    t0 = time.perf_counter()
    out = _run(["dvc", "repro"], proj)
    return {"proj": proj, "real": real, "first": out, "first_s": time.perf_counter() - t0}


def test_repro_runs_ingestion_sft_grpo_evaluate_on_real_rows(graph: dict[str, Any]) -> None:
    proj = graph["proj"]
    ran = _ran(graph["first"])
    assert {"testsets@gsm8k", "testsets@math500", "ingest@gsm8k_sft", "ingest@math_sft", "ingest@gsm8k_rl",
            "ingest@math_rl", "base_model", "sft", "grpo", "evaluate@sft", "evaluate@grpo", "report"} <= ran
    sft_rows = [json.loads(x) for f in sorted((proj / "data/ingest/sft").glob("*.jsonl")) for x in f.open()]
    assert len(sft_rows) >= 2 * N_TRAIN - 10 and {r["benchmark"] for r in sft_rows} == {"gsm8k", "math"}
    sft = json.loads((proj / "data/details/sft.json").read_text())
    assert sft["prompt_format"] == "chat_template" and sft["steps"] == 2
    tok_cfg = json.loads((proj / "data/models/sft/tokenizer_config.json").read_text())
    assert tok_cfg["pipeline_prompt_format"] == "chat_template"  # recorded with the model, travels with it
    g = json.loads((proj / "data/details/grpo.json").read_text())
    assert g["grpo"]["steps"] == 2
    assert json.loads((proj / "data/models/grpo/config.json").read_text())["model_type"] == "qwen2"
    ev = json.loads((proj / "data/details/evaluate_grpo.json").read_text())
    assert ev["gsm8k"]["cot"]["greedy"]["n"] == N_TEST and ev["math500"]["cot"]["greedy"]["n"] == N_TEST
    prompts = (proj / "data/eval/grpo/prompts.txt").read_text()
    assert "<|im_start|>user\n" in prompts and "<|im_start|>assistant\n" in prompts  # the model's own template
    report = json.loads((proj / "data/reports/ingest/math_sft.json").read_text())
    assert report["rows_in"] == N_TRAIN and report["round_trip"]["checked"] > 0
    print(f"\nreal graph: first dvc repro {graph['first_s']:.0f} s, {len(ran)} stages")


def test_editing_one_row_reruns_exactly_the_stages_that_read_it(graph: dict[str, Any]) -> None:
    proj, real = graph["proj"], graph["real"]
    status = _run(["dvc", "status"], proj)
    assert "up to date" in status, status
    lines = (real / "math_train.jsonl").read_text().splitlines()
    row = json.loads(lines[7])
    row["problem"] = row["problem"].replace("$", "$ ", 1) + " (edited)"
    lines[7] = json.dumps(row)
    (real / "math_train.jsonl").write_text("\n".join(lines) + "\n")
    status = _run(["dvc", "status"], proj)
    assert _changed(status) == {"ingest@math_sft", "ingest@math_rl"}, status
    t0 = time.perf_counter()
    ran = _ran(_run(["dvc", "repro"], proj))
    # the two readers, then what reads their outputs (data/ingest/sft, data/ingest/rl) and, where an output changed,
    # the stages after it (a GRPO run whose saved model is byte-identical leaves evaluate@grpo up to date); never the
    # test sets, the other data sets, data, corpus, base_model or pretrain
    assert {"ingest@math_sft", "ingest@math_rl", "sft", "evaluate@sft"} <= ran, ran
    assert not ran & {"data", "corpus", "base_model", "pretrain", "testsets@gsm8k", "testsets@math500",
                      "ingest@gsm8k_sft", "ingest@gsm8k_rl", "evaluate@base", "evaluate@pretrain"}, ran
    assert ran <= {"ingest@math_sft", "ingest@math_rl", "sft", "reward_model", "grpo", "evaluate@sft", "evaluate@grpo",
                   "evaluate@sft_continued", "report"}, ran
    assert "up to date" in _run(["dvc", "status"], proj)
    # a test set's file: only its own stage is stale
    lines = (real / "gsm8k_test.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["question"] += " "
    lines[1] = json.dumps(row)
    (real / "gsm8k_test.jsonl").write_text("\n".join(lines) + "\n")
    assert _changed(_run(["dvc", "status"], proj)) == {"testsets@gsm8k"}
    print(f"\nreal graph: re-run after one edited MATH row {time.perf_counter() - t0:.0f} s: {sorted(ran)}")

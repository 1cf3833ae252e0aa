"""Data sets into pipeline rows: sources (JSONL, Parquet, directories, save_to_disk, hub via load_dataset on a local
directory), the adapters (GSM8K, MATH, MathInstruct, PAL, generic, pipeline), and the checked conversion with its
report (skips by reason, programs in the sandbox, the round trip through the evaluator's extraction)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages.core.errors import PipelineError
from stages.core.ingestion import ADAPTERS, convert, number_text, pot_from_print_program, read_source
from stages.core.problems import load_problem_file, load_rows
from stages.schema.datasets import DatasetSpec

GSM = [
    {"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"},
    {"question": "A shop sells 1,200 pens a day. How many in 2 days?", "answer": "1,200 * 2 = <<1200*2=2400>>2,400\n#### 2,400"},
    {"question": "No gold here?", "answer": "I do not know."},
    {"question": "", "answer": "#### 3"},
]
MATH = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "It is $\\boxed{\\frac{3}{4}}$.",
     "answer": "\\frac{3}{4}", "level": "Level 2", "type": "Prealgebra", "unique_id": "test/prealgebra/1.json"},
    {"problem": "Find $x$ if $x + 1 = 10$.", "solution": "So $x = \\boxed 9$.", "answer": None, "level": None,
     "type": "Algebra", "unique_id": "train/algebra/2.json"},
    {"problem": "Unanswerable?", "solution": "No boxed answer.", "answer": None, "level": 1, "type": "Algebra"},
]
PAL = [
    {"input": "Janet has 16 eggs and eats 3. How many are left?", "code": "def solution():\n    return 16 - 3\n",
     "target": 13.0},
    {"input": "A wrong program.", "code": "def solution():\n    return 1\n", "target": 2.0},
    {"input": "A crashing program.", "code": "def solution():\n    return 1 / 0\n", "target": 2.0},
    {"input": "No target.", "code": "def solution():\n    return 1\n", "target": None},
]
INSTRUCT = [
    {"instruction": "What is 2 + 3?", "output": "2 + 3 = 5. The answer is 5", "source": "data/CoT/gsm_rft.json"},
    {"instruction": "What is 6 * 7?", "output": "a = 6\nb = 7\nprint(a * b)", "source": "data/PoT/gsm_gpt4.json"},
    {"instruction": "Say hi.", "output": "hi there", "source": "data/CoT/other.json"},
    {"instruction": "Loop.", "output": "for i in range(3):\n    pass", "source": "data/PoT/x.json"},
]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spec(path: Path | str, adapter: str, **kw: Any) -> DatasetSpec:
    return DatasetSpec(**{"path": str(path), "hub": None, "adapter": adapter, "fields": {}, "match": {}, "limit": None,
                          **kw})


def _convert(spec: DatasetSpec, role: str | None = "sft") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return convert(spec, "ds", role=role, timeout_s=5.0, workers=1, samples=3)


def test_gsm8k_adapter_gold_cot_and_calculator_diagnostic() -> None:
    conv = [ADAPTERS["gsm8k"](r, i, "gsm", {}) for i, r in enumerate(GSM)]
    row = conv[0].row
    assert row is not None and row["answer"] == "72" and row["format"] == "cot" and row["benchmark"] == "gsm8k"
    assert row["cot"] == ("In May she sold 48/2 = 24 clips.\nAltogether 48+24 = 72 clips.\n"
                          "The answer is $\\boxed{72}$.")
    assert row["difficulty"] == 2 and row["calculator_last"] == "72" and row["id"] == "gsm-0"
    assert conv[1].row is not None and conv[1].row["answer"] == "2400"  # thousands separator removed
    assert (conv[2].skip, conv[3].skip) == ("no_gold", "no_question")


def test_math_adapter_gold_level_and_gold_from_the_solution() -> None:
    a, b, c = (ADAPTERS["math"](r, i, "math", {}) for i, r in enumerate(MATH))
    assert a.row is not None and a.row["answer"] == "\\frac{3}{4}" and a.row["difficulty"] == 2
    assert a.row["id"] == "test/prealgebra/1.json" and a.row["type"] == "Prealgebra" and a.row["benchmark"] == "math"
    assert b.row is not None and b.row["answer"] == "9" and b.note == "gold_from_solution"  # MATH train's null answers
    assert c.skip == "no_gold"


def test_instruct_adapter_cot_or_pot_by_source() -> None:
    cot, pot, nogold, loop = (ADAPTERS["instruct"](r, i, "mi", {}) for i, r in enumerate(INSTRUCT))
    assert cot.row is not None and cot.row["format"] == "cot" and cot.row["answer"] == "5"
    assert pot.row is not None and pot.row["format"] == "pot" and pot.gold_from_program
    assert pot.row["pot"] == "def solution():\n    a = 6\n    b = 7\n    return a * b\n"
    assert nogold.skip == "no_gold"  # "hi there": no answer to extract
    assert loop.skip == "program_form"


def test_pot_from_print_program_forms() -> None:
    assert pot_from_print_program("def solution():\n    return 3\n") == "def solution():\n    return 3\n"
    assert pot_from_print_program("x = 2\n\nprint(x + 1)") == "def solution():\n    x = 2\n\n    return x + 1\n"
    assert pot_from_print_program("print(1, 2)") is None and pot_from_print_program("def (") is None
    assert number_text(3431580.0) == "3431580" and number_text(0.5) == "0.5" and number_text(float("nan")) is None
    assert number_text(True) is None and number_text(" 7 ") == "7"


def test_generic_adapter_maps_fields(tmp_path: Path) -> None:
    rows = [{"prompt": "What is 1 + 1?", "gold": 2, "sol": "1 + 1 = 2, so \\boxed{2}."},
            {"prompt": "What is 2 + 2?", "sol": "It is \\boxed{4}."},
            {"prompt": "What is 3 + 3?"}]
    f = _jsonl(tmp_path / "g.jsonl", rows)
    kept, rep = _convert(_spec(f, "generic", fields={"question": "prompt", "answer": "gold", "cot": "sol"}), role="rl")
    assert [(r["question"], r["answer"], r["format"]) for r in kept] == [("What is 1 + 1?", "2", "cot"),
                                                                        ("What is 2 + 2?", "4", "cot")]
    assert rep["skipped"] == {"no_gold": 1}


def test_sources_jsonl_parquet_dir_save_to_disk_and_hub_id(tmp_path: Path) -> None:
    import datasets

    rows = [{"question": f"Q{i}?", "answer": f"{i} + 0 = {i}\n#### {i}"} for i in range(5)]
    f = _jsonl(tmp_path / "a.jsonl", rows)
    assert list(read_source(f)) == rows and list(read_source(f, limit=2)) == rows[:2]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    assert list(read_source(tmp_path / "p.parquet")) == rows
    (tmp_path / "dir").mkdir()
    _jsonl(tmp_path / "dir" / "1.jsonl", rows[:2])
    _jsonl(tmp_path / "dir" / "2.jsonl", rows[2:])
    assert list(read_source(tmp_path / "dir")) == rows
    ds.save_to_disk(str(tmp_path / "saved"))
    assert list(read_source(tmp_path / "saved")) == rows
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(PipelineError, match="give the split's directory"):
        list(read_source(tmp_path / "dd"))
    assert list(read_source(tmp_path / "dd" / "train")) == rows
    # the hub code path: datasets.load_dataset(id, config, split=, revision=) on a local dataset directory
    hub = {"id": str(tmp_path / "dir"), "config": None, "split": "train", "revision": None}
    assert list(read_source("unused", hub=hub)) == rows
    with pytest.raises(PipelineError, match="cannot load"):
        list(read_source("unused", hub={**hub, "id": str(tmp_path / "absent")}))
    with pytest.raises(PipelineError, match="data set not found"):
        list(read_source(tmp_path / "absent.jsonl"))


def test_convert_checks_programs_and_counts_skips(tmp_path: Path) -> None:
    kept, rep = _convert(_spec(_jsonl(tmp_path / "pal.jsonl", PAL), "pal"), role=None)
    assert [r["answer"] for r in kept] == ["13"]
    assert rep["rows_in"] == 4 and rep["rows_out"] == 1 and rep["by_format"] == {"pot": 1}
    assert rep["skipped"] == {"no_gold": 1, "program_failed": 1, "program_wrong": 1}
    assert rep["programs"]["run"] == 3 and rep["programs"]["ok"] == 1
    assert rep["skip_samples"]["program_wrong"][0]["detail"] == "returned '1', gold '2'"


def test_convert_instruct_gold_from_program_and_match(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "mi.jsonl", INSTRUCT)
    kept, rep = _convert(_spec(f, "instruct"))
    by = {r["question"]: r for r in kept}
    assert by["What is 6 * 7?"]["answer"] == "42" and rep["programs"]["gold_from_program"] == 1
    assert rep["skipped"].get("program_form") == 1
    kept, rep = _convert(_spec(f, "instruct", match={"source": "CoT/gsm"}), role="rl")
    assert [r["question"] for r in kept] == ["What is 2 + 3?"] and rep["filtered_out"] == 3


def test_round_trip_skips_training_rows_but_keeps_test_rows(tmp_path: Path) -> None:
    rows = [{"problem": "P?", "solution": "So it is $\\boxed{5}$.", "answer": "6"},   # solution disagrees
            {"problem": "Q?", "solution": "So it is $\\boxed{6}$.", "answer": "6"}]
    f = _jsonl(tmp_path / "m.jsonl", rows)
    kept, rep = _convert(_spec(f, "math"), role="sft")
    assert len(kept) == 1 and rep["skipped"] == {"response_gold_mismatch": 1}
    assert rep["round_trip"] == {**rep["round_trip"], "checked": 2, "ok": 1, "rate": 0.5}
    kept, rep = _convert(_spec(f, "math"), role=None)
    assert len(kept) == 2 and rep["round_trip"]["failures_kept"] and rep["skipped"] == {}


def test_sft_rows_need_a_solution_and_an_empty_result_is_an_error(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "m.jsonl", [{"problem": "P?", "answer": "6"}])
    kept, _ = _convert(_spec(f, "math"), role="rl")
    assert kept[0]["answer"] == "6" and "cot" not in kept[0]  # absent formats are left out of the row
    with pytest.raises(PipelineError, match="no row .* was kept"):
        _convert(_spec(f, "math"), role="sft")


def test_ingested_rows_load_as_problems_and_rows(tmp_path: Path) -> None:
    kept, _ = _convert(_spec(_jsonl(tmp_path / "m.jsonl", MATH[:2]), "math"), role=None)
    out = _jsonl(tmp_path / "out" / "math.jsonl", kept) if (tmp_path / "out").mkdir() is None else None
    probs = load_problem_file(tmp_path / "out")
    assert [(p.benchmark, p.gold, p.difficulty) for p in probs] == [("math", "\\frac{3}{4}", 2), ("math", "9", None)]
    assert load_rows(out)[0]["cot"] == MATH[0]["solution"]

"""Decontamination: the n-gram rules (the paper's one-n-gram rule and the containment rule), GSM8K calculator
stripping, and the real-text protocol (planted benchmark problems, clean real pages, GSM8K / MATH train). Reading
the benchmark files (missing file, bad rows): tests/core/test_problems.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.core.problems import strip_calculator
from stages.corpus.decontaminate import BenchmarkItem, ContaminationIndex, decontaminate, load_benchmarks

BENCH = {"toy": [
    BenchmarkItem("q1", "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
                  "Natalia sold 48/2 = 24 clips in May. Altogether she sold 48+24 = 72 clips."),
    BenchmarkItem("q2", "Compute $\\dbinom{8}{4}$."),
    BenchmarkItem("q3", "Solve it."),  # 2 grams: too short to match whole
]}


def test_ten_gram_rule_with_case_space_quotes_and_dollars() -> None:
    pages = [
        {"id": "a", "text": 'Forum: "NATALIA   sold clips to 48 of her\nfriends in April" -- any idea?'},
        {"id": "b", "text": "Natalia sold clips to 48 of her friends."},  # 8 grams only
        {"id": "c", "text": "solution: natalia sold 48 / 2 = 24 clips in may, ALTOGETHER she sold"},
        {"id": "d", "text": "Homework: compute \u201c\\dbinom{8}{4}\u201d please"},
        {"id": "e", "text": "Solve it. Compute 8 choose 4."},
    ]
    res = decontaminate(pages, BENCH, n=10)
    assert [p["id"] for p in res.kept] == ["b", "e"]
    assert [(p["id"], b, i) for p, b, i in res.removed] == [("a", "toy", "q1"), ("c", "toy", "q1"), ("d", "toy", "q2")]
    assert res.counts() == {"toy": 3}


def test_strings_callables_and_prebuilt_index() -> None:
    index = ContaminationIndex(BENCH, 10)
    res = decontaminate(["x compute dbinom 8 4 y", "clean text"], index)
    assert res.kept == ["clean text"] and res.removed[0][1:] == ("toy", "q2")
    rows = [{"question": "Compute $\\dbinom{8}{4}$ now", "cot": ""}]
    assert decontaminate(rows, index, text=lambda r: r["question"]).removed


def test_gsm8k_calculator_annotations_are_stripped(tmp_path: Path) -> None:
    f = tmp_path / "gsm8k.jsonl"
    f.write_text(json.dumps({"question": "Q?", "answer": "She sold 48/2 = <<48/2=24>>24 clips in May so she sold 48+24 = <<48+24=72>>72 clips.\n#### 72"}) + "\n")
    item = load_benchmarks(gsm8k=f)["gsm8k"][0]
    assert "<<" not in item.solution
    res = decontaminate(["she sold 48/2 = 24 clips in May so she sold 48+24"], {"gsm8k": [item]}, n=10)
    assert res.removed


def test_containment_spares_stock_phrases_and_catches_copies(tmp_path: Path) -> None:
    q = ("Let $a,$ $b,$ $c$ be real numbers such that $a + b + c = 6$ and $ab + bc + ca = 9$. Express your answer in "
         "simplest radical form: what is the largest possible value of $a$?")
    bench = {"math": [BenchmarkItem("m1", q, "Since the numbers are real, we use Cauchy and find $\\boxed{4}$.")]}
    stock = "A forum answer. Express your answer in simplest radical form: what is the largest value here? Thanks."
    copy = f"Homework: {q.upper()} Any hints?"
    assert [p for p, _, _ in decontaminate([stock, copy], bench, n=10, min_overlap=0.0).removed] == [stock, copy]
    res = decontaminate([stock, copy], bench, n=10, min_overlap=0.7)
    assert res.kept == [stock] and [p for p, _, _ in res.removed] == [copy]
    index = ContaminationIndex(bench, 10, min_overlap=0.7)
    assert index.overlap(copy) == ("math", "m1", 1.0) and index.overlap(stock) is None
    # the testsets stage's files, each a benchmark named by its stem
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "gsm8k.jsonl").write_text(json.dumps({"id": "g0", "question": "Q one two three?",
                                                               "answer": "3", "benchmark": "gsm8k", "cot": "x"}) + "\n")
    (tmp_path / "sets" / "math500.jsonl").write_text(json.dumps({"id": "m0", "question": "P?", "answer": "1"}) + "\n")
    loaded = load_benchmarks(testsets=tmp_path / "sets")
    assert sorted(loaded) == ["gsm8k", "math500"] and loaded["gsm8k"][0] == BenchmarkItem("g0", "Q one two three?", "x")


@pytest.mark.slow  # 31 s over the real benchmark files; .ci/slow robustness
def test_planted_benchmark_problems_in_real_pages(shared_data: Path) -> None:
    """The real-mode rule (10-grams, min_overlap 0.7; benchmarks/decontam.py chose it on half A of the web sample)
    on the held-out half B: >= 99% of GSM8K test questions and MATH-500 problems planted into its pages (varied
    whitespace, case, `$` and quotes; 30% with their solution) removed, <= 1% of its clean pages removed; of GSM8K
    train <= 1%; of MATH train, the rows removed that are not near-duplicates of a MATH test problem (word-3-gram
    Jaccard >= 0.5) <= 1%. The paper's literal rule (min_overlap 0) removes ~8% of the clean math pages."""
    from benchmarks.decontam import half_of, near_duplicates, planted_pages

    def rows(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.open()]
    bench = load_benchmarks(gsm8k=shared_data / "gsm8k" / "test.jsonl", math=shared_data / "math" / "test.jsonl")
    assert len(bench["gsm8k"]) == 1319 and len(bench["math"]) == 5000
    index = ContaminationIndex(bench, 10, min_overlap=0.7)
    web_b = [r for r in rows(shared_data / "web_corpus" / "math_vs_other.jsonl") if half_of(r) == "B"]
    math500 = {json.loads(x)["unique_id"] for x in (shared_data / "math" / "math500_test.jsonl").open()}
    items = [("gsm8k", it) for it in bench["gsm8k"]] + [("math", it) for it in bench["math"] if it.id in math500]
    planted = planted_pages([r["text"] for r in web_b], items, seed=1)
    recall = sum(index.match(page) is not None for _, page in planted) / len(planted)
    clean = sum(index.match(r["text"]) is not None for r in web_b) / len(web_b)
    gsm_train = rows(shared_data / "gsm8k" / "train.jsonl")
    gsm_fp = sum(index.match(f"{r['question']}\n{strip_calculator(r['answer'])}") is not None for r in gsm_train)
    math_train = rows(shared_data / "math" / "train.jsonl")
    near, _ = near_duplicates(math_train, rows(shared_data / "math" / "test.jsonl"))
    removed = [i for i, r in enumerate(math_train) if index.match(f"{r['problem']}\n{r['solution'] or ''}")]
    rest = [i for i in removed if i not in near]
    print(f"planted recall {recall:.4f} of {len(planted)}; clean pages removed {clean:.4f} of {len(web_b)}; GSM8K train "
          f"{gsm_fp}/{len(gsm_train)}; MATH train {len(removed)} removed, {len(removed) - len(rest)} near-duplicates, "
          f"rest {len(rest)}")
    assert recall >= 0.99 and clean <= 0.01
    assert gsm_fp / len(gsm_train) <= 0.01 and len(rest) / len(math_train) <= 0.01
    paper = ContaminationIndex(bench, 10)  # the literal rule, for contrast
    assert sum(paper.match(r["text"]) is not None for r in web_b if r["label"] == "math") > 0.05 * sum(
        r["label"] == "math" for r in web_b)

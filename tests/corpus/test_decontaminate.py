"""Decontamination: the n-gram rules, GSM8K calculator stripping, and the planted test on real text
(every GSM8K test question and the 500 MATH-500 problems planted into real pages). Reading the benchmark
files (missing file, bad rows): tests/core/test_problems.py."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

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


def _vary(rng: random.Random, text: str) -> str:
    """The planted copy: varied case, whitespace, `$` and quotes."""
    r = rng.random()
    text = text.upper() if r < 0.25 else text.lower() if r < 0.5 else text
    text = re.sub(" ", lambda _: rng.choice([" ", "  ", "\n", "\t", " \n "]), text)
    r = rng.random()
    text = text.replace("$", "") if r < 0.3 else re.sub(r"\b(\d+)\b", r"$\1$", text) if r < 0.5 else text
    text = text.replace("'", "\u2019") if rng.random() < 0.5 else text
    return rng.choice(['"{}"', "\u201c{}\u201d", "'{}'", "{}", "Q: {}"]).format(text)


def test_planted_benchmark_problems_in_real_pages(shared_data: Path) -> None:
    """Every GSM8K test question and the 500 MATH-500 problems, planted into real pages with varied
    whitespace, case, `$` and quotes: >= 99% of planted pages removed. Clean pages removed: < 1% of the
    web sample and GSM8K train text. MATH train text is reported, not held to 1%: it shares 10-grams
    with MATH test problems (near-duplicate problems of the same competitions, and stock phrases such
    as "express your answer as a decimal to the nearest tenth"), so the paper's rule removes ~10% of it."""
    rng = random.Random(0)
    bench = load_benchmarks(gsm8k=shared_data / "gsm8k" / "test.jsonl", math=shared_data / "math" / "math500_test.jsonl")
    assert len(bench["gsm8k"]) == 1319 and len(bench["math"]) == 500
    index = ContaminationIndex(bench, 10)

    def rows(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.open()]
    clean = [("web", r["text"]) for r in rows(shared_data / "web_corpus" / "math_vs_other.jsonl")]
    clean += [("gsm8k_train", f"{r['question']}\n{r['answer']}") for r in rows(shared_data / "gsm8k" / "train.jsonl")]
    clean += [("math_train", f"{r['problem']}\n{r['solution'] or ''}") for r in rows(shared_data / "math" / "train.jsonl")]
    planted = []
    for name, items in bench.items():
        for item in items:
            host = rng.choice(clean)[1].split("\n\n")
            host.insert(rng.randint(0, len(host)), _vary(rng, item.question))
            planted.append(("planted", "\n\n".join(host), name, item.id))
    res = decontaminate([(s, t) for s, t in clean] + [(s, t) for s, t, _, _ in planted], index, text=lambda p: p[1])
    removed = Counter(p[0] for p, _, _ in res.removed)
    sizes = Counter(s for s, _ in clean)
    recall = removed["planted"] / len(planted)
    fp = {s: removed[s] / sizes[s] for s in sizes}
    print(f"planted removed {recall:.4f} of {len(planted)}; clean removed {fp}")
    assert recall >= 0.99
    assert (removed["web"] + removed["gsm8k_train"]) / (sizes["web"] + sizes["gsm8k_train"]) < 0.01
    assert fp["math_train"] < 0.15

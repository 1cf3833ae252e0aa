"""Decontamination on real text: the paper's single-10-gram rule against the containment rule
(stages/corpus/decontaminate.py), with the protocol of issue 16.

    python benchmarks/decontam.py [--quick]

Benchmarks: GSM8K test (1,319: question and solution, calculator annotations stripped) and MATH test (5,000:
problem and solution), read by ``load_benchmarks``. Texts checked:

- the real web sample (../shared/data/web_corpus/math_vs_other.jsonl), split in two halves by url (pages without a
  url by their text): sha1 parity. Half A chooses the rule's constant (``min_overlap``, for n = 10), half B reports;
- planted pages: every benchmark question (30%: followed by its solution), with varied case, whitespace, ``$`` and
  quotes, inserted between two paragraphs of a page drawn from the half; recall = share of planted pages removed;
- GSM8K train (question + solution) and MATH train (problem + solution), the texts an SFT set is made of. MATH
  train rows removed are split into near-duplicates of a test problem (Jaccard >= 0.5 of the word-3-gram sets of
  the two problem statements, grams as the index's) and the rest.

Writes benchmarks/results/decontam.json (the grid on half A, the held-out figures on half B and on the train sets
for the paper's rule and the chosen one, samples of removed MATH train rows) and prints a table. ``--quick``: a
1,000-item sample of the benchmarks for planting, the grid on three values.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages.core.problems import strip_calculator  # noqa: E402
from stages.core.text import grams, ngrams  # noqa: E402
from stages.corpus.decontaminate import BenchmarkItem, ContaminationIndex, load_benchmarks  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))
N = 10
CHOSEN = 0.7
GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def _rows(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def half_of(row: dict[str, Any]) -> str:
    """``A`` or ``B``: sha1 parity of the url (of the text when the page has none); rows sharing a url share a half."""
    key = row.get("url") or row["text"]
    return "AB"[int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % 2]


def vary(rng: random.Random, text: str) -> str:
    """A planted copy: varied case, whitespace, ``$`` around numbers or none, and quotes."""
    r = rng.random()
    text = text.upper() if r < 0.25 else text.lower() if r < 0.5 else text
    text = re.sub(" ", lambda _: rng.choice([" ", "  ", "\n", "\t", " \n "]), text)
    r = rng.random()
    text = text.replace("$", "") if r < 0.3 else re.sub(r"\b(\d+)\b", r"$\1$", text) if r < 0.5 else text
    return rng.choice(['"{}"', "\u201c{}\u201d", "'{}'", "{}", "Q: {}"]).format(text)


def planted_pages(hosts: list[str], items: list[tuple[str, BenchmarkItem]], seed: int) -> list[tuple[str, str]]:
    """(benchmark, page) for every item: its question (30%: and solution) planted into a random host page."""
    rng = random.Random(seed)
    out = []
    for bench, item in items:
        paras = rng.choice(hosts).split("\n\n")
        text = vary(rng, item.question)
        if item.solution and rng.random() < 0.3:
            text += "\n" + vary(rng, item.solution)
        paras.insert(rng.randint(0, len(paras)), text)
        out.append((bench, "\n\n".join(paras)))
    return out


def near_duplicates(train: list[dict[str, Any]], test: list[dict[str, Any]], threshold: float = 0.5
                    ) -> tuple[set[int], list[float]]:
    """MATH train rows whose problem has a word-3-gram Jaccard >= threshold with some test problem, and each row's
    best Jaccard."""
    test_sets = [set(ngrams(grams(r["problem"]), 3)) for r in test]
    inv: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for j, s in enumerate(test_sets):
        for g in s:
            inv[g].append(j)
    best = []
    for r in train:
        s = set(ngrams(grams(r["problem"]), 3))
        shared: Counter[int] = Counter()
        for g in s:
            shared.update(inv.get(g, ()))
        best.append(max((k / len(s | test_sets[j]) for j, k in shared.items()), default=0.0))
    return {i for i, b in enumerate(best) if b >= threshold}, best


def measure(index: ContaminationIndex, web: dict[str, list[dict[str, Any]]], planted: dict[str, list[tuple[str, str]]],
            halves: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for h in halves:
        res: dict[str, Any] = {}
        for label in ("math", "other"):
            pages = [r for r in web[h] if r["label"] == label]
            removed = sum(index.match(r["text"]) is not None for r in pages)
            res[f"clean_{label}_pages"] = len(pages)
            res[f"clean_{label}_removed"] = removed
            res[f"clean_{label}_removed_frac"] = round(removed / len(pages), 4)
        tot, rec = Counter(), Counter()
        for bench, page in planted[h]:
            tot[bench] += 1
            rec[bench] += index.match(page) is not None
        res["planted"] = dict(tot)
        res["planted_recall"] = {b: round(rec[b] / tot[b], 4) for b in tot}
        res["planted_recall_all"] = round(sum(rec.values()) / sum(tot.values()), 4)
        out[h] = res
    return out


def train_sets(index: ContaminationIndex, gsm_train: list[dict[str, Any]], math_train: list[dict[str, Any]],
               near: set[int], best_j: list[float], samples: int = 0, seed: int = 0) -> dict[str, Any]:
    g_removed = sum(index.match(f"{r['question']}\n{strip_calculator(r['answer'])}") is not None for r in gsm_train)
    hits = []
    for i, r in enumerate(math_train):
        hit = index.overlap(f"{r['problem']}\n{r['solution'] or ''}")
        if hit is not None:
            hits.append((i, hit))
    nd = sum(1 for i, _ in hits if i in near)
    rest = [(i, h) for i, h in hits if i not in near]
    out: dict[str, Any] = {
        "gsm8k_train": {"rows": len(gsm_train), "removed": g_removed, "removed_frac": round(g_removed / len(gsm_train), 4)},
        "math_train": {"rows": len(math_train), "removed": len(hits), "near_duplicates_removed": nd,
                       "near_duplicates_total": len(near), "rest_removed": len(rest),
                       "rest_removed_frac": round(len(rest) / len(math_train), 4)},
    }
    if samples:
        rng = random.Random(seed)
        out["math_train"]["samples_rest"] = [
            {"train": math_train[i]["unique_id"], "train_problem": math_train[i]["problem"][:300], "test": h[1],
             "overlap": None if h[2] is None else round(h[2], 3), "jaccard3": round(best_j[i], 3)}
            for i, h in rng.sample(rest, min(samples, len(rest)))]
        nds = [(i, h) for i, h in hits if i in near]
        out["math_train"]["samples_near_duplicates"] = [
            {"train": math_train[i]["unique_id"], "train_problem": math_train[i]["problem"][:300], "test": h[1],
             "jaccard3": round(best_j[i], 3)} for i, h in rng.sample(nds, min(samples, len(nds)))]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 planted items, three grid values")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not (SHARED / "README.md").is_file():
        print(f"real data not found at {SHARED}; set SHARED_DATA", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    bench = load_benchmarks(gsm8k=SHARED / "gsm8k" / "test.jsonl", math=SHARED / "math" / "test.jsonl")
    items = [(b, it) for b, its in bench.items() for it in its]
    if args.quick:
        items = random.Random(args.seed).sample(items, 1000)
    web_rows = _rows(SHARED / "web_corpus" / "math_vs_other.jsonl")
    web = {h: [r for r in web_rows if half_of(r) == h] for h in "AB"}
    planted = {h: planted_pages([r["text"] for r in web[h]], items, args.seed + i) for i, h in enumerate("AB")}
    gsm_train = _rows(SHARED / "gsm8k" / "train.jsonl")
    math_train = _rows(SHARED / "math" / "train.jsonl")
    near, best_j = near_duplicates(math_train, _rows(SHARED / "math" / "test.jsonl"))

    grid = []
    for theta in ((0.0, 0.5, CHOSEN) if args.quick else GRID):
        index = ContaminationIndex(bench, N, min_short=3, min_overlap=theta)
        row = {"min_overlap": theta, **measure(index, web, planted, ("A",))["A"],
               **train_sets(index, gsm_train, math_train, near, best_j)}
        grid.append(row)
        print(f"A  min_overlap {theta:.1f}: clean math pages removed {row['clean_math_removed']}/{row['clean_math_pages']}, "
              f"planted recall {row['planted_recall']}, MATH train rest {row['math_train']['rest_removed']}", flush=True)
    heldout = {}
    for name, theta in (("paper", 0.0), ("chosen", CHOSEN)):
        index = ContaminationIndex(bench, N, min_short=3, min_overlap=theta)
        heldout[name] = {"min_overlap": theta, **measure(index, web, planted, ("B",))["B"],
                         **train_sets(index, gsm_train, math_train, near, best_j, samples=10, seed=args.seed)}
    result = {
        "n": N, "min_short": 3, "chosen_min_overlap": CHOSEN,
        "split": {h: {"pages": len(web[h]), "urls": len({r.get('url') or r['text'] for r in web[h]})} for h in "AB"},
        "benchmarks": {b: len(v) for b, v in bench.items()}, "planted_items": len(items),
        "grid_half_A": grid, "heldout_half_B": heldout,
        "wall_s": round(time.perf_counter() - t0, 1), "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()], "quick": args.quick,
    }
    out = ROOT / "benchmarks" / "results" / "decontam.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("\nheld-out half B and train sets:")
    print("| rule | clean math pages removed | clean other removed | planted recall | GSM8K train removed | "
          "MATH train removed | near-dup | rest |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in heldout.items():
        m = r["math_train"]
        print(f"| {name} ({r['min_overlap']}) | {r['clean_math_removed']}/{r['clean_math_pages']} | "
              f"{r['clean_other_removed']}/{r['clean_other_pages']} | {r['planted_recall_all']} {r['planted_recall']} | "
              f"{r['gsm8k_train']['removed']}/{r['gsm8k_train']['rows']} | {m['removed']}/{m['rows']} | "
              f"{m['near_duplicates_removed']}/{m['near_duplicates_total']} | {m['rest_removed']} ({m['rest_removed_frac']:.2%}) |")
    print(f"wrote {out.relative_to(ROOT)} in {result['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

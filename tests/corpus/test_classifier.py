"""The fastText classifier: determinism, save/load, NumPy 2, errors, and F1 on real web text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from stages.core.errors import PipelineError
from stages.corpus.classifier import MathClassifier, f1_report, train_classifier
from stages.params import ClassifierParams, resolve

ROOT = Path(__file__).resolve().parents[2]
MATH = ["Let $x^2 + {a}x = {b}$. Then the derivative is $2x + {a}$ and the proof follows.",
        "Problem {a}. Tom has {b} apples. He buys {a} more apples. Solution: {b} + {a} = {c}. The answer is \\boxed{{{c}}}.",
        "Definition. A prime $p > {a}$ divides $n$ when $n \\equiv 0 \\pmod{{p}}$. Theorem {b}."]
OTHER = ["Preheat the oven to {a}0 degrees and bake for {b} minutes. Serves {c}.",
         "The Tigers beat the Lions {a}-{b} in front of {c}00 fans on Saturday.",
         "The jacket costs {c} dollars, down {a}% this week. Free shipping over {b} dollars."]


def _texts(pool: list[str], n: int, rng: random.Random) -> list[str]:
    return [rng.choice(pool).format(a=rng.randint(1, 9), b=rng.randint(10, 99), c=rng.randint(100, 999)) for _ in range(n)]


def _default_kwargs() -> dict:
    c = ClassifierParams(**resolve(ROOT / "params.yaml")["corpus"]["classifier"])
    return dict(dim=c.dim, lr=c.lr, word_ngrams=c.word_ngrams, min_count=c.min_count, epochs=c.epochs,
                bucket=c.bucket, thread=c.thread)


def test_deterministic_separates_and_roundtrips(tmp_path: Path) -> None:
    assert int(np.__version__.split(".")[0]) >= 2  # predict is only ever called on lists (NumPy 2 safe)
    rng = random.Random(0)
    pos, neg = _texts(MATH, 300, rng), _texts(OTHER, 300, rng)
    test = _texts(MATH, 50, rng) + _texts(OTHER, 50, rng)
    scores = []
    for _ in range(3):  # PyPI fasttext 0.9.3 fails this: it trains on uninitialised memory when thread < 10
        clf = train_classifier(pos, neg, seed=0, **_default_kwargs())
        scores.append(clf.score(test))
    assert all(np.array_equal(scores[0], s) for s in scores[1:])
    s = scores[0]
    assert s.dtype == np.float32 and ((s >= 0) & (s <= 1)).all()
    assert f1_report(s, np.array([True] * 50 + [False] * 50))["f1"] >= 0.95
    clf.save(tmp_path / "m.bin")
    assert np.array_equal(MathClassifier.load(tmp_path / "m.bin").score(test), s)
    assert len(clf.score([])) == 0 and clf.score(["multi\nline\ntext"]).shape == (1,)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="positives and negatives"):
        train_classifier(["a b c"] * 5, [], min_count=1)
    with pytest.raises(PipelineError, match="not found"):
        MathClassifier.load(tmp_path / "missing.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a model")
    with pytest.raises(PipelineError):
        MathClassifier.load(tmp_path / "junk.bin")


def test_f1_on_real_web_text_split_by_url(shared_data: Path) -> None:
    """The default classifier settings on ../shared/data/web_corpus/math_vs_other.jsonl: a quarter of the
    urls held out (rows without a url are their own group), trained on the rest."""
    rows = [json.loads(line) for line in (shared_data / "web_corpus" / "math_vs_other.jsonl").open()]
    groups = sorted({r["url"] or f"row-{i}" for i, r in enumerate(rows)})
    random.Random(0).shuffle(groups)
    held = set(groups[: len(groups) // 4])
    key = [r["url"] or f"row-{i}" for i, r in enumerate(rows)]
    train = [r for r, k in zip(rows, key, strict=True) if k not in held]
    test = [r for r, k in zip(rows, key, strict=True) if k in held]
    clf = train_classifier([r["text"] for r in train if r["label"] == "math"],
                           [r["text"] for r in train if r["label"] == "other"], seed=0, **_default_kwargs())
    rep = f1_report(clf.score([r["text"] for r in test]), np.array([r["label"] == "math" for r in test]))
    print(f"real web text, held-out urls: {rep}")
    assert rep["f1"] >= 0.9

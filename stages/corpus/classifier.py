"""The fastText math classifier (DeepSeekMath section 2.1).

Positives are seed-corpus pages (plus, in later rounds, pages added by domain discovery), negatives
are crawl pages sampled at random. Paper settings: dim 256, lr 0.1, word n-grams 3, min count 3,
3 epochs. Text is normalised the same way for training and scoring
(:func:`stages.core.text.normalize_for_classifier`: NFKC, lower case, one line, math symbols kept
as tokens). ``predict`` is only ever called on lists: its single-string path calls
``np.array(..., copy=False)``, which NumPy 2 rejects.

Library use::

    from stages.corpus.classifier import train_classifier, MathClassifier
    clf = train_classifier(math_texts, other_texts, dim=64, bucket=200_000)
    clf.score(["Let $x^2 = 4$ ...", "Preheat the oven ..."])   # P(math) per text
    clf.save("classifier.bin"); MathClassifier.load("classifier.bin")
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import fasttext
import numpy as np

from stages.core.errors import PipelineError
from stages.core.io import atomic_path
from stages.core.text import normalize_for_classifier

MATH = "__label__math"
OTHER = "__label__other"

normalize = normalize_for_classifier


class MathClassifier:
    """A trained fastText model with a batch ``score`` (probability of math)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MathClassifier:
        p = Path(path)
        if not p.is_file():
            raise PipelineError(f"{p}: classifier not found; run the corpus stage or fix the path")
        try:
            return cls(fasttext.load_model(str(p)))
        except ValueError as e:
            raise PipelineError(f"{p}: not a fastText model ({e})") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model atomically."""
        with atomic_path(path) as tmp:
            self.model.save_model(str(tmp))

    def score(self, texts: Sequence[str], *, normalized: bool = False, batch_size: int = 4096) -> np.ndarray:
        """P(math) for each text, as float32 (texts are normalised first unless ``normalized``)."""
        out = np.empty(len(texts), dtype=np.float32)
        for i in range(0, len(texts), batch_size):
            chunk = list(texts[i:i + batch_size])
            if not normalized:
                chunk = [normalize(t) for t in chunk]
            labels, probs = self.model.predict(chunk, k=1)  # a list: safe under NumPy 2
            # two labels under softmax: P(math) = 1 - P(other) when "other" ranks first
            out[i:i + len(chunk)] = [pr[0] if lab[0] == MATH else 1.0 - pr[0] for lab, pr in zip(labels, probs, strict=True)]
        return np.clip(out, 0.0, 1.0)


def write_training_file(path: str | os.PathLike[str], positives: Iterable[str], negatives: Iterable[str], *,
                        seed: int, normalized: bool = False) -> tuple[int, int]:
    """Write a fastText training file: labelled positives and negatives, randomly interleaved.

    Streams: each side goes to its own temporary file first, then the two are merged line by line
    in a random order, so memory stays flat however many pages there are. Returns (positives, negatives).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmps = []
    counts = []
    for label, texts in ((MATH, positives), (OTHER, negatives)):
        fd, name = tempfile.mkstemp(prefix=".ft-", suffix=".txt", dir=path.parent)
        n = 0
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for t in texts:
                line = t if normalized else normalize(t)
                if line:
                    f.write(f"{label} {line}\n")
                    n += 1
        tmps.append(name)
        counts.append(n)
    rng = random.Random(seed)
    try:
        with open(tmps[0], encoding="utf-8") as a, open(tmps[1], encoding="utf-8") as b, \
                open(path, "w", encoding="utf-8") as out:
            left = counts[:]
            while left[0] + left[1]:
                side = 0 if rng.random() * (left[0] + left[1]) < left[0] else 1
                out.write((a if side == 0 else b).readline())
                left[side] -= 1
    finally:
        for name in tmps:
            os.unlink(name)
    return counts[0], counts[1]


def train_file(path: str | os.PathLike[str], *, dim: int, lr: float, word_ngrams: int, min_count: int, epochs: int,
               bucket: int, thread: int, seed: int) -> MathClassifier:
    """Train on a fastText file of ``__label__math`` / ``__label__other`` lines."""
    try:
        model = fasttext.train_supervised(
            input=str(path), dim=dim, lr=lr, wordNgrams=word_ngrams, minCount=min_count, epoch=epochs,
            bucket=bucket, thread=thread, seed=seed, verbose=0, loss="softmax",
        )
    except (RuntimeError, ValueError) as e:
        raise PipelineError(f"fastText training failed on {path} ({e}); check the seed corpus and crawl are not empty") from None
    if set(model.get_labels()) != {MATH, OTHER}:
        raise PipelineError(f"fastText training data {path} lacks one class (labels {model.get_labels()}); "
                            "need both seed pages and crawl pages")
    return MathClassifier(model)


def train_classifier(positives: Iterable[str], negatives: Iterable[str], *, dim: int = 256, lr: float = 0.1,
                     word_ngrams: int = 3, min_count: int = 3, epochs: int = 3, bucket: int = 2_000_000,
                     thread: int = 1, seed: int = 0) -> MathClassifier:
    """Train a math classifier from raw texts (defaults: the paper's settings, fastText's bucket)."""
    with tempfile.TemporaryDirectory(prefix="mathclf-") as d:
        f = Path(d) / "train.txt"
        n_pos, n_neg = write_training_file(f, positives, negatives, seed=seed)
        if not n_pos or not n_neg:
            raise PipelineError(f"classifier training needs positives and negatives (got {n_pos} and {n_neg})")
        return train_file(f, dim=dim, lr=lr, word_ngrams=word_ngrams, min_count=min_count, epochs=epochs,
                          bucket=bucket, thread=thread, seed=seed)


def f1_report(scores: np.ndarray, truth: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """Precision, recall and F1 of ``scores >= threshold`` against boolean ``truth``."""
    pred = scores >= threshold
    tp = float(np.sum(pred & truth))
    p = tp / max(1.0, float(pred.sum()))
    r = tp / max(1.0, float(truth.sum()))
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(2 * p * r / max(1e-12, p + r), 4),
            "n": int(len(truth))}

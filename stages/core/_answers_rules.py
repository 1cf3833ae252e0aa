"""The DeepSeekMath equivalence rules as a three-valued combinator (no sympy here).

``compare(pred, gold, leaf)`` applies the reference rules (``eval_script.is_correct`` and
``eval_utils.math_equal``) to two *normalised* answers and asks ``leaf`` for the symbolic part. It is
run twice: in the main process with a leaf that always answers ``None`` ("cannot tell cheaply"), which
decides plain numbers, exact matches and structures whose parts all match; and, only when that pass
answers ``None``, in the checking worker with the sympy/math-verify leaf
(:mod:`stages.core._answers_symbolic`), which always answers True or False.

Three-valued logic: a rule gives True (equivalent), False (not, by this rule) or None (unknown);
the answer is True when any rule is True, False when every rule is False, else None.
"""

from __future__ import annotations

from collections.abc import Callable

from stages.core._answers_norm import (
    bracketed,
    dedupe,
    matrix_cells,
    numbers_close,
    split_answers,
    split_top_level,
)

Leaf = Callable[[str, str], "bool | None"]
MAX_ITEMS = 64
"""Most list items / tuple elements / matrix cells the in-process pass (leaf :func:`never`) compares."""


def _all3(results: list[bool | None]) -> bool | None:
    if any(r is False for r in results):
        return False
    return None if any(r is None for r in results) else True


def _match_lists(preds: list[str], golds: list[str], leaf: Leaf, pv: bool, depth: int) -> bool | None:
    """Unordered: every prediction matches some gold and every gold some prediction (reference
    ``is_correct`` on lists); different lengths (after de-duplication) never match."""
    preds, golds = dedupe(preds), dedupe(golds)
    if len(preds) != len(golds):
        return False
    if leaf is never and len(preds) > MAX_ITEMS:
        return None  # the in-process pass stays bounded (the table is quadratic): the worker decides, on a deadline
    table = [[compare(p, g, leaf, percent_variants=pv, _depth=depth + 1) for g in golds] for p in preds]
    pred_ok: list[bool | None] = []
    for row in table:
        pred_ok.append(True if any(r is True for r in row) else (None if any(r is None for r in row) else False))
    gold_ok: list[bool | None] = []
    for j in range(len(golds)):
        col = [table[i][j] for i in range(len(preds))]
        gold_ok.append(True if any(r is True for r in col) else (None if any(r is None for r in col) else False))
    return _all3(pred_ok + gold_ok)


def _elementwise(preds: list[str], golds: list[str], leaf: Leaf, pv: bool, depth: int) -> bool | None:
    if len(preds) != len(golds):
        return False
    if leaf is never and len(preds) > MAX_ITEMS:
        return None
    results: list[bool | None] = []
    for p, g in zip(preds, golds, strict=True):
        r = compare(p, g, leaf, percent_variants=pv, _depth=depth + 1)
        if r is False:
            return False
        results.append(r)
    return _all3(results)


def _rules(pred: str, gold: str, leaf: Leaf, pv: bool, depth: int):
    """Yield the rule results lazily, cheapest first (the caller stops at the first True)."""
    # Unions of intervals / sets: pieces matched as unordered lists.
    if "\\cup" in pred and "\\cup" in gold:
        yield _match_lists(pred.split("\\cup"), gold.split("\\cup"), leaf, pv, depth)
    # Tuples and intervals: same brackets, element-wise.
    bp, bg = bracketed(pred), bracketed(gold)
    if bp is not None and bg is not None:
        if bp[0] == bg[0] and bp[2] == bg[2]:
            yield _elementwise(split_top_level(bp[1], ","), split_top_level(bg[1], ","), leaf, pv, depth)
        else:
            yield False
    # Matrices: cell-wise.
    mp, mg = matrix_cells(pred), matrix_cells(gold)
    if mp is not None and mg is not None:
        if len(mp) == len(mg) and all(len(a) == len(b) for a, b in zip(mp, mg, strict=True)):
            yield _elementwise([c for r in mp for c in r], [c for r in mg for c in r], leaf, pv, depth)
        else:
            yield False
    # Several answers separated by commas (or \text{and}).
    sp, sg = split_answers(pred), split_answers(gold)
    if len(sp) > 1 or len(sg) > 1:
        yield _match_lists(sp, sg, leaf, pv, depth)
    # Equations: ``a=b`` vs ``c=d`` is a symbolic question (the leaf gets both); ``x=v`` with a
    # left-hand side of at most 2 characters against a bare value compares ``v``.
    np_, ng = pred.count("="), gold.count("=")
    if np_ == 1 and ng == 0 and len(pred.split("=")[0].strip()) <= 2:
        yield compare(pred.split("=")[1].strip(), gold, leaf, percent_variants=pv, _depth=depth + 1)
    elif ng == 1 and np_ == 0 and len(gold.split("=")[0].strip()) <= 2:
        yield compare(pred, gold.split("=")[1].strip(), leaf, percent_variants=pv, _depth=depth + 1)
    # The whole strings, symbolically.
    yield leaf(pred, gold)


def compare(pred: str, gold: str, leaf: Leaf, *, percent_variants: bool = True, _depth: int = 0) -> bool | None:
    """Three-valued DeepSeekMath equivalence of two normalised answers (see the module docstring)."""
    pred, gold = pred.strip(), gold.strip()
    if not pred or not gold:
        return False
    if pred == gold:
        return True
    numeric = numbers_close(pred, gold, percent_variants=percent_variants)
    if numeric is not None:
        return numeric
    if _depth > 4:
        return leaf(pred, gold)
    unknown = False
    for r in _rules(pred, gold, leaf, percent_variants, _depth):
        if r is True:
            return True
        if r is None:
            unknown = True
    return None if unknown else False


def never(pred: str, gold: str) -> bool | None:
    """The main-process leaf: symbolic questions cannot be answered cheaply."""
    return None

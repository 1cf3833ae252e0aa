"""The checker's case tables (tests/core/checker_cases.py) as markdown for docs/evaluation.md: issue 27's cases
before and after in both modes, and the hard cases of public suites with the verdict each source expects.

    python benchmarks/checker_cases.py                      # the tables, verdicts computed now
    python benchmarks/checker_cases.py --old > before.json  # run with PYTHONPATH set to a checkout of 939e700 (the
                                                            # checker before issue 27: is_equivalent, one mode)
    python benchmarks/checker_cases.py --before before.json # the tables with that "before" column

The old checker is asked what the old code asked: ``extract_answer`` for whole outputs, then ``is_equivalent`` with
the case's percent rule (benchmarks/results/checker_cases_before.json holds its answers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after PYTHONPATH: --old runs against an old checkout


def _old_verdicts() -> dict[str, str]:
    from stages.core.answers import extract_answer, is_equivalent
    from tests.core.checker_cases import HARD_CASES, ISSUE_CASES

    out = {}
    for c in ISSUE_CASES + HARD_CASES:
        pred = extract_answer(c.pred) if c.kind == "output" else c.pred
        gold = c.gold.strip("$") if c.id.startswith("H") else c.gold
        out[c.id] = "right" if is_equivalent(pred, gold, percent_variants=c.pv, timeout_s=5.0) else "wrong"
    return out


def _cell(s: str) -> str:
    s = s if len(s) <= 48 else s[:45] + "…"
    return "`" + s.replace("|", "\\|").replace("`", "'") + "`"


def tables(before: dict[str, str] | None) -> str:
    from tests.core.checker_cases import HARD_CASES, ISSUE_CASES

    lines = ["| case | what | prediction | gold | before | deepseekmath | strict |", "|---|---|---|---|---|---|---|"]
    for c in ISSUE_CASES:
        pred = c.pred if len(c.pred) < 60 else f"{len(c.pred):,} characters"
        lines.append(f"| {c.id} | {c.what.replace('|', chr(92) + '|')}{'' if c.pv else ' (percent rule off)'} | {_cell(pred)} | {_cell(c.gold)} | "
                     f"{(before or {}).get(c.id, '—')} | {c.deepseekmath} | {c.strict} |")
    lines += ["", "| case | what | source (repo, file) | prediction | gold | source says | deepseekmath | strict |",
              "|---|---|---|---|---|---|---|---|"]
    for c in HARD_CASES:
        lines.append(f"| {c.id} | {c.what.replace('|', chr(92) + '|')} | {c.source} | {_cell(c.pred)} | {_cell(c.gold)} | {c.source_verdict} | "
                     f"{c.deepseekmath} | {c.strict} |")
    agree = {m: sum(getattr(c, m) == c.source_verdict for c in HARD_CASES) for m in ("deepseekmath", "strict")}
    lines.append("")
    lines.append(f"Agreement with the sources' verdicts: deepseekmath {agree['deepseekmath']}/{len(HARD_CASES)}, "
                 f"strict {agree['strict']}/{len(HARD_CASES)}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", action="store_true", help="print the old checker's verdicts as JSON (old PYTHONPATH)")
    ap.add_argument("--before", type=Path, help="a JSON file of --old verdicts: the 'before' column")
    a = ap.parse_args()
    if a.old:
        print(json.dumps(_old_verdicts(), indent=1))
        return
    print(tables(json.loads(a.before.read_text()) if a.before else None))


if __name__ == "__main__":
    main()

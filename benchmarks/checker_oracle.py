"""Math-Verify's own test cases as an oracle for our answer checker (stages/core/answers.py).

    python benchmarks/checker_oracle.py --extract PATH_TO_MATH_VERIFY_CHECKOUT   # (re)write the case file
    python benchmarks/checker_oracle.py                                          # agreement per mode

``--extract`` reads every ``@pytest.mark.parametrize`` list of (gold, prediction, expected) in Math-Verify's
``tests/*.py`` (huggingface/Math-Verify, MIT licence) and the keyword arguments of the call each test makes
(``match_types``, ``precision``, ``strict``, ``allow_set_relation_comp``), and writes them with the source commit to
``tests/core/data/math_verify_cases.json`` (test data, not code; CI has no network, so the cases are committed).

The default run judges every case with our checker in each mode (:func:`judge_case`: the gold's last ``\\boxed{}``
or its ``$..$`` content as the gold answer; the prediction read as a model output by the mode's
:func:`~stages.core.answers.final_answers`), and with the installed math-verify under the case's own settings,
and prints the agreement with the expected verdicts per mode and per test file; ``--json`` writes
benchmarks/results/checker_oracle.json. ``tests/core/test_answers_oracle.py`` asserts the same figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES_FILE = ROOT / "tests" / "core" / "data" / "math_verify_cases.json"
RESULT = ROOT / "benchmarks" / "results" / "checker_oracle.json"


# ---------------------------------------------------------------------------------------------
# extraction from a Math-Verify checkout


def _kw(call: ast.Call, names: list[str], row: dict[str, Any]) -> dict[str, Any]:
    """The settings a test's compare_strings / verify call passes (literals, or parameters of the case)."""
    out: dict[str, Any] = {"match_types": ["latex", "expr"], "precision": 6, "strict": True,
                           "allow_set_relation_comp": False}
    for k in call.keywords:
        if k.arg in out:
            if isinstance(k.value, ast.Name) and k.value.id in names:
                out[k.arg] = row[k.value.id]
            else:
                try:
                    out[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    pass
    return out


def extract(repo: Path, commit: str | None = None) -> dict[str, Any]:
    """Every parametrized (gold, pred, expected) case of ``repo/tests/*.py`` with its settings."""
    cases: list[dict[str, Any]] = []
    for f in sorted((repo / "tests").glob("test_*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            for dec in fn.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                    continue
                names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
                if "gold" not in names or "pred" not in names:
                    continue
                expected_name = next((n for n in ("expected", "result") if n in names), None)
                calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)
                         and getattr(c.func, "id", getattr(c.func, "attr", "")) in ("compare_strings", "verify")]
                for elt in dec.args[1].elts:
                    try:
                        values = ast.literal_eval(elt)
                    except ValueError:
                        continue
                    row = dict(zip(names, values, strict=True))
                    settings = _kw(calls[0], names, row) if calls else {}
                    if not calls or getattr(calls[0].func, "id", "") == "verify":
                        settings = {"match_types": ["latex", "expr"], "precision": 6, "strict": True,
                                    "allow_set_relation_comp": False, "default_parse": True}
                    cases.append({"file": f"tests/{f.name}", "test": fn.name, "gold": row["gold"], "pred": row["pred"],
                                  "expected": int(row[expected_name]), **settings})
    commit = commit or subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip()
    return {"source": "https://github.com/huggingface/Math-Verify", "commit": commit or None,
            "license": "MIT, Copyright (c) 2024 The HuggingFace Team (the test cases are quoted as data)",
            "extracted_by": "benchmarks/checker_oracle.py --extract", "cases": cases}


# ---------------------------------------------------------------------------------------------
# judging


def gold_answer(gold: str) -> str:
    """A Math-Verify test's gold text as a gold answer: its ``\\boxed{}`` contents (several: joined as a list), else
    the text without its ``$..$`` / ``\\(..\\)`` wrapper."""
    from stages.core.answers import _boxed_contents

    boxed = _boxed_contents(gold)
    if boxed:
        return ", ".join(dict.fromkeys(boxed))
    g = gold.strip()
    for a, b in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if g.startswith(a) and g.endswith(b) and len(g) > len(a) + len(b):
            g = g[len(a) : -len(b)].strip()
    return g


def judge_case(case: dict[str, Any], mode: str, timeout_s: float = 5.0) -> str:
    """Our outcome on one case in ``mode``."""
    from stages.core.answers import check, final_answers

    return check(final_answers(case["pred"], "math", mode=mode), gold_answer(case["gold"]), mode=mode,
                 timeout_s=timeout_s)


def math_verify_own(case: dict[str, Any]) -> int:
    """The installed math-verify under the case's own settings (as its test calls it)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if case.get("default_parse"):
        return int(verify(parse(case["gold"]), parse(case["pred"])))
    targets = []
    for t in case["match_types"]:
        targets.append(LatexExtractionConfig(boxed_match_priority=0) if t == "latex" else ExprExtractionConfig())
    g, p = parse(case["gold"], targets), parse(case["pred"], targets)
    return int(verify(g, p, float_rounding=case["precision"], strict=case["strict"],
                      allow_set_relation_comp=case["allow_set_relation_comp"]))


def agreement(cases: list[dict[str, Any]], modes: tuple[str, ...] = ("deepseekmath", "strict")) -> dict[str, Any]:
    """Our verdicts against the cases' expected ones, per mode (and math-verify's own, as a check of the harness)."""
    from stages.core.answers import check_many, final_answers

    golds = [gold_answer(c["gold"]) for c in cases]
    out: dict[str, Any] = {"n": len(cases), "modes": {}, "per_file": {}, "disagreements": {}}
    for mode in modes:
        got = check_many([final_answers(c["pred"], "math", mode=mode) for c in cases], golds, mode=mode, timeout_s=5.0)
        ok = [int(o == "right") == c["expected"] for o, c in zip(got, cases, strict=True)]
        out["modes"][mode] = {"agree": sum(ok), "rate": round(sum(ok) / len(cases), 4),
                              "timeouts": got.count("timeout")}
        for c, a in zip(cases, ok, strict=True):
            pf = out["per_file"].setdefault(c["file"], {"n": 0})
            pf["n"] += 0 if mode != modes[0] else 1
            pf[mode] = pf.get(mode, 0) + int(a)
        out["disagreements"][mode] = [{"gold": c["gold"], "pred": c["pred"], "expected": c["expected"], "ours": o}
                                      for c, o, a in zip(cases, got, ok, strict=True) if not a]
    mv = []
    for c in cases:
        try:
            mv.append(math_verify_own(c) == c["expected"])
        except Exception:  # noqa: BLE001 - an error in math-verify counts as a disagreement
            mv.append(False)
    out["modes"]["math_verify_installed"] = {"agree": sum(mv), "rate": round(sum(mv) / len(cases), 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extract", type=Path, help="a Math-Verify checkout: (re)write the case file from its tests")
    ap.add_argument("--commit", help="the checkout's commit, when it is not a git work tree (an archive)")
    ap.add_argument("--json", action="store_true", help=f"write {RESULT.relative_to(ROOT)}")
    a = ap.parse_args()
    if a.extract:
        data = extract(a.extract, a.commit)
        CASES_FILE.parent.mkdir(parents=True, exist_ok=True)
        CASES_FILE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{len(data['cases'])} cases from {a.extract} ({data['commit']}) -> {CASES_FILE.relative_to(ROOT)}")
        return
    data = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    t0 = time.perf_counter()
    res = agreement(data["cases"])
    res.update(wall_s=round(time.perf_counter() - t0, 1), load=os.getloadavg(), source=data["source"],
               commit=data["commit"])
    from importlib.metadata import version

    res["math_verify_version"] = version("math-verify")
    for mode, m in res["modes"].items():
        print(f"{mode:<24} agrees on {m['agree']}/{res['n']} ({m['rate']:.1%})")
    for f, pf in res["per_file"].items():
        print(f"  {f:<34} n={pf['n']:<4} " + "  ".join(f"{k}={v}" for k, v in pf.items() if k != "n"))
    if a.json:
        RESULT.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""Functions longer than a limit in the project's packages (issue 30: "functions over 80 lines in stages/ and
flows/", "no function in stages/grpo.py or stages/rl/ over 60 lines").

    python benchmarks/function_lengths.py [--limit 80] [PATH ...]   (default paths: stages flows)

A function's length is its lines from ``def`` to its last line (decorators and the blank lines after it excluded;
its docstring and nested functions included). Prints one line per long function, longest first, and the count.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def functions(path: Path) -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function and method in one file, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child.lineno, (child.end_lineno or child.lineno) - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def long_functions(paths: Iterable[Path], limit: int) -> list[tuple[int, str]]:
    """(length, "file:line name") of every function over ``limit`` lines under ``paths``, longest first."""
    out = []
    for base in paths:
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for f in files:
            for name, line, n in functions(f):
                if n > limit:
                    out.append((n, f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{line} {name}"))
    return sorted(out, reverse=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("paths", nargs="*", default=["stages", "flows"])
    args = ap.parse_args(argv)
    found = long_functions([Path(p) if Path(p).is_absolute() else ROOT / p for p in args.paths], args.limit)
    for n, where in found:
        print(f"{n:5d}  {where}")
    print(f"{len(found)} functions over {args.limit} lines in {' '.join(args.paths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

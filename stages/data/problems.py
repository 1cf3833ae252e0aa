"""GSM8K-style word problems with chain-of-thought, program-of-thought and tool-integrated solutions.

A problem is a start quantity followed by 1-4 operations (+, -, x), each one sentence of the
question and one line of the CoT solution, so every reasoning step ends at a newline and has a
known intermediate value (``values``), which the process reward model's labels use.

Row schema (one JSON object per line in data/generated/problems/<split>.jsonl)::

    id        str   "<split>-<n>"
    split     str   "sft" | "rl" | "test"
    question  str   the word problem
    answer    str   the final answer, an integer as text
    n_steps   int   number of operations (the difficulty)
    values    list  the running value after each operation (values[-1] == int(answer))
    cot       str   one line per operation, then "The answer is \\boxed{<answer>}."
    pot       str   "def solution(): ... return <var>"
    tir       str   text, a ```python block, its ```output block, then "\\boxed{<answer>}"
"""

from __future__ import annotations

import random
from typing import Any

NAMES = [
    "Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Emma", "Leo", "Zoe", "Jack", "Nora", "Omar",
    "Ivy", "Ravi", "Lucy", "Hugo", "Maya", "Eli", "Rosa", "Finn", "Ada", "Kai", "Jade",
]
ITEMS = [
    "apples", "marbles", "books", "stickers", "pencils", "coins", "cookies", "shells", "cards", "stamps",
    "balloons", "eggs", "toys", "flowers", "candies", "beads", "rocks", "buttons", "oranges", "ribbons",
]
PRONOUN = {n: ("she" if n in {"Anna", "Mia", "Lily", "Emma", "Zoe", "Nora", "Ivy", "Lucy", "Maya", "Rosa", "Ada", "Jade"}
               else "he") for n in NAMES}

# (op, question sentence, cot description); {p} pronoun, {n} operand, {i} item
_ADD = [
    ("{P} buys {n} more {i}.", "buys {n} more"),
    ("{P} finds {n} more {i}.", "finds {n} more"),
    ("A friend gives {o} {n} {i}.", "gets {n} from a friend"),
    ("{P} wins {n} more {i}.", "wins {n} more"),
]
_SUB = [
    ("{P} gives away {n} {i}.", "gives away {n}"),
    ("{P} loses {n} {i}.", "loses {n}"),
    ("{P} sells {n} {i}.", "sells {n}"),
    ("{P} uses {n} {i}.", "uses {n}"),
]
_MUL = [
    ("Then the number of {i} {p} has becomes {n} times as large.", "becomes {n} times as large"),
    ("Then {p} gets {n} times as many {i} as {p} has now.", "gets {n} times as many"),
]
_VAR = {i: i.rstrip("s") if not i.endswith("ies") else i[:-3] + "y" for i in ITEMS}


def sample_problem(rng: random.Random, *, n_steps: int, max_value: int) -> dict[str, Any]:
    """Draw one problem with ``n_steps`` operations; every operand stays in [1, max_value] and
    every running value in [0, 10 * max_value]. Returns the row without ``id``/``split``."""
    name = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    pro = PRONOUN[name]
    obj = "her" if pro == "she" else "him"
    cap = 10 * max_value
    value = rng.randint(2, max_value)
    question = [f"{name} has {value} {item}."]
    cot: list[str] = []
    code = [f"{_VAR[item]} = {value}"]
    values: list[int] = []
    var = _VAR[item]
    for _ in range(n_steps):
        ops = ["+"] if value < cap else []
        if value >= 2:
            ops.append("-")
        if value * 2 <= cap:
            ops.append("*")
        op = rng.choice(ops)
        if op == "+":
            n = rng.randint(1, min(max_value, cap - value))
            sent, desc = rng.choice(_ADD)
            new = value + n
        elif op == "-":
            n = rng.randint(1, min(max_value, value - 1))
            sent, desc = rng.choice(_SUB)
            new = value - n
        else:
            n = rng.randint(2, max(2, min(max_value, cap // value, 5)))
            sent, desc = rng.choice(_MUL)
            new = value * n
        fill = {"P": pro.capitalize(), "p": pro, "o": obj, "n": n, "i": item}
        question.append(sent.format(**fill))
        sym = {"+": "+", "-": "-", "*": "*"}[op]
        cot.append(f"{name} {desc.format(**fill)}: {value} {sym} {n} = {new}.")
        code.append(f"{var} = {var} {sym} {n}")
        values.append(new)
        value = new
    question.append(f"How many {item} does {name} have now?")
    answer = str(value)
    cot.append(f"The answer is \\boxed{{{answer}}}.")
    body = "\n".join(f"    {line}" for line in code)
    pot = f"def solution():\n{body}\n    return {var}"
    script = "\n".join(code + [f"print({var})"])
    tir = (
        f"Let me track the {item} with Python.\n```python\n{script}\n```\n```output\n{answer}\n```\n"
        f"{name} has {answer} {item} now. The answer is \\boxed{{{answer}}}."
    )
    return {
        "question": " ".join(question),
        "answer": answer,
        "n_steps": n_steps,
        "values": values,
        "cot": "\n".join(cot),
        "pot": pot,
        "tir": tir,
    }


def generate_splits(seed: int, *, n_sft: int, n_rl: int, n_test: int, min_steps: int, max_steps: int,
                    max_value: int) -> dict[str, list[dict[str, Any]]]:
    """Generate the three splits with no question shared between any two of them.

    Deterministic in ``seed``. Step counts are spread evenly over [min_steps, max_steps] within
    each split. Raises ValueError when the requested number of distinct questions cannot be
    reached (too small ``max_value`` for the sizes asked).
    """
    if min_steps > max_steps:
        raise ValueError(f"min_steps ({min_steps}) > max_steps ({max_steps})")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    for split, n in (("test", n_test), ("sft", n_sft), ("rl", n_rl)):
        rows: list[dict[str, Any]] = []
        attempts = 0
        while len(rows) < n:
            attempts += 1
            if attempts > 50 * n + 1000:
                raise ValueError(f"could only draw {len(rows)} distinct {split} problems; raise max_value or lower the counts")
            steps = min_steps + len(rows) % (max_steps - min_steps + 1)
            prob = sample_problem(rng, n_steps=steps, max_value=max_value)
            if prob["question"] in seen:
                continue
            seen.add(prob["question"])
            rows.append({"id": f"{split}-{len(rows):05d}", "split": split, **prob})
        out[split] = rows
    return out

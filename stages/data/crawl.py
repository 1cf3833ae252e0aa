"""The generated web crawl (the Common Crawl stand-in) and seed math corpus (the OpenWebMath stand-in).

The crawl is built to need the paper's iterative recall (DeepSeekMath section 2.1):

- Math pages come in five styles (``kind``): ``definition`` and ``explanation`` (formal, LaTeX
  heavy), ``qa`` (forum questions with algebra), ``worked_problem`` (word problems in exactly the
  style of :mod:`stages.data.problems`, with step-by-step solutions ending in ``\\boxed{}``) and
  ``arithmetic`` (drills and worked sums). The seed corpus holds only the two formal styles, so a
  classifier trained on it misses most problem and drill pages in round 1.
- Math domains come in three site types: ``formal`` (wiki / lessons), ``forum`` and ``practice``
  (worksheets). Each has math path prefixes and non-math prefixes (a shop, news, jobs), so only
  some URL prefixes of a math domain hold math. Practice sites hold almost no seed-style pages:
  round 1 collects under 10% of them and only a later round discovers them.
- General domains (food, sports, travel, shops, money, family) hold non-math pages full of numbers
  (recipes, scores, fares, prices, rates) and a few math pages (homework help, money lessons).
- Near-duplicates (``near_dup_of`` = the original's id): case/whitespace variants that normalise
  to the same text, and edited copies (boilerplate added, a sentence dropped, a number changed).
- Contaminated pages (``contaminated_by`` = a held-out test problem id) copy a test question,
  sometimes with its solution, in varied case, spacing and quotes. No other page shares an
  ``avoid_ngram``-gram with a test question or solution, nor contains a short test question whole
  (checked page by page with :class:`stages.core.text.NgramIndex`; offending pages are redrawn).

Deterministic in ``seed``: the same seed and params give byte-identical files.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stages.core.io import write_jsonl
from stages.core.text import NgramIndex, normalize_for_hash, url_domain
from stages.data import problems

MATH_KINDS = ("worked_problem", "arithmetic", "definition", "explanation", "qa")
OTHER_KINDS = ("recipe", "sports", "travel", "shopping", "finance")
SEED_KINDS = ("definition", "explanation")

# Site types: (path prefix, weight of the prefix within the domain, kind mixture of its pages).
Mixture = dict[str, float]
MATH_SITES: dict[str, list[tuple[str, float, Mixture]]] = {
    "formal": [
        ("/wiki/", 0.40, {"definition": 0.5, "explanation": 0.3, "worked_problem": 0.15, "arithmetic": 0.05}),
        ("/lessons/", 0.35, {"explanation": 0.35, "definition": 0.15, "worked_problem": 0.35, "arithmetic": 0.15}),
        ("/shop/", 0.13, {"shopping": 1.0}),
        ("/news/", 0.12, {"finance": 0.4, "travel": 0.3, "sports": 0.3}),
    ],
    "forum": [
        ("/questions/", 0.45, {"qa": 0.45, "worked_problem": 0.25, "definition": 0.15, "explanation": 0.15}),
        ("/answers/", 0.30, {"qa": 0.35, "worked_problem": 0.35, "explanation": 0.2, "arithmetic": 0.1}),
        ("/community/", 0.15, {"sports": 0.4, "travel": 0.3, "recipe": 0.3}),
        ("/jobs/", 0.10, {"finance": 1.0}),
    ],
    "practice": [
        ("/worksheets/", 0.40, {"worked_problem": 0.5, "arithmetic": 0.45, "explanation": 0.05}),
        ("/practice/", 0.35, {"worked_problem": 0.7, "arithmetic": 0.2, "qa": 0.1}),
        ("/store/", 0.13, {"shopping": 1.0}),
        ("/blog/", 0.12, {"recipe": 0.4, "travel": 0.3, "sports": 0.3}),
    ],
}
GENERAL_SITES: dict[str, list[tuple[str, float, Mixture]]] = {
    "food": [
        ("/recipes/", 0.7, {"recipe": 1.0}),
        ("/blog/", 0.3, {"recipe": 0.6, "travel": 0.2, "shopping": 0.12, "arithmetic": 0.08}),
    ],
    "sport": [
        ("/scores/", 0.6, {"sports": 1.0}),
        ("/news/", 0.4, {"sports": 0.7, "finance": 0.2, "travel": 0.1}),
    ],
    "travel": [
        ("/guides/", 0.6, {"travel": 1.0}),
        ("/deals/", 0.4, {"travel": 0.5, "shopping": 0.5}),
    ],
    "shop": [
        ("/products/", 0.7, {"shopping": 1.0}),
        ("/help/", 0.3, {"shopping": 0.7, "finance": 0.2, "worked_problem": 0.1}),
    ],
    "money": [
        ("/markets/", 0.6, {"finance": 1.0}),
        ("/learn/", 0.4, {"finance": 0.75, "explanation": 0.1, "qa": 0.05, "worked_problem": 0.1}),
    ],
    "family": [
        ("/parenting/", 0.6, {"recipe": 0.35, "travel": 0.3, "shopping": 0.25, "sports": 0.1}),
        ("/homework/", 0.4, {"worked_problem": 0.12, "arithmetic": 0.08, "shopping": 0.4, "sports": 0.4}),
    ],
}

_MATH_WORDS = (["math", "algebra", "numbers", "calc", "geometry", "arith", "proof", "tutor", "sums", "integer"],
               ["hub", "forum", "notes", "lab", "zone", "space", "base", "works", "point", "center"])
_GENERAL_WORDS = {
    "food": (["tasty", "home", "green", "happy", "quick", "family", "spice", "golden"], ["kitchen", "plate", "table", "bites", "cook"]),
    "sport": (["metro", "all", "pro", "city", "league", "fast", "top", "big"], ["sports", "scores", "goal", "match", "arena"]),
    "travel": (["wander", "sunny", "blue", "far", "road", "city", "globe", "easy"], ["travel", "trips", "maps", "journey", "escape"]),
    "shop": (["best", "smart", "daily", "mega", "value", "prime", "urban", "super"], ["deals", "store", "mart", "outlet", "buy"]),
    "money": (["wise", "market", "smart", "daily", "clear", "bright", "first", "capital"], ["money", "finance", "wallet", "invest", "bank"]),
    "family": (["happy", "busy", "little", "modern", "kind", "sunny", "bright", "cozy"], ["family", "parents", "home", "kids", "life"]),
}
_TLDS = ["com", "org", "net", "io", "co.uk", "edu", "info"]


# --------------------------------------------------------------------------------------------
# small helpers

def _pick(rng: random.Random, mix: Mixture) -> str:
    keys = list(mix)
    return rng.choices(keys, weights=[mix[k] for k in keys])[0]


_SLOTS: dict[str, Callable[[random.Random], Any]] = {
    "n": lambda r: r.randint(2, 12), "m": lambda r: r.randint(10, 90), "k": lambda r: r.randint(3, 9),
    "p": lambda r: r.randint(5, 250), "q": lambda r: r.randint(1, 5), "t": lambda r: r.choice([160, 175, 180, 190, 200, 220]),
    "y": lambda r: r.randint(2009, 2024), "h": lambda r: r.randint(1, 14), "r": lambda r: round(r.uniform(0.5, 9.5), 1),
    "d": lambda r: r.randint(1, 28), "v": lambda r: r.randint(1000, 9000), "c": lambda r: r.randint(20, 400),
    "s": lambda r: r.randint(0, 6), "u": lambda r: r.randint(0, 6),
}


class _Slots(dict):
    """Template slots: fixed values, and a fresh random number for each numeric slot the template uses."""

    def __init__(self, rng: random.Random, fixed: dict[str, Any]) -> None:
        super().__init__(fixed)
        self.rng = rng

    def __missing__(self, key: str) -> Any:
        value = self[key] = _SLOTS[key](self.rng)
        return value


def _fill(rng: random.Random, template: str, **fixed: Any) -> str:
    """Fill ``{n}``, ``{m}``, ... numeric slots of ``template`` with random numbers, other slots from ``fixed``."""
    return template.format_map(_Slots(rng, fixed))


def _words(text: str) -> int:
    return len(text.split())


def _compose(rng: random.Random, header: str, section: Callable[[], str], target_words: int,
             boilerplate: bool = True) -> str:
    """Header, then sections until ``target_words`` is reached, sometimes with site boilerplate."""
    parts = [header]
    if boilerplate and rng.random() < 0.5:
        parts.append(_fill(rng, rng.choice(_BYLINES), month=rng.choice(_MONTHS)))
    n = _words(header)
    guard = 0
    while (n < target_words or guard == 0) and guard < 60:  # at least one section
        s = section()
        parts.append(s)
        n += _words(s)
        guard += 1
    if boilerplate and rng.random() < 0.5:
        parts.append(_fill(rng, rng.choice(_FOOTERS)))
    return "\n\n".join(parts)


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_BYLINES = [
    "Posted on {month} {d}, {y} by the editors.", "Last updated {month} {y}. {c} comments.",
    "Written by a staff member, {month} {d}.", "{c} views. Reading time: {h} minutes.",
]
_FOOTERS = [
    "Share this page with a friend. Subscribe to our newsletter for {n} new posts every week.",
    "Copyright {y}. All rights reserved. Contact us or read our privacy policy.",
    "Was this page helpful? {c} people said yes. Leave a comment below.",
    "Related posts: see the {k} most popular pages this month. Follow us for more.",
]

# --------------------------------------------------------------------------------------------
# math pages

_TOPICS: list[tuple[str, str, list[str]]] = [
    ("prime number", "A natural number $p > 1$ is called prime if its only positive divisors are $1$ and $p$.",
     ["The first primes are $2, 3, 5, 7, 11, 13$.", "Every integer $n > 1$ factors uniquely as a product of primes.",
      "There are infinitely many primes, as Euclid showed by considering $p_1 p_2 \\cdots p_k + 1$."]),
    ("greatest common divisor", "The greatest common divisor $\\gcd(a, b)$ of integers $a$ and $b$ is the largest integer dividing both.",
     ["The Euclidean algorithm uses $\\gcd(a, b) = \\gcd(b, a \\bmod b)$.", "Two integers are coprime when $\\gcd(a, b) = 1$.",
      "Bezout's identity states that $\\gcd(a, b) = ax + by$ for some integers $x, y$."]),
    ("derivative", "The derivative of $f$ at $x$ is $f'(x) = \\lim_{h \\to 0} \\frac{f(x+h) - f(x)}{h}$ when the limit exists.",
     ["The power rule gives $\\frac{d}{dx} x^n = n x^{n-1}$.", "The product rule reads $(fg)' = f'g + fg'$.",
      "A differentiable function is continuous, but the converse fails for $|x|$ at $0$."]),
    ("definite integral", "The definite integral $\\int_a^b f(x)\\,dx$ is the limit of Riemann sums $\\sum_i f(x_i) \\Delta x$.",
     ["The fundamental theorem of calculus gives $\\int_a^b f'(x)\\,dx = f(b) - f(a)$.",
      "Integration is linear: $\\int (\\alpha f + \\beta g) = \\alpha \\int f + \\beta \\int g$.",
      "For example $\\int_0^1 x^2\\,dx = \\frac{1}{3}$."]),
    ("group", "A group is a set $G$ with an associative operation, an identity element $e$, and an inverse $g^{-1}$ for every $g \\in G$.",
     ["The integers under addition form a group $(\\mathbb{Z}, +)$.", "By Lagrange's theorem the order of a subgroup divides $|G|$.",
      "A group is abelian when $gh = hg$ for all $g, h \\in G$."]),
    ("vector space", "A vector space over a field $F$ is a set $V$ closed under addition and scalar multiplication satisfying the usual axioms.",
     ["A basis is a linearly independent spanning set; every basis of $V$ has $\\dim V$ elements.",
      "The space $\\mathbb{R}^n$ has the standard basis $e_1, \\dots, e_n$.",
      "A linear map $T: V \\to W$ satisfies $T(\\alpha u + v) = \\alpha T(u) + T(v)$."]),
    ("matrix determinant", "The determinant of a $2 \\times 2$ matrix is $\\det \\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix} = ad - bc$.",
     ["A square matrix is invertible if and only if $\\det A \\neq 0$.", "The determinant is multiplicative: $\\det(AB) = \\det A \\det B$.",
      "Swapping two rows changes the sign of the determinant."]),
    ("binomial coefficient", "The binomial coefficient $\\binom{n}{k} = \\frac{n!}{k!(n-k)!}$ counts the $k$-element subsets of an $n$-element set.",
     ["Pascal's rule states $\\binom{n}{k} = \\binom{n-1}{k-1} + \\binom{n-1}{k}$.",
      "The binomial theorem gives $(x+y)^n = \\sum_{k=0}^{n} \\binom{n}{k} x^k y^{n-k}$.",
      "Summing a row of Pascal's triangle gives $\\sum_k \\binom{n}{k} = 2^n$."]),
    ("congruence", "We write $a \\equiv b \\pmod{m}$ when $m$ divides $a - b$.",
     ["Congruences can be added and multiplied like equations.", "Fermat's little theorem: $a^{p-1} \\equiv 1 \\pmod{p}$ when $p \\nmid a$.",
      "The residues modulo $m$ form the ring $\\mathbb{Z}/m\\mathbb{Z}$."]),
    ("limit of a sequence", "A sequence $(a_n)$ converges to $L$ if for every $\\varepsilon > 0$ there is $N$ with $|a_n - L| < \\varepsilon$ for all $n > N$.",
     ["A convergent sequence is bounded.", "The sequence $a_n = \\frac{1}{n}$ converges to $0$.",
      "Monotone bounded sequences converge, by the completeness of $\\mathbb{R}$."]),
    ("logarithm", "The logarithm $\\log_b x$ is the exponent $y$ with $b^y = x$, for $b > 0$, $b \\neq 1$ and $x > 0$.",
     ["Logarithms turn products into sums: $\\log_b(xy) = \\log_b x + \\log_b y$.",
      "The change of base formula reads $\\log_b x = \\frac{\\ln x}{\\ln b}$.", "For example $\\log_2 8 = 3$."]),
    ("polynomial", "A polynomial of degree $n$ is an expression $p(x) = a_n x^n + \\dots + a_1 x + a_0$ with $a_n \\neq 0$.",
     ["A polynomial of degree $n$ has at most $n$ roots.", "By the factor theorem, $p(r) = 0$ exactly when $(x - r)$ divides $p(x)$.",
      "The quadratic $ax^2 + bx + c$ has roots $x = \\frac{-b \\pm \\sqrt{b^2 - 4ac}}{2a}$."]),
    ("probability", "A probability measure assigns to each event $A$ a number $P(A) \\in [0, 1]$ with $P(\\Omega) = 1$ and countable additivity.",
     ["For independent events $P(A \\cap B) = P(A) P(B)$.", "Conditional probability is $P(A \\mid B) = \\frac{P(A \\cap B)}{P(B)}$.",
      "The expected value of a fair die roll is $\\frac{1 + 2 + \\dots + 6}{6} = 3.5$."]),
    ("set", "A set is a collection of distinct objects; we write $x \\in A$ when $x$ is an element of $A$.",
     ["The union $A \\cup B$ contains elements of either set, the intersection $A \\cap B$ of both.",
      "De Morgan's laws state $(A \\cup B)^c = A^c \\cap B^c$.", "A set with $n$ elements has $2^n$ subsets."]),
    ("function", "A function $f: A \\to B$ assigns to each $a \\in A$ exactly one element $f(a) \\in B$.",
     ["A function is injective if $f(a) = f(a')$ implies $a = a'$.", "The composition is $(g \\circ f)(x) = g(f(x))$.",
      "A bijection has an inverse $f^{-1}$ with $f^{-1}(f(x)) = x$."]),
    ("arithmetic sequence", "An arithmetic sequence has a constant difference $d$, so $a_n = a_1 + (n-1)d$.",
     ["The sum of the first $n$ terms is $S_n = \\frac{n(a_1 + a_n)}{2}$.", "The sequence $3, 7, 11, 15$ has $d = 4$.",
      "The terms of an arithmetic sequence lie on a line when plotted against $n$."]),
    ("geometric series", "A geometric series $\\sum_{k=0}^{\\infty} r^k$ converges to $\\frac{1}{1 - r}$ when $|r| < 1$.",
     ["The partial sums are $S_n = \\frac{1 - r^{n+1}}{1 - r}$.", "For $r = \\frac{1}{2}$ the series sums to $2$.",
      "The series diverges when $|r| \\geq 1$."]),
    ("right triangle", "In a right triangle with legs $a, b$ and hypotenuse $c$, the Pythagorean theorem states $a^2 + b^2 = c^2$.",
     ["The triple $(3, 4, 5)$ satisfies $9 + 16 = 25$.", "The sine of an angle is $\\sin \\theta = \\frac{\\text{opposite}}{\\text{hypotenuse}}$.",
      "The area of a right triangle is $\\frac{ab}{2}$."]),
    ("circle", "A circle of radius $r$ is the set of points at distance $r$ from its centre; its area is $\\pi r^2$.",
     ["The circumference is $2 \\pi r$.", "An inscribed angle is half the central angle on the same arc.",
      "The equation of a circle is $(x - h)^2 + (y - k)^2 = r^2$."]),
    ("fraction", "A fraction $\\frac{a}{b}$ with $b \\neq 0$ is in lowest terms when $\\gcd(a, b) = 1$.",
     ["To add fractions use $\\frac{a}{b} + \\frac{c}{d} = \\frac{ad + bc}{bd}$.", "Dividing by $\\frac{c}{d}$ is multiplying by $\\frac{d}{c}$.",
      "For example $\\frac{6}{8} = \\frac{3}{4}$."]),
    ("eigenvalue", "A scalar $\\lambda$ is an eigenvalue of $A$ if $Av = \\lambda v$ for some nonzero vector $v$.",
     ["Eigenvalues are the roots of $\\det(A - \\lambda I) = 0$.", "A symmetric real matrix has real eigenvalues.",
      "The trace equals the sum of the eigenvalues."]),
    ("continuity", "A function $f$ is continuous at $a$ if $\\lim_{x \\to a} f(x) = f(a)$.",
     ["The intermediate value theorem says a continuous $f$ on $[a, b]$ takes every value between $f(a)$ and $f(b)$.",
      "Sums and products of continuous functions are continuous.", "A continuous function on $[a, b]$ attains a maximum."]),
]

_PROOF_CLAIMS: list[tuple[str, list[str]]] = [
    ("the sum of the first $n$ positive integers is $\\frac{n(n+1)}{2}$",
     ["Write the sum $S = 1 + 2 + \\dots + n$ forwards and backwards.", "Adding the two lines term by term gives $2S = n(n+1)$.",
      "Dividing by $2$ gives $S = \\frac{n(n+1)}{2}$, which completes the proof."]),
    ("$\\sqrt{2}$ is irrational",
     ["Suppose $\\sqrt{2} = \\frac{p}{q}$ in lowest terms.", "Then $p^2 = 2q^2$, so $p$ is even; write $p = 2m$.",
      "Then $q^2 = 2m^2$, so $q$ is even too, contradicting $\\gcd(p, q) = 1$."]),
    ("$(a + b)^2 = a^2 + 2ab + b^2$",
     ["Expand $(a + b)(a + b)$ using the distributive law.", "This gives $a^2 + ab + ba + b^2$.",
      "Since $ab = ba$, the middle terms combine to $2ab$."]),
    ("$a^2 - b^2 = (a - b)(a + b)$",
     ["Multiply out the right-hand side: $(a - b)(a + b) = a^2 + ab - ba - b^2$.", "The cross terms cancel because $ab = ba$.",
      "Hence $a^2 - b^2 = (a - b)(a + b)$."]),
    ("the angles of a triangle sum to $180^\\circ$",
     ["Draw the line through one vertex parallel to the opposite side.", "Alternate angles are equal, so the three angles appear along the line.",
      "Angles along a straight line sum to $180^\\circ$."]),
    ("a number is divisible by $3$ when its digit sum is",
     ["Write $n = \\sum_i d_i 10^i$.", "Since $10 \\equiv 1 \\pmod{3}$, we get $n \\equiv \\sum_i d_i \\pmod{3}$.",
      "So $3 \\mid n$ exactly when $3$ divides the digit sum."]),
    ("completing the square solves $x^2 + bx + c = 0$",
     ["Rewrite the equation as $(x + \\frac{b}{2})^2 = \\frac{b^2}{4} - c$.", "Take square roots of both sides.",
      "This gives $x = -\\frac{b}{2} \\pm \\sqrt{\\frac{b^2}{4} - c}$."]),
    ("the derivative of $x^2$ is $2x$",
     ["Compute the difference quotient $\\frac{(x+h)^2 - x^2}{h} = \\frac{2xh + h^2}{h}$.", "This simplifies to $2x + h$.",
      "Letting $h \\to 0$ gives $2x$."]),
    ("there are infinitely many primes",
     ["Suppose $p_1, \\dots, p_k$ are all the primes.", "Consider $N = p_1 p_2 \\cdots p_k + 1$.",
      "No $p_i$ divides $N$, so $N$ has a prime factor not in the list, a contradiction."]),
    ("the mean of $x_1, \\dots, x_n$ minimises $\\sum_i (x_i - c)^2$",
     ["Differentiate $\\sum_i (x_i - c)^2$ with respect to $c$.", "The derivative is $-2 \\sum_i (x_i - c)$.",
      "Setting it to zero gives $c = \\frac{1}{n} \\sum_i x_i$."]),
]

_FORMAL_OPENERS = [
    "In this article we study the {t}.", "This note recalls the basic facts about the {t}.",
    "The {t} appears throughout mathematics.", "We review the {t} and work through an example.",
    "Recall the definition of the {t}.", "Here is a short summary of the {t} with examples.",
]
_FORMAL_LINKS = [
    "Theorem.", "Remark.", "Example.", "Note that", "It follows that", "Lemma.", "Corollary.", "Exercise.",
    "In particular,", "Consequently,",
]


def _numeric_example(rng: random.Random) -> str:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    choice = rng.randrange(8)
    if choice == 0:
        return f"For instance, with $a = {a}$ and $b = {b}$ we get $a^2 + b^2 = {a * a + b * b}$."
    if choice == 1:
        return f"Take $n = {a}$; then $\\frac{{n(n+1)}}{{2}} = {a * (a + 1) // 2}$."
    if choice == 2:
        import math
        return f"Example: $\\gcd({a * 6}, {b * 6}) = {math.gcd(a * 6, b * 6)}$."
    if choice == 3:
        return f"If $f(x) = x^2 + {a}x$, then $f'(x) = 2x + {a}$ and $f({b}) = {b * b + a * b}$."
    if choice == 4:
        return f"For $x = {a}$ the expression $x^2 - {b}^2$ equals $({a} - {b})({a} + {b}) = {(a - b) * (a + b)}$."
    if choice == 5:
        return f"So $\\binom{{{a % 9 + 2}}}{{2}} = {(a % 9 + 2) * (a % 9 + 1) // 2}$."
    if choice == 6:
        return f"We have ${a} \\equiv {a % 7} \\pmod{{7}}$ and ${b} \\equiv {b % 7} \\pmod{{7}}$."
    return f"A triangle with legs ${a}$ and ${b}$ has area $\\frac{{{a} \\cdot {b}}}{{2}} = {a * b / 2:g}$."


def _definition_page(rng: random.Random, target: int) -> str:
    name, definition, facts = rng.choice(_TOPICS)
    title = rng.choice(["Definition of the {t}", "{T}", "The {t}: definition and properties", "What is a {t}?"])
    header = title.format(t=name, T=name.capitalize()) + "\n" + rng.choice(_FORMAL_OPENERS).format(t=name)

    def section() -> str:
        r = rng.random()
        if r < 0.3:
            return "Definition. " + definition
        if r < 0.65:
            return rng.choice(_FORMAL_LINKS) + " " + rng.choice(facts)
        if r < 0.85:
            return _numeric_example(rng)
        other = rng.choice(_TOPICS)
        return f"See also the {other[0]}: {other[1]}"
    return _compose(rng, header, section, target)


def _explanation_page(rng: random.Random, target: int) -> str:
    claim, steps = rng.choice(_PROOF_CLAIMS)
    header = rng.choice(["Why {c}", "Proof that {c}", "Understanding why {c}", "A short explanation: {c}"]).format(c=claim)

    def section() -> str:
        r = rng.random()
        if r < 0.45:
            return "Proof. " + " ".join(steps) + " $\\blacksquare$"
        if r < 0.75:
            return _numeric_example(rng)
        name, definition, facts = rng.choice(_TOPICS)
        return f"{rng.choice(_FORMAL_LINKS)} {definition} {rng.choice(facts)}"
    return _compose(rng, header, section, target)


def _qa_page(rng: random.Random, target: int) -> str:
    a, x = rng.randint(2, 9), rng.randint(1, 12)
    b = rng.randint(1, 30)
    c = a * x + b
    header = rng.choice([
        f"How do I solve ${a}x + {b} = {c}$?", f"Question about solving {a}x + {b} = {c}",
        f"Stuck on a linear equation: {a}x + {b} = {c}", f"Help: find x if {a}x plus {b} equals {c}",
    ])

    def section() -> str:
        r = rng.random()
        a2, x2, b2 = rng.randint(2, 9), rng.randint(1, 12), rng.randint(1, 30)
        if r < 0.35:
            return (f"Answer ({rng.randint(1, 40)} votes): subtract {b2} from both sides to get ${a2}x = {a2 * x2}$, "
                    f"then divide by {a2}: $x = {x2}$. Check: ${a2} \\cdot {x2} + {b2} = {a2 * x2 + b2}$.")
        if r < 0.55:
            num, den = rng.randint(1, 9) * 2, rng.randint(1, 9) * 2
            import math
            g = math.gcd(num, den)
            return (f"Comment: to simplify $\\frac{{{num}}}{{{den}}}$ divide top and bottom by {g} "
                    f"to get $\\frac{{{num // g}}}{{{den // g}}}$.")
        if r < 0.75:
            p, w = rng.choice([10, 20, 25, 50]), rng.randint(2, 20) * 4
            return f"Another answer: {p}% of {w} is $\\frac{{{p}}}{{100}} \\cdot {w} = {p * w / 100:g}$. Percent means per hundred."
        if r < 0.9:
            return f"I tried x = {x2 + 1} but then {a2} times {x2 + 1} plus {b2} is {a2 * (x2 + 1) + b2}, not {a2 * x2 + b2}. What did I do wrong?"
        name, definition, facts = rng.choice(_TOPICS)
        return f"Related question: what is the {name}? {definition}"
    return _compose(rng, header, section, target)


_PROBLEM_HEADERS = [
    "Word problems with solutions", "Practice set {k}: word problems", "Grade {q} math practice",
    "Homework help: story problems", "Math word problems for kids", "Solved examples: adding and taking away",
    "Step by step word problems", "Daily math practice, day {m}", "Worked examples with answers",
]
_PROBLEM_TIPS = [
    "Read each problem carefully and write one equation per step.", "Keep track of the running total after every step.",
    "Check your answer by working backwards from the result.", "Underline the numbers and the action words first.",
    "Each line of the solution does one operation.", "Try the problem on your own before reading the solution.",
]


def r1_section(question: str, cot: str) -> str:
    """A worked problem in DeepSeek-R1's output format: the reasoning inside ``<think> ... </think>``, then the
    boxed answer (the CoT's last line, ``The answer is \\boxed{x}.``). Pages with such sections are the pretraining
    text from which a base model can know the tags that the R1-Zero start (``grpo.template: r1``) asks for."""
    reasoning, _, final = cot.rpartition("\n")
    return f"Question: {question}\nAnswer: <think> {reasoning} </think> {final}"


def _worked_problem_page(rng: random.Random, target: int, draw: Callable[[], dict[str, Any]], chatty: bool = False,
                         r1_share: float = 0.0) -> str:
    header = _fill(rng, rng.choice(_PROBLEM_HEADERS))
    counter = [0]

    def chatter() -> str:
        return " ".join(_fill(rng, rng.choice(_CHATTER), month=rng.choice(_MONTHS)) for _ in range(rng.randint(2, 3)))
    if chatty:  # the talk comes first; the first section is always a problem
        header += "\n\n" + chatter()

    def section() -> str:
        if chatty and counter[0] and rng.random() < 0.6:
            return chatter()
        if counter[0] and rng.random() < 0.15:
            return rng.choice(_PROBLEM_TIPS)
        counter[0] += 1
        prob = draw()
        style = rng.random()
        if style < r1_share:
            return r1_section(prob["question"], prob["cot"])
        style = (style - r1_share) / (1.0 - r1_share)  # the other formats keep their shares of the rest (exact at 0)
        if style < 0.6:
            return f"Problem {counter[0]}. {prob['question']}\nSolution.\n{prob['cot']}"
        if style < 0.8:
            return f"Question: {prob['question']}\nAnswer:\n{prob['cot']}"
        if style < 0.9:
            return f"Example {counter[0]}. {prob['question']}\nIn Python:\n{prob['pot']}\n{prob['cot']}"
        return f"Exercise {counter[0]}. {prob['question']}\n{prob['tir']}"
    return _compose(rng, header, section, target)


def _arithmetic_page(rng: random.Random, target: int, max_value: int) -> str:
    header = _fill(rng, rng.choice([
        "Arithmetic practice", "Addition and subtraction facts", "Times tables up to {n}", "Mental math drills",
        "Worked sums for grade {q}", "Quick arithmetic warm-up",
    ]))
    cap = 10 * max_value

    def section() -> str:
        a, b = rng.randint(1, max_value), rng.randint(1, max_value)
        r = rng.random()
        if r < 0.3:
            lines = []
            for _ in range(rng.randint(3, 6)):
                a, b = rng.randint(1, cap), rng.randint(1, max_value)
                op = rng.choice("+-*") if a * b <= cap else rng.choice("+-")
                if op == "-" and b > a:
                    a, b = b, a
                val = a + b if op == "+" else a - b if op == "-" else a * b
                lines.append(f"{a} {op} {b} = {val}")
            return "\n".join(lines)
        if r < 0.5:
            return f"To find {a} + {b}, start at {a} and count on {b}: {a} + {b} = {a + b}."
        if r < 0.7:
            big, small = max(a, b), min(a, b)
            return f"To take {small} away from {big}, count back {small}: {big} - {small} = {big - small}."
        if r < 0.85:
            k = rng.randint(2, 5)
            return f"{a} times {k} means {k} groups of {a}: {a} * {k} = {a * k}."
        return f"Check: {a} + {b} = {a + b}, and {a + b} - {b} = {a}, so the answer is right."
    return _compose(rng, header, section, target)


# --------------------------------------------------------------------------------------------
# non-math pages (all with numbers)

_DISHES = ["banana bread", "tomato soup", "chicken curry", "apple pie", "pancakes", "lentil stew", "pizza dough",
           "lemon cake", "vegetable lasagna", "fried rice", "chocolate cookies", "grilled salmon"]
_INGREDIENTS = ["flour", "sugar", "butter", "eggs", "milk", "salt", "olive oil", "garlic", "onions", "rice", "tomatoes",
                "cheese", "lemons", "carrots", "honey", "yeast", "cream", "potatoes"]
_TEAMS = ["Rovers", "Tigers", "United", "Eagles", "Sharks", "Rangers", "Lions", "Wolves", "Comets", "Giants", "Hawks", "Bears"]
_PLAYERS = ["Silva", "Okafor", "Jensen", "Moreau", "Tanaka", "Kowalski", "Haddad", "Novak", "Reyes", "Brennan"]
_CITIES = ["Lisbon", "Kyoto", "Denver", "Oslo", "Marrakesh", "Vancouver", "Prague", "Lima", "Hanoi", "Dublin", "Seville",
           "Cape Town"]
_PRODUCTS = ["wireless headphones", "running shoes", "coffee maker", "backpack", "desk lamp", "winter jacket",
             "blender", "smart watch", "yoga mat", "office chair", "phone case", "electric kettle"]
_INDEXES = ["the stock index", "tech shares", "bond yields", "oil prices", "the housing market", "the currency",
            "retail sales", "gold"]

_OTHER_TEMPLATES: dict[str, tuple[list[str], list[str]]] = {
    "recipe": (
        ["{D} recipe", "Easy {dish} in {m} minutes", "Grandma's {dish}", "The best {dish} you will ever make"],
        ["Serves {n}. Prep time {m} minutes, cooking time {c} minutes.",
         "You will need {q} cups of {i1}, {n} tablespoons of {i2} and {k} {i3}.",
         "Preheat the oven to {t} degrees and grease a {d} cm tin.",
         "Mix the {i1} and the {i2} in a large bowl, then add {q} cups of {i3}.",
         "Bake for {m} minutes until golden, then cool for {h} minutes.",
         "Each serving has about {c} calories and {n} grams of protein.",
         "Stir in {k} pinches of {i1} and simmer for {m} minutes.",
         "This {dish} keeps for {q} days in the fridge or {n} weeks in the freezer.",
         "Readers rated it {r} out of 10 after {c} reviews.",
         "Tip: let the dough rest for {m} minutes before rolling it out."]),
    "sports": (
        ["{A} beat {B} {s}-{u}", "Match report: {A} vs {B}", "Season preview: {A}", "{P} scores {n} as {A} win"],
        ["{A} beat {B} {s}-{u} on Saturday in front of {v} fans.",
         "{P} scored {n} points and added {k} assists in {m} minutes.",
         "The {A} are now {n} wins and {q} losses, {k} points clear at the top of the table.",
         "Tickets for the next home game start at {p} dollars.",
         "The coach said the team ran {r} kilometres more than last week.",
         "{P} has {m} goals in {c} appearances since joining in {y}.",
         "Kick-off is at {h} pm; the stadium holds {v} spectators.",
         "The {B} have lost {k} of their last {n} matches.",
         "Highlights: a {m}-metre run in the {h}th minute and a late save.",
         "{P} signed a {q}-year contract worth {v} thousand a season."]),
    "travel": (
        ["{City} travel guide", "{n} days in {City}", "Getting around {City} on a budget", "Where to stay in {City}"],
        ["The flight to {City} takes {h} hours and fares start at {p} dollars.",
         "Our hotel was {r} km from the old town and cost {p} euros a night.",
         "The museum opens at {k} am, and tickets are {m} euros, free for children under {n}.",
         "Take tram {n} from the station; a day pass costs {r} euros.",
         "In {month} the average temperature is {m} degrees with {k} rainy days.",
         "We walked {m} thousand steps a day and spent about {c} euros on food.",
         "The train to the coast leaves every {m} minutes and takes {h} hours.",
         "Book at least {n} weeks ahead; the {k} best rooms sell out fast.",
         "The old bridge is {c} metres long and was built in {y}.",
         "A dinner for {q} at a local tavern cost {p} euros with wine."]),
    "shopping": (
        ["{Prod} review", "Deal of the day: {prod}", "Top {n} {prod} deals this week", "{Prod}: buying guide"],
        ["The {prod} is now {p} dollars, down {m}% from its usual price.",
         "Free shipping on orders over {c} dollars; returns within {m} days.",
         "Rated 4.{s} out of 5 stars by {v} customers.",
         "Buy {q} and get the {n}th one free with code SAVE{m}.",
         "The battery lasts {h} hours and charges in {m} minutes.",
         "Available in {k} colours and sizes from {n} to {m}.",
         "Order before {h} pm for delivery in {q} working days.",
         "It weighs {r} kg and comes with a {q}-year warranty.",
         "Our testers used the {prod} for {n} weeks before writing this review.",
         "Members earn {k} points for every dollar; {v} points give a {m} dollar voucher."]),
    "finance": (
        ["Markets today: {idx} up {r}%", "Weekly market wrap", "What rising rates mean for you", "{Idx} falls {r}%"],
        ["{Idx} rose {r}% to {v} points on Tuesday.",
         "Mortgage rates climbed to {r}% this week, the highest since {y}.",
         "The company reported revenue of {v} million, up {m}% from a year earlier.",
         "Analysts expect {q} rate cuts before the end of {y}.",
         "Inflation came in at {r}% in {month}, below the {k}% forecast.",
         "Shares closed at {p} dollars after trading {v} thousand contracts.",
         "The central bank held its rate at {r}% for the {n}th meeting in a row.",
         "Unemployment fell to {r}% as employers added {c} thousand jobs.",
         "The fund charges a {r}% fee and has {v} million under management.",
         "Our advisers suggest keeping {n} months of expenses in savings."]),
}


_MATH_PRODUCTS = ["graphing calculator", "algebra workbook", "geometry set", "math flash cards", "fraction tiles",
                  "times table poster", "abacus", "protractor and compass set"]
# Non-math sentences with math vocabulary: shops, jobs and events of math sites (hard negatives).
_MATH_SITE_EXTRAS = [
    "Join {c} students in our algebra summer camp; tickets cost {p} dollars.",
    "We are hiring {q} math tutors; pay starts at {m} dollars an hour.",
    "The annual math olympiad dinner is on {month} {d} at {h} pm; parking is {k} dollars.",
    "Our geometry workbook is now {p} dollars with free shipping on orders over {c} dollars.",
    "Calculus study guides ship in {q} days; {v} teachers ordered one last year.",
    "The math club meets every {month} in room {c}; snacks cost {k} dollars.",
]
# Chatter on family sites around worked problems (hard positives: little math, much talk).
_CHATTER = [
    "My son brought this home from school today and we worked through it together over dinner.",
    "Homework nights are hard after a long day at work, so here is how we did it in {m} minutes.",
    "Grab a snack and a pencil, it is math time again! The kids groaned but then got into it.",
    "Our teacher says to read the story twice before writing anything down, which helped a lot.",
    "We drew little pictures of everything first; my daughter loves that part the most.",
    "After soccer practice on {month} {d} we sat down for {k} problems like this one.",
]


def _other_page(rng: random.Random, kind: str, target: int, math_site: bool = False) -> str:
    titles, sentences = _OTHER_TEMPLATES[kind]
    slots = {
        "dish": rng.choice(_DISHES), "i1": rng.choice(_INGREDIENTS), "i2": rng.choice(_INGREDIENTS),
        "i3": rng.choice(_INGREDIENTS), "A": rng.choice(_TEAMS), "B": "", "P": rng.choice(_PLAYERS),
        "City": rng.choice(_CITIES), "prod": rng.choice(_PRODUCTS), "idx": rng.choice(_INDEXES), "month": rng.choice(_MONTHS),
    }
    if math_site and kind == "shopping":
        slots["prod"] = rng.choice(_MATH_PRODUCTS)
    slots.update(D=slots["dish"].capitalize(), Prod=slots["prod"].capitalize(), Idx=slots["idx"].capitalize(),
                 B=rng.choice([t for t in _TEAMS if t != slots["A"]]))
    header = _fill(rng, rng.choice(titles), **slots)
    pool = sentences + (_MATH_SITE_EXTRAS if math_site else [])

    def section() -> str:
        slots.update(i1=rng.choice(_INGREDIENTS), i2=rng.choice(_INGREDIENTS), P=rng.choice(_PLAYERS))
        return " ".join(_fill(rng, rng.choice(pool), **slots) for _ in range(rng.randint(2, 4)))
    return _compose(rng, header, section, target)


# --------------------------------------------------------------------------------------------
# domains, urls


def _domains(rng: random.Random, n_math: int, n_general: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(domain, site type) pairs for math and general domains; names are unique."""
    seen: set[str] = set()

    def name(words: tuple[list[str], list[str]]) -> str:
        for _ in range(10_000):
            d = f"{rng.choice(words[0])}{rng.choice(words[1])}{rng.choice(['', '', '', str(rng.randint(1, 99))])}.{rng.choice(_TLDS)}"
            if d not in seen:
                seen.add(d)
                return d
        raise ValueError("too many domains asked for the name lists")
    math_types = list(MATH_SITES)
    general_types = list(GENERAL_SITES)
    math = [(name(_MATH_WORDS), math_types[i % len(math_types)]) for i in range(n_math)]
    general = [(name(_GENERAL_WORDS[general_types[i % len(general_types)]]), general_types[i % len(general_types)])
               for i in range(n_general)]
    return math, general


_SLUG_WORDS = ["intro", "guide", "part", "notes", "topic", "page", "post", "item", "entry", "thread", "lesson", "set"]


def _url(rng: random.Random, domain: str, prefix: str, k: int) -> str:
    www = "www." if rng.random() < 0.3 else ""
    return f"https://{www}{domain}{prefix}{rng.choice(_SLUG_WORDS)}-{k}"


# --------------------------------------------------------------------------------------------
# near-duplicates, contamination


def _exact_variant(rng: random.Random, text: str) -> str:
    """Same text up to case and whitespace (normalises to the same hash)."""
    t = text.upper() if rng.random() < 0.2 else text
    t = t.replace("\n\n", "\n \n") if rng.random() < 0.5 else t.replace(" ", "  ", rng.randint(1, 5))
    return t + ("\n" if rng.random() < 0.5 else " ")


def _near_variant(rng: random.Random, text: str, edit: bool = True) -> str:
    """An edited copy: boilerplate added, and (when ``edit``) a paragraph dropped or a number changed."""
    paras = text.split("\n\n")
    r = rng.random() if edit else 1.0
    if r < 0.4 and len(paras) > 4:
        del paras[rng.randrange(1, len(paras))]
    elif r < 0.7:
        i = rng.randrange(len(paras))
        paras[i] = paras[i].replace(next((w for w in paras[i].split() if w.isdigit()), "the"), str(rng.randint(1, 99)), 1)
    paras.insert(0, _fill(rng, rng.choice(["Mirror of the original page, saved {month} {y}.", "Reposted from a partner site.",
                                            "Cached copy. {c} views."]), month=rng.choice(_MONTHS)))
    paras.append(_fill(rng, rng.choice(_FOOTERS)))
    return "\n\n".join(paras)


def _contaminated_page(rng: random.Random, test: dict[str, Any], target: int, draw: Callable[[], dict[str, Any]]) -> str:
    """A homework-help page quoting a held-out test question, sometimes with its solution, in a varied form."""
    q = test["question"]
    r = rng.random()
    if r < 0.25:
        q = q.lower()
    elif r < 0.4:
        q = q.upper()
    if rng.random() < 0.4:
        q = q.replace(" ", "  ").replace(". ", ".\n")
    if rng.random() < 0.3:
        q = f"\u201c{q}\u201d"
    elif rng.random() < 0.3:
        q = f'"{q}"'
    quoted = rng.choice(["Can someone help me with this one? {q}", "Our teacher gave us: {q}", "Problem: {q}",
                         "From the test: {q}", "{q}"]).format(q=q)
    if rng.random() < 0.5:
        quoted += "\nSolution:\n" + test["cot"]
    page = _worked_problem_page(rng, max(40, target - len(quoted.split())), draw)
    paras = page.split("\n\n")
    paras.insert(rng.randint(1, len(paras)), quoted)
    return "\n\n".join(paras)


# --------------------------------------------------------------------------------------------
# entry point


def generate(p: Any, *, seed: int, test_problems: list[dict[str, Any]], crawl_path: Path, seed_path: Path) -> dict[str, Any]:
    """Write the crawl (``crawl_path``) and seed corpus (``seed_path``) as JSONL; return small metrics.

    ``p`` is a :class:`stages.schema.data.CrawlParams`. ``test_problems`` are the held-out problems: the
    planted contaminated pages copy them, and every other page is checked not to share an
    ``p.avoid_ngram``-gram with any of their questions or solutions (nor contain a shorter
    question whole); a page that does is redrawn. One random stream draws everything, in this order: the domains,
    the pages, the planted contamination, the near-duplicates, the seed corpus.
    """
    t0 = time.perf_counter()
    d = _Drawer(p, seed, test_problems)
    math_domains, general_domains = _domains(d.rng, p.n_math_domains, p.n_general_domains)
    rows = [{"id": "", "url": d.url(domain, prefix), "text": d.clean_text(kind, on_math),
             "label": "math" if kind in MATH_KINDS else "other", "kind": kind, "near_dup_of": None,
             "contaminated_by": None} for domain, prefix, kind, on_math in _slots(d, math_domains, general_domains)]
    _plant_contaminated(d, rows, test_problems, math_domains, general_domains)
    rows = _plant_near_duplicates(d, rows, math_domains + general_domains)
    seed_rows = _seed_rows(d, rows)
    write_jsonl(crawl_path, rows)
    write_jsonl(seed_path, seed_rows)
    kinds = Counter(r["kind"] for r in rows)
    general_hosts = {h for h, _ in general_domains}
    return {
        "pages": len(rows),
        "math_pages": sum(r["label"] == "math" for r in rows),
        "math_pages_on_general_domains": sum(r["label"] == "math" and url_domain(r["url"]) in general_hosts for r in rows),
        "near_dup_pages": sum(r["near_dup_of"] is not None for r in rows),
        "contaminated_pages": sum(r["contaminated_by"] is not None for r in rows),
        "domains": len(math_domains) + len(general_domains),
        "seed_pages": len(seed_rows),
        "kinds": dict(sorted(kinds.items())),
        "redrawn_problems": d.redrawn["problems"],
        "redrawn_pages": d.redrawn["pages"],
        "mean_words": round(sum(len(r["text"].split()) for r in rows) / max(1, len(rows)), 1),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


class _Drawer:
    """The crawl's one random stream (``rng``) and its guard against the test problems: word problems, page texts
    and unused URLs, each redrawn while it shares an n-gram with a test problem (counted in ``redrawn``)."""

    def __init__(self, p: Any, seed: int, test_problems: list[dict[str, Any]]) -> None:
        self.p, self.rng = p, random.Random(f"crawl-{seed}")
        self.guard = NgramIndex(p.avoid_ngram)
        self.test_questions: set[str] = set()
        for t in test_problems:
            self.guard.add(t["question"], t["id"])
            self.guard.add(t["cot"], t["id"], whole_if_short=False)
            self.test_questions.add(t["question"])
        self.redrawn: Counter[str] = Counter()
        self.used_urls: set[str] = set()

    def problem(self) -> dict[str, Any]:
        p, rng = self.p, self.rng
        for _ in range(1000):
            prob = problems.sample_problem(rng, n_steps=rng.randint(1, p.max_steps), max_value=p.max_value)
            if prob["question"] in self.test_questions or self.guard.match(prob["question"]) or \
                    self.guard.match(prob["cot"]):
                self.redrawn["problems"] += 1
                continue
            return prob
        raise ValueError("could not draw a word problem unlike every test problem; raise data.crawl.avoid_ngram")

    def text(self, kind: str, r: random.Random, math_site: bool) -> str:
        p = self.p
        target = r.randint(p.min_words, p.max_words)
        if kind == "worked_problem":
            return _worked_problem_page(r, target, self.problem, chatty=not math_site, r1_share=p.r1_share)
        if kind == "arithmetic":
            return _arithmetic_page(r, target, p.max_value)
        if kind == "definition":
            return _definition_page(r, target)
        if kind == "explanation":
            return _explanation_page(r, target)
        if kind == "qa":
            return _qa_page(r, target)
        return _other_page(r, kind, target, math_site)

    def clean_text(self, kind: str, math_site: bool) -> str:
        for _ in range(100):
            text = self.text(kind, self.rng, math_site)
            # only math pages are built from problem-like text; the others are checked by tests/data/test_crawl.py
            if kind not in MATH_KINDS or self.guard.match(text) is None:
                return text
            self.redrawn["pages"] += 1
        raise ValueError("could not draw a page unlike every test problem; raise data.crawl.avoid_ngram")

    def url(self, domain: str, prefix: str) -> str:
        while True:
            u = _url(self.rng, domain, prefix, self.rng.randint(1, 10 ** 6))
            if u not in self.used_urls:
                self.used_urls.add(u)
                return u


def _slots(d: _Drawer, math_domains: list[tuple[str, str]], general_domains: list[tuple[str, str]]
           ) -> list[tuple[str, str, str, bool]]:
    """(domain, prefix, kind, on a math site) of every page, math sites first by their share, then shuffled."""
    p, rng = d.p, d.rng
    n_math_site_pages = round(p.n_pages * p.math_domain_share)
    slots: list[tuple[str, str, str, bool]] = []
    for i in range(p.n_pages):
        on_math = i < n_math_site_pages
        domain, site = rng.choice(math_domains) if on_math else rng.choice(general_domains)
        layout = MATH_SITES[site] if on_math else GENERAL_SITES[site]
        prefix, _, mix = rng.choices(layout, weights=[w for _, w, _ in layout])[0]
        slots.append((domain, prefix, _pick(rng, mix), on_math))
    rng.shuffle(slots)
    return slots


def _plant_contaminated(d: _Drawer, rows: list[dict[str, Any]], test_problems: list[dict[str, Any]],
                        math_domains: list[tuple[str, str]], general_domains: list[tuple[str, str]]) -> None:
    """Planted contamination: homework pages quoting test problems, on math prefixes and general homework ones."""
    p, rng = d.p, d.rng
    contam_slots = [(dm, pre) for dm, site in math_domains for pre, _, mix in MATH_SITES[site] if "worked_problem" in mix]
    contam_slots += [(dm, "/homework/") for dm, site in general_domains if site == "family"]
    for _ in range(p.n_contaminated):
        test = test_problems[rng.randrange(len(test_problems))]
        domain, prefix = rng.choice(contam_slots)
        text = _contaminated_page(rng, test, rng.randint(p.min_words, p.max_words), d.problem)
        rows.append({"id": "", "url": d.url(domain, prefix), "text": text, "label": "math", "kind": "worked_problem",
                     "near_dup_of": None, "contaminated_by": test["id"]})


def _plant_near_duplicates(d: _Drawer, rows: list[dict[str, Any]], all_domains: list[tuple[str, str]]
                           ) -> list[dict[str, Any]]:
    """Near-duplicates of base pages (half exact case / whitespace variants, half edited copies) interleaved among
    them; every row numbered in file order, copies pointing at their original's id."""
    p, rng = d.p, d.rng
    rng.shuffle(rows)
    for i, row in enumerate(rows):
        row["id"] = f"crawl-{i:06d}"
    n_dups = round(len(rows) * p.near_dup_frac)
    for orig in rng.sample(rows, n_dups):
        exact = rng.random() < 0.5
        text = (_exact_variant(rng, orig["text"]) if exact  # copies of planted pages keep the quoted problem intact
                else _near_variant(rng, orig["text"], edit=orig["contaminated_by"] is None))
        if orig["contaminated_by"] is None and d.guard.match(text) is not None:
            continue  # an edit that happened to hit a test n-gram: skip this copy
        if rng.random() < 0.5:
            url = orig["url"].replace("https://", "https://m.", 1) + f"?ref={rng.randint(1, 999)}"
        else:  # a scraper or mirror on another domain
            url = d.url(rng.choice(all_domains)[0], "/archive/")
        rows.append({"id": "", "url": url, "text": text, "label": orig["label"], "kind": orig["kind"],
                     "near_dup_of": orig["id"], "contaminated_by": orig["contaminated_by"]})
    base = len(rows) - n_dups
    dups = rows[base:]
    rows = rows[:base]
    for row in dups:  # interleave copies among the originals (ids stay in file order)
        rows.insert(rng.randint(0, len(rows)), row)
    id_map = {}
    for i, row in enumerate(rows):
        new = f"crawl-{i:06d}"
        if row["id"]:
            id_map[row["id"]] = new
        row["id"] = new
    for row in rows:
        if row["near_dup_of"] is not None:
            row["near_dup_of"] = id_map[row["near_dup_of"]]
    return rows


def _seed_rows(d: _Drawer, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed corpus: formal styles only, on its own archive domains, texts unlike any crawl page."""
    rng = d.rng
    crawl_hashes = {normalize_for_hash(r["text"]) for r in rows}
    seed_domains = [f"openmath-archive{i}.org" for i in range(1, 6)]
    seed_rows: list[dict[str, Any]] = []
    while len(seed_rows) < d.p.n_seed_pages:
        kind = rng.choice(SEED_KINDS)
        text = d.clean_text(kind, True)
        if normalize_for_hash(text) in crawl_hashes:
            continue
        url = d.url(rng.choice(seed_domains), rng.choice(["/articles/", "/notes/", "/theorems/"]))
        seed_rows.append({"id": f"seed-{len(seed_rows):06d}", "url": url, "text": text})
    return seed_rows

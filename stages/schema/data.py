"""Schema of params.yaml's ``data`` section: the generated crawl, seed corpus and word problems."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from stages.schema.base import Fraction, NonNegInt, PosInt, Section


class ProblemParams(Section):
    """Generated GSM8K-style word problems (the SFT, RL and held-out test sets)."""

    n_sft: PosInt = 20000
    """Problems in the SFT training split."""
    n_rl: PosInt = 20000
    """Problems in the RL (GRPO) prompt split."""
    n_test: PosInt = 1000
    """Held-out test problems (evaluation only; 500+ keeps the standard error near 2 points)."""
    min_steps: Annotated[int, Field(ge=1, le=4)] = 1
    """Fewest arithmetic steps in a problem."""
    max_steps: Annotated[int, Field(ge=1, le=4)] = 4
    """Most arithmetic steps in a problem (the difficulty knob, with max_value)."""
    max_value: Annotated[int, Field(ge=5, le=10_000)] = 1000
    """Largest starting quantity and operand; every intermediate result also stays in [0, max_value * 10]."""


class CrawlParams(Section):
    """The generated web crawl and seed math corpus (stand-ins for Common Crawl and OpenWebMath)."""

    n_pages: PosInt = 12000
    """Pages in the crawl (math and non-math, before near-duplicates and contaminated pages are added)."""
    n_seed_pages: PosInt = 1500
    """Pages in the seed math corpus (formal definition / explanation pages only, unlike any crawl page)."""
    n_math_domains: PosInt = 24
    """Math domains (formal, forum and practice sites; each also has non-math URL prefixes)."""
    n_general_domains: PosInt = 120
    """General domains (food, sport, travel, shop, money, family sites; a few hold math pages)."""
    math_domain_share: Fraction = 0.35
    """Fraction of the n_pages crawl pages that lie on math domains."""
    min_words: PosInt = 100
    """Shortest page, in words (pages stop at the first section past a length drawn in [min_words, max_words])."""
    max_words: PosInt = 400
    """Longest target page length, in words."""
    max_steps: Annotated[int, Field(ge=1, le=4)] = 4
    """Most arithmetic steps of a worked word problem on a crawl page (keep equal to problems.max_steps)."""
    max_value: Annotated[int, Field(ge=5, le=10_000)] = 1000
    """Largest operand of worked problems and drills on crawl pages (keep equal to problems.max_value)."""
    near_dup_frac: Fraction = 0.05
    """Near-duplicate copies added, as a fraction of the pages (half case/whitespace variants, half edited copies)."""
    n_contaminated: NonNegInt = 120
    """Planted pages that copy a held-out test question (sometimes with its solution), for decontamination."""
    r1_share: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Share of the worked problems on crawl pages written in DeepSeek-R1's format (``<think> reasoning </think>``
    and the boxed answer): the pretraining text an R1-Zero start (``grpo.start: pretrain``, ``grpo.template: r1``)
    needs to know the tags (docs/rl.md). 0 in the default; the other formats keep their proportions of the rest."""
    avoid_ngram: Annotated[int, Field(ge=3)] = 10
    """No other page shares an n-gram of this length with a test question or solution (redrawn if so); keep <= corpus.decontam.ngram."""


class DataParams(Section):
    """Section ``data``: everything the pipeline generates itself, deterministically from ``seed``: stand-ins, not in
    the paper. Defaults: the real run's labelled checks (params/deepseekmath-7b.yaml); the tiny default is smaller."""

    SECTION = "data"

    seed: NonNegInt = 0
    """Random seed; the same seed and params give byte-identical outputs."""
    problems: ProblemParams = ProblemParams()
    """Word problems and their CoT / PoT / tool-integrated solutions."""
    crawl: CrawlParams = CrawlParams()
    """The crawl and the seed corpus."""

    @model_validator(mode="after")
    def _check_ranges(self) -> DataParams:
        pp, c = self.problems, self.crawl
        if pp.min_steps > pp.max_steps:
            raise ValueError(f"problems.min_steps ({pp.min_steps}) > problems.max_steps ({pp.max_steps}); make min <= max")
        if c.min_words > c.max_words:
            raise ValueError(f"crawl.min_words ({c.min_words}) > crawl.max_words ({c.max_words}); make min <= max")
        return self

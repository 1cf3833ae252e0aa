"""Domain discovery (DeepSeekMath section 2.1).

A domain is the set of pages sharing a base URL (:func:`stages.core.text.url_domain`). A domain
is math-related when more than ``domain_fraction`` (paper: 10%) of its pages were collected.
Inside math-related domains the paper has humans mark the URLs holding math
(``mathoverflow.net/questions``); here URL path prefixes (first ``prefix_depth`` path segments)
whose pages were mostly collected (at least ``prefix_fraction``) are *proposed*, written to a
reviewable TSV, and either accepted automatically or filtered through an approved list that a
person edited. Not-yet-collected pages under accepted prefixes join the seed corpus for the next
round.

Approved-list format: one ``domain<TAB>prefix`` (or ``domain prefix``) per line, ``#`` comments;
the first two columns of a proposals TSV are in exactly that format.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core.errors import PipelineError
from stages.core.io import write_text


@dataclass(frozen=True)
class Proposal:
    """A URL prefix proposed as math inside a math-related domain."""

    domain: str
    prefix: str
    pages: int
    collected: int

    @property
    def fraction(self) -> float:
        return self.collected / max(1, self.pages)


class DomainStats:
    """Page and collected counts per domain and per (domain, prefix); mergeable across shards."""

    def __init__(self) -> None:
        self.pages: Counter[str] = Counter()
        self.collected: Counter[str] = Counter()
        self.prefix_pages: Counter[tuple[str, str]] = Counter()
        self.prefix_collected: Counter[tuple[str, str]] = Counter()

    def add(self, domains: Iterable[str], prefixes: Iterable[str], collected: Iterable[bool]) -> None:
        for d, pre, c in zip(domains, prefixes, collected, strict=True):
            self.pages[d] += 1
            self.prefix_pages[d, pre] += 1
            if c:
                self.collected[d] += 1
                self.prefix_collected[d, pre] += 1

    def add_counts(self, rows: Iterable[Sequence[Any]]) -> None:
        """Add pre-aggregated ``(domain, prefix, pages, collected)`` rows (one shard's counts)."""
        for d, pre, n, c in rows:
            self.pages[d] += n
            self.prefix_pages[d, pre] += n
            if c:
                self.collected[d] += c
                self.prefix_collected[d, pre] += c

    def merge(self, other: DomainStats) -> None:
        self.pages.update(other.pages)
        self.collected.update(other.collected)
        self.prefix_pages.update(other.prefix_pages)
        self.prefix_collected.update(other.prefix_collected)


def math_domains(stats: DomainStats, *, domain_fraction: float, min_domain_pages: int) -> list[str]:
    """Domains with at least ``min_domain_pages`` pages of which more than ``domain_fraction`` were collected."""
    return sorted(d for d, n in stats.pages.items()
                  if n >= min_domain_pages and stats.collected[d] / n > domain_fraction)


def propose(stats: DomainStats, domains: Iterable[str], *, prefix_fraction: float, min_prefix_pages: int
            ) -> list[Proposal]:
    """Prefixes of ``domains`` with at least ``min_prefix_pages`` pages, at least ``prefix_fraction`` collected."""
    wanted = set(domains)
    out = []
    for (d, pre), n in stats.prefix_pages.items():
        if d in wanted and n >= min_prefix_pages:
            c = stats.prefix_collected[d, pre]
            if c / n >= prefix_fraction:
                out.append(Proposal(d, pre, n, c))
    return sorted(out, key=lambda x: (x.domain, x.prefix))


def write_proposals(path: str | os.PathLike[str], proposals: Iterable[Proposal], accepted: set[tuple[str, str]]) -> None:
    """The reviewable file: ``domain, prefix, pages, collected, fraction, accepted`` as TSV."""
    lines = ["# domain\tprefix\tpages\tcollected\tfraction\taccepted"]
    lines += [f"{p.domain}\t{p.prefix}\t{p.pages}\t{p.collected}\t{p.fraction:.3f}\t{(p.domain, p.prefix) in accepted}"
              for p in proposals]
    write_text(path, "\n".join(lines) + "\n")


def read_approved(path: str | os.PathLike[str]) -> set[tuple[str, str]]:
    """The (domain, prefix) pairs of an approved list (see the module docstring for the format)."""
    p = Path(path)
    if not p.is_file():
        raise PipelineError(f"{p}: approved prefix list not found; set corpus.domains.approve to 'auto' or to an existing file")
    out = set()
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) < 2 or not parts[1].startswith("/"):
            raise PipelineError(f"{p}:{i}: expected 'domain<TAB>/prefix/', got {line!r}")
        out.add((parts[0].lower(), parts[1]))
    return out


def accept(proposals: Iterable[Proposal], domains: Iterable[str], approve: str) -> set[tuple[str, str]]:
    """Accepted prefixes: every proposal (``approve == "auto"``), or the approved list's prefixes inside math domains."""
    if approve == "auto":
        return {(p.domain, p.prefix) for p in proposals}
    wanted = set(domains)
    return {(d, pre) for d, pre in read_approved(approve) if d in wanted}

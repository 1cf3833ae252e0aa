"""The README stays a newcomer's page and the docs hold together: README.md is at most 230 lines and holds the two
quick-start commands, every relative link in README.md and docs/*.md reaches an existing file (and heading, for
an anchor), and every docs page is linked from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

QUICK_START = (
    "bash .ci/setup && .venv/bin/python -m flows.pipeline",
    "bash .ci/setup && .venv/bin/python -m pytest",
)

_FENCE = re.compile(r"^ {0,3}(`{3,}[^`]*|~{3,}.*)$")  # CommonMark: a backtick fence's info string has no backtick
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a ``# comment`` in a shell block is not a heading)."""
    out, fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return out


def _strip_code_spans(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (repeated headings get GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def relative_links(path: Path) -> list[str]:
    """Link targets of a markdown file that are not URLs (inline code and fenced blocks excluded)."""
    links = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_strip_code_spans(line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                links.append(target)
    return links


def test_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 230, f"README.md has {n} lines; keep it under 230 and move detail to a docs/ page"


@pytest.mark.parametrize("command", QUICK_START)
def test_readme_has_the_quick_start_commands(command: str) -> None:
    assert command in README.read_text(encoding="utf-8"), f"README.md lost the quick-start command {command!r}"


def test_docs_pages_exist() -> None:
    assert DOCS, "docs/ has no pages"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README) if t.partition("#")[0]}
    unlinked = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"docs pages not linked from README.md: {unlinked}"


def test_slug_follows_github() -> None:
    assert slug("The unified paradigm: `grpo.algorithm`") == "the-unified-paradigm-grpoalgorithm"
    assert slug("Comparison with the paper's Figure 5") == "comparison-with-the-papers-figure-5"
    assert slug("Training (pretrain, sft)") == "training-pretrain-sft"

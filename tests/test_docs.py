"""The README stays a newcomer's page and the docs hold together: README.md is at most 230 lines and holds the two
quick-start commands, every relative link in README.md and docs/*.md reaches an existing file (and heading, for
an anchor), every docs page is linked from the README, and the README's claims about the code hold: its file tree
names existing files (and every module of stages/rl/), and every file, symbol (``stages.rl.losses.grpo_loss``,
imported and looked up) and params key (``grpo.loss.policy``, looked up in the schema) that the one-GPU recipe and
the "How to change X" recipes name resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RESULTS = sorted((ROOT / "docs" / "results").glob("*.md"))  # results pages: their links are checked too
PAGES = [README, *DOCS, *RESULTS]

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


# ---------------------------------------------------------------------------------------------
# the README's claims about the code: the file tree, the one-GPU recipe and every "How to change X" recipe resolve

CHECKED_SECTIONS = ("Where things are", "One GPU: Qwen2.5-0.5B on GSM8K", "How to change X")
_SYMBOL = re.compile(r"^(?:stages|benchmarks|tests|flows)(?:\.\w+)+$")
_NAME_COLUMN = 28  # the tree's description column


def readme_sections() -> dict[str, str]:
    """README.md's ``## `` sections by title."""
    out: dict[str, str] = {}
    title = ""
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            out[title] = ""
        elif title:
            out[title] += line + "\n"
    return out


def tree_paths(section: str) -> list[str]:
    """The paths of the file tree (the fenced block of a section): a line's names are its text before the
    description column, nested by two-space indentation under the last directory (``name/``) of the level above;
    placeholders (``<stage>.py``) are left out."""
    block = section.split("```")[1]
    parents: list[str] = []
    out = []
    for line in block.splitlines()[1:]:
        names = line[:_NAME_COLUMN].split()
        if not names:
            continue
        level = (len(line) - len(line.lstrip(" "))) // 2
        parents = parents[:level]
        for name in names:
            if "<" in name:
                continue
            out.append("/".join([*parents, name.rstrip("/")]))
        if len(names) == 1 and names[0].endswith("/"):
            parents.append(names[0].rstrip("/"))
    return out


def code_spans(section: str) -> list[str]:
    """Inline code spans of a section's prose, and the ``python -m <module>`` / file arguments of its code blocks."""
    spans: list[str] = []
    for line in _prose_lines(section):
        spans += re.findall(r"`([^`]+)`", line)
    for block in section.split("```")[1::2]:
        spans += re.findall(r"python -m ([\w.]+)", block)
        spans += [w for w in block.split() if "/" in w and "." in w.rsplit("/", 1)[-1] and not w.startswith("'")]
    return spans


def resolve_symbol(dotted: str) -> object:
    """``pkg.module.Name.attr``: the longest importable module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def params_key_exists(key: str) -> bool:
    """Whether ``grpo.loss.policy`` (a section, then fields of nested schemas) is a params.yaml key."""
    from pydantic import BaseModel

    from stages.params import Params

    model: type[BaseModel] = Params
    for part in key.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) \
            else BaseModel
    return True


def classify(span: str) -> tuple[str, str] | None:
    """("path" | "symbol" | "params" | "module", what to check) for a span that names code, else None."""
    from stages.params import Params

    text = span.strip()
    if " " in text and not re.match(r"^\w+(\.\w+)+: ", text):
        return None
    if text.startswith("data/") or "<" in text or "*" in text or re.search(r"(^|[/_])X([./]|$)", text):
        return None  # artifacts of a run, placeholders (<stage>, a stage X)
    head = text.split(": ")[0] if re.match(r"^\w+(\.\w+)+: ", text) else text
    if "/" in head and not head.startswith(("http", "@")):
        return "path", head.rstrip("/")
    if _SYMBOL.match(head):
        return "symbol", head
    if "." in head and head.split(".")[0] in Params.model_fields and re.match(r"^[\w.]+$", head):
        return "params", head
    return None


def _checked(title: str) -> tuple[list[str], dict[str, int]]:
    return check_spans(readme_sections()[title])


def check_spans(section: str) -> tuple[list[str], dict[str, int]]:
    """(problems, counts by kind) of the code a section names."""
    problems: list[str] = []
    counts = {"path": 0, "symbol": 0, "params": 0}
    for span in code_spans(section):
        kind = classify(span)
        if kind is None:
            continue
        what, target = kind
        counts[what] += 1
        if what == "path" and not (ROOT / target).exists():
            problems.append(f"{span}: no file {target}")
        elif what == "symbol":
            try:
                resolve_symbol(target)
            except (ImportError, AttributeError) as e:
                problems.append(f"{span}: does not resolve ({type(e).__name__}: {e})")
        elif what == "params" and not params_key_exists(target):
            problems.append(f"{span}: not a params.yaml key")
    return problems, counts


def test_readme_file_tree_names_existing_files() -> None:
    paths = tree_paths(readme_sections()["Where things are"])
    assert len(paths) > 60 and "stages/rl/loop.py" in paths and "stages/rl/sources" in paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's file tree names files that do not exist: {missing}"
    rl = {p.split("/")[-1] for p in paths if p.startswith("stages/rl/")}
    on_disk = {f.name for f in (ROOT / "stages" / "rl").iterdir() if f.name != "__pycache__" and f.name != "__init__.py"}
    assert not on_disk - rl, f"stages/rl/ holds files the README's tree omits: {sorted(on_disk - rl)}"


@pytest.mark.parametrize("title", CHECKED_SECTIONS[1:])
def test_readme_recipes_resolve_every_symbol_file_and_key(title: str) -> None:
    problems, counts = _checked(title)
    assert not problems, f"README.md, {title}: " + "; ".join(problems)
    assert counts["path"] >= 1 and sum(counts.values()) >= 3, counts  # the section was read


def test_each_how_to_recipe_names_resolvable_code() -> None:
    """Every recipe of "How to change X" (a bold lead-in) names at least one file and one symbol or key, all checked
    by the test above."""
    section = readme_sections()["How to change X"]
    recipes = re.split(r"\n\*\*", section)[1:]
    assert {r.split("**")[0].split(".")[0].split(" `")[0] for r in recipes} >= {
        "Change the loss", "Add an advantage estimator", "Add a rollout correction", "Add an RL algorithm",
        "Add a reward function", "Add a reward source", "Add a stage"}
    for r in recipes:
        kinds = [k for k in (classify(s) for s in code_spans(r)) if k is not None]
        assert any(k == "path" for k, _ in kinds), r[:60]
        assert any(k in ("symbol", "params") for k, _ in kinds) or "Add a stage" in r, r[:60]


def test_rl_docs_how_to_resolves_for_every_entry_kind() -> None:
    """docs/rl.md's "How to change the RL" names, for each registry entry kind, code that exists (the same check)."""
    text = (ROOT / "docs" / "rl.md").read_text(encoding="utf-8")
    section = text.split("### How to change the RL", 1)[1].split("\n## ", 1)[0]
    problems, counts = check_spans(section)
    assert not problems, "docs/rl.md, How to change the RL: " + "; ".join(problems)
    for kind in ("policy loss", "advantage estimator", "rollout correction", "reward source", "algorithm"):
        assert f"**A new {kind}**" in section, kind
    assert counts["path"] >= 5 and counts["symbol"] + counts["params"] >= 3, counts


def test_the_checks_catch_stale_names() -> None:
    """What a stale recipe would say (a renamed symbol, a moved file, an old flat params key) is reported."""
    problems, counts = check_spans("Call `stages.rl.losses.no_such_loss` in `stages/rl/no_such.py`; set `grpo.lr`.\n")
    assert counts == {"path": 1, "symbol": 1, "params": 1} and len(problems) == 3, problems


def test_every_variable_of_the_environment_table_is_read_where_it_says() -> None:
    """docs/pipeline.md's table of environment variables lists every variable the code in stages/ and flows/ reads
    (``os.environ[...]`` / ``.get`` / ``getenv`` of a literal, or a module constant ``*ENV`` / ``*VAR``), and a
    variable whose 'read by' cell names project files is read
    (``"NAME"`` as a string literal) in one of them (bare names are siblings of the cell's previous file; a directory
    means any file under it). Caught: ``ANSWERS_MAX_WORKERS`` read as the literal ``"ANSWERS_max_workers()"``."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    table = text[text.index("## Environment variables"):].split("\n## ")[0]
    rows = [r.split("|")[1:3] for r in table.splitlines() if r.startswith("| `")]
    assert len(rows) >= 15, "the table of environment variables was not found"
    checked = 0
    for names, readers in rows:
        files: list[Path] = []
        for ref in re.findall(r"[\w./]+\.py|\b(?:flows|stages)/(?=[,\s]|$)", readers):
            path = ROOT / ref if "/" in ref or not files else files[-1].parent / ref
            files.append(path)
        sources = [f for p in files for f in ([p] if p.suffix else sorted(p.rglob("*.py"))) if f.is_file()]
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", names):
            if files:
                assert any(re.search(rf"[\"']{name}[\"']", f.read_text()) for f in sources), \
                    f"docs/pipeline.md: {name} is not read in {readers.strip()}"
                checked += 1
    assert checked >= 10
    table_names = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", "".join(n for n, _ in rows)))
    read = set()
    for f in [*ROOT.glob("stages/**/*.py"), *ROOT.glob("flows/*.py")]:
        src = f.read_text()
        read |= set(re.findall(r"(?:environ(?:\.get|\.pop|\.setdefault)?[(\[]|getenv\()\s*[\"']([A-Z][A-Z0-9_]+)[\"']", src))
        read |= set(re.findall(r"^[A-Z_]*(?:ENV|VAR)\s*=\s*[\"']([A-Z][A-Z0-9_]+)[\"']", src, re.M))
    assert len(read) >= 20 and read <= table_names, f"read by the code, not in docs/pipeline.md's table: {read - table_names}"

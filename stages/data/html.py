"""Crawl pages as HTML and WARC / WET files: test input for the corpus stage's crawl reader and extractor.

:func:`render` wraps a page's text in a web page: a head with scripts and styles, navigation, a sidebar, a
cookie banner and a footer (sentences from :data:`BOILERPLATE`, so a test can measure how much of it an
extractor keeps), the text as paragraphs in an ``<article>``, and each LaTeX formula of the text (``$..$``,
``$$..$$``, ``\\(..\\)``, ``\\[..\\]``) written in one of the ways math appears on the web (``math``): raw TeX,
a MathJax ``<script type="math/tex">``, MathML with a TeX annotation, MathML with ``alttext``, or MathML
with symbols only. :func:`write_warc` / :func:`write_wet` write such pages as WARC response / WET
conversion records (warcio).
"""

from __future__ import annotations

import html as _html
import io
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MATH_STYLES = ("tex", "mathjax", "mathml_tex", "mathml_alttext", "mathml_bare")
"""How formulas are written: raw TeX, MathJax script, MathML + TeX annotation, MathML + alttext, MathML only."""

BOILERPLATE = [
    "Home", "About us", "Contact", "Forums", "Log in", "Sign up for free",
    "Subscribe to our newsletter for weekly updates", "We use cookies to improve your experience on this site",
    "Accept all cookies", "Related posts you might enjoy", "Most popular articles this week",
    "Copyright all rights reserved by the site owners", "Privacy policy and terms of service",
    "Follow us on social media", "Advertise with us", "Report a broken link to the webmaster",
]
"""The boilerplate sentences :func:`render` puts around the text (none of them occurs in real page texts used here)."""

FORMULA = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\$(.+?)\$|\\\((.+?)\\\)", re.S)
"""A LaTeX formula in text: display ($$..$$, \\[..\\]) or inline ($..$, \\(..\\))."""


def formulas(text: str) -> list[str]:
    """The TeX bodies of the formulas in ``text``, in order."""
    return [next(g for g in m.groups() if g is not None).strip() for m in FORMULA.finditer(text)]


_HELD = re.compile("\x00(\\d+)\x00")


def _mathml_symbols(tex: str) -> str:
    toks = re.findall(r"\\[A-Za-z]+|[A-Za-z]|\d+(?:\.\d+)?|\S", tex)
    out = []
    for t in toks:
        tag = "mn" if t[0].isdigit() else "mi" if t.isalpha() or t.startswith("\\") else "mo"
        out.append(f"<{tag}>{_html.escape(t.lstrip(chr(92)))}</{tag}>")
    return "<mrow>" + "".join(out) + "</mrow>"


def _formula_html(tex: str, display: bool, style: str) -> str:
    esc = _html.escape(tex)
    if style == "tex":
        return esc.join(("$$", "$$") if display else ("$", "$"))
    if style == "mathjax":  # script content is raw text in HTML: not entity-escaped
        raw = tex.replace("</", "<\\/")
        return f'<script type="math/tex{"; mode=display" if display else ""}">{raw}</script>'
    disp = ' display="block"' if display else ""
    body = _mathml_symbols(tex)
    if style == "mathml_tex":
        return (f'<math xmlns="http://www.w3.org/1998/Math/MathML"{disp}><semantics>{body}'
                f'<annotation encoding="application/x-tex">{esc}</annotation></semantics></math>')
    if style == "mathml_alttext":
        return f'<math xmlns="http://www.w3.org/1998/Math/MathML"{disp} alttext="{_html.escape(tex, quote=True)}">{body}</math>'
    if style == "mathml_bare":
        return f'<math xmlns="http://www.w3.org/1998/Math/MathML"{disp}>{body}</math>'
    raise ValueError(f"unknown math style {style!r}; one of {MATH_STYLES}")


def _paragraph(text: str, style: str) -> str:
    out, pos = [], 0

    def plain(t: str) -> str:
        return _html.escape(t).replace("\n", "<br>\n")
    for m in FORMULA.finditer(text):
        out.append(plain(text[pos:m.start()]))
        display = m.group(1) is not None or m.group(2) is not None
        out.append(_formula_html(next(g for g in m.groups() if g is not None).strip(), display, style))
        pos = m.end()
    out.append(plain(text[pos:]))
    return "".join(out)


LAYOUTS = ("semantic", "divs")
"""Page structure: HTML5 sections (header, nav, main, article, aside, footer) or the same as class-named divs."""


def render(text: str, *, title: str, rng: random.Random, math: str = "tex", layout: str = "semantic") -> str:
    """An HTML page holding ``text`` (paragraphs split on blank lines) amid boilerplate (see the module docstring);
    ``layout="divs"`` writes every section as a ``<div>`` with a class name, as older sites do."""
    nav = "".join(f'<li><a href="/{i}">{_html.escape(b)}</a></li>' for i, b in enumerate(BOILERPLATE[:6]))
    side = "".join(f'<li><a href="/post/{rng.randint(1, 999)}">{_html.escape(b)}</a></li>' for b in BOILERPLATE[9:11])
    held: list[str] = []

    def hold(m: re.Match[str]) -> str:  # formulas never split across paragraphs
        held.append(m.group(0))
        return f"\x00{len(held) - 1}\x00"
    chunks = [c for c in re.split(r"\n\s*\n", FORMULA.sub(hold, text)) if c.strip()]
    restored = [_HELD.sub(lambda m: held[int(m.group(1))], c).strip() for c in chunks]
    paras = "\n".join(f"<p>{_paragraph(c, math)}</p>" for c in restored)
    foot = "".join(f"<p>{_html.escape(b)}</p>" for b in BOILERPLATE[11:])
    if layout == "divs":
        return (
            "<html><head>"
            f"<title>{_html.escape(title)}</title><script>var _gaq=_gaq||[];</script></head><body>"
            f'<div id="cookies"><span>{BOILERPLATE[7]}</span> <a href="#">{BOILERPLATE[8]}</a></div>'
            f'<div id="top"><div class="menu"><ul>{nav}</ul></div></div>'
            f'<div id="wrapper"><div class="content"><div class="post"><h2>{_html.escape(title)}</h2>\n{paras}\n</div></div>'
            f'<div class="widget"><b>{BOILERPLATE[9]}</b><ul>{side}</ul></div></div>'
            f'<div id="bottom">{foot}</div></body></html>'
        )
    if layout != "semantic":
        raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_html.escape(title)}</title>"
        "<style>body{font-family:sans-serif} .nav li{display:inline}</style>"
        "<script>window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments)}</script>"
        '<script src="https://cdn.example.org/mathjax/tex-mml-chtml.js" async></script>'
        "</head><body>"
        f'<div class="cookie-banner" role="dialog"><p>{BOILERPLATE[7]}</p><button>{BOILERPLATE[8]}</button></div>'
        f'<header><nav class="nav"><ul>{nav}</ul></nav></header>'
        f'<main><article><h1>{_html.escape(title)}</h1>\n{paras}\n</article></main>'
        f'<aside class="sidebar"><h3>{BOILERPLATE[9]}</h3><ul>{side}</ul></aside>'
        f"<footer>{foot}</footer></body></html>"
    )


def _record_id(path: str | Path, n: int) -> str:
    """A record id fixed by the file name and position (warcio's default is a random UUID), so files are reproducible."""
    import uuid

    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{Path(path).name}#{n}')}>"


def write_warc(path: str | Path, pages: Iterable[dict[str, Any]]) -> int:
    """Write pages (``url``, ``html`` str, optional ``content_type``) as gzipped WARC response records."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    n = 0
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=str(path).endswith(".gz"))
        w.write_record(w.create_warcinfo_record(Path(path).name, {"software": "deepseekmath-pipeline tests"}))
        for page in pages:
            body = page["html"].encode("utf-8")
            ctype = page.get("content_type", "text/html; charset=utf-8")
            http = StatusAndHeaders("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))],
                                    protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(page["url"], "response", payload=io.BytesIO(body), http_headers=http,
                                                warc_headers_dict={"WARC-Record-ID": _record_id(path, n)}))
            n += 1
    return n


def write_wet(path: str | Path, pages: Iterable[dict[str, Any]]) -> int:
    """Write pages (``url``, ``text``) as gzipped WET conversion records (Common Crawl's extracted-text files)."""
    from warcio.warcwriter import WARCWriter

    n = 0
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=str(path).endswith(".gz"))
        for page in pages:
            body = page["text"].encode("utf-8")
            w.write_record(w.create_warc_record(page["url"], "conversion", payload=io.BytesIO(body),
                                                warc_headers_dict={"Content-Type": "text/plain",
                                                                   "WARC-Record-ID": _record_id(path, n)}))
            n += 1
    return n

"""HTML to text for crawl pages (WARC responses), keeping the math.

General-purpose extractors drop ``<script>`` elements and flatten MathML to its symbols, so the LaTeX of a
MathJax page (``<script type="math/tex">``) is lost, which is why OpenWebMath wrote its own extractor. Here a
math pass runs first, on the parsed tree (lxml), and turns every formula back into TeX text the extractor
then keeps like any other text:

- ``<script type="math/tex">x^2</script>`` -> ``$x^2$`` (``; mode=display`` -> ``$$x^2$$``);
- MathML ``<math>``: its TeX annotation (``<annotation encoding="application/x-tex">``, as KaTeX and many
  converters write it), else its ``alttext``, else its symbols in reading order, wrapped in ``$...$``;
- rendered copies (MathJax previews and output spans, KaTeX's HTML layer) are dropped, so a formula is not
  kept twice.

Then the main-content extractor removes navigation, headers, footers and other boilerplate:
``trafilatura`` (the default; chosen by the measurement in docs/results/corpus.md, ``tests/corpus/test_extract.py``)
or ``resiliparse`` (``pip install -e .[extract]``). ``html_to_text(html, "none")`` is the math pass plus all
visible text, for comparison.
"""

from __future__ import annotations

import re
from typing import Any

EXTRACTORS = ("trafilatura", "resiliparse", "none")
"""Extractor names accepted by :func:`html_to_text`."""

_RENDERED = re.compile(r"\b(MathJax_Preview|MathJax|MathJax_Display|MathJax_SVG|MJX_Assistive_MathML|katex-html)\b")
_TEX = ("application/x-tex", "tex", "latex", "text/tex", "application/x-latex")


def _decode(html: bytes | str, encoding: str | None) -> str:
    if isinstance(html, str):
        return html
    for enc in (encoding, "utf-8"):
        if enc:
            try:
                return html.decode(enc)
            except (LookupError, UnicodeDecodeError):
                continue
    return html.decode("utf-8", "replace")


def _local(tag: Any) -> str:
    return tag.rsplit("}", 1)[-1].lower() if isinstance(tag, str) else ""


def _mathml_tex(el: Any) -> str:
    for node in el.iter():
        if _local(node.tag) == "annotation" and (node.get("encoding") or "").lower() in _TEX and (node.text or "").strip():
            return node.text.strip()
    alt = (el.get("alttext") or "").strip()
    if alt:
        return alt
    parts = []
    for node in el.iter():
        if _local(node.tag) in ("annotation", "annotation-xml"):
            continue
        if _local(node.tag) in ("mi", "mn", "mo", "mtext", "ms") and node.text and node.text.strip():
            parts.append(node.text.strip())
    return " ".join(parts)


def math_to_tex(html: str) -> str:
    """``html`` with MathJax scripts and MathML replaced by ``$TeX$`` text (see the module docstring)."""
    if "math" not in html.lower():
        return html
    import lxml.html
    from lxml import etree

    try:
        root = lxml.html.document_fromstring(html)
    except (etree.ParserError, ValueError):
        return html
    for el in list(root.iter()):
        if el.getparent() is None or not isinstance(el.tag, str):
            continue
        name = _local(el.tag)
        cls = el.get("class") or ""
        if name == "script":
            typ = (el.get("type") or "").lower()
            if typ.startswith("math/tex"):
                tex = (el.text or "").strip()
                _replace(el, f"$${tex}$$" if "display" in typ else f"${tex}$", block="display" in typ)
        elif name == "math":
            tex = _mathml_tex(el)
            block = (el.get("display") or "").lower() == "block"
            _replace(el, (f"$${tex}$$" if block else f"${tex}$") if tex else "", block=block)
        elif name == "mjx-container" or (cls and _RENDERED.search(cls)):
            _replace(el, "", block=False)
    return lxml.html.tostring(root, encoding="unicode")


def _replace(el: Any, text: str, *, block: bool) -> None:
    """Replace ``el`` by ``text`` (kept in the parent's text flow; a block formula as its own ``<p>``)."""
    import lxml.html

    parent = el.getparent()
    tail = el.tail or ""
    if block and text:
        new = lxml.html.Element("p")
        new.text = text
        new.tail = tail
        parent.replace(el, new)
        return
    prev = el.getprevious()
    if prev is not None:
        prev.tail = (prev.tail or "") + text + tail
    else:
        parent.text = (parent.text or "") + text + tail
    parent.remove(el)


def _trafilatura(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False, include_tables=True, favor_recall=True, deduplicate=False) or ""


def _resiliparse(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=True, alt_texts=False, links=False, list_bullets=False)


def _visible(html: str) -> str:
    import lxml.html

    root = lxml.html.document_fromstring(html)
    for el in list(root.iter("script", "style", "noscript", "template")):
        if el.getparent() is not None:
            el.drop_tree()
    return re.sub(r"\n\s*\n+", "\n\n", root.text_content()).strip()


def html_to_text(html: bytes | str, extractor: str = "trafilatura", *, encoding: str | None = None, math: bool = True) -> str:
    """The main text of an HTML page (``encoding``: the HTTP charset, when known; ``math``: run the math pass)."""
    doc = _decode(html, encoding)
    if not doc.strip():
        return ""
    if math:
        doc = math_to_tex(doc)
    if extractor == "trafilatura":
        return _trafilatura(doc)
    if extractor == "resiliparse":
        return _resiliparse(doc)
    if extractor == "none":
        return _visible(doc)
    raise ValueError(f"unknown extractor {extractor!r}; one of {EXTRACTORS}")

"""HTML to text: the math pass keeps formulas as TeX; the chosen extractor keeps the text and drops boilerplate
on real texts (../shared/data) wrapped in web pages (benchmarks/extractors.py measures the full comparison)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.corpus.extract import html_to_text, math_to_tex


def test_math_pass_turns_scripts_and_mathml_into_tex() -> None:
    html = (
        "<html><body><article><p>Let <script type='math/tex'>x^2 < 4</script> and</p>"
        "<script type='math/tex; mode=display'>\\sum_k k = \\frac{n(n+1)}{2}</script>"
        "<span class='MathJax_Preview'>x2</span>"
        "<p>KaTeX: <span class='katex'><math><semantics><mrow><mi>y</mi></mrow>"
        "<annotation encoding='application/x-tex'>y_1</annotation></semantics></math>"
        "<span class='katex-html'>y1</span></span> alt: <math alttext='\\alpha'><mi>α</mi></math>"
        " bare: <math><mi>z</mi><mo>+</mo><mn>1</mn></math>.</p></article></body></html>")
    out = math_to_tex(html)
    for tex in ("$x^2 &lt; 4$", "$$\\sum_k k = \\frac{n(n+1)}{2}$$", "$y_1$", "$\\alpha$", "$z + 1$"):
        assert tex in out, tex
    assert "x2" not in out and "y1" not in out  # rendered copies dropped
    text = html_to_text(html, "none")
    assert "$x^2 < 4$" in text and "<script" not in text


def test_plain_pages_pass_through_and_bad_extractor_is_an_error() -> None:
    assert math_to_tex("<p>no formulas here</p>") == "<p>no formulas here</p>"
    assert html_to_text(b"", "trafilatura") == ""
    with pytest.raises(ValueError, match="unknown extractor"):
        html_to_text("<p>x</p>", "nope")


@pytest.mark.parametrize("layout", ["semantic", "divs"])
def test_trafilatura_with_math_pass_on_real_texts(shared_data: Path, layout: str) -> None:
    from benchmarks.extractors import run, texts

    pages = texts(shared_data, 30)
    for style in ("mathjax", "mathml_tex", "mathml_alttext"):
        with_pass = run(pages, "trafilatura", True, style, layout)
        assert with_pass["latex_survival"] >= 0.99 and with_pass["text_recall"] >= 0.9, with_pass
        assert with_pass["boilerplate_kept"] <= 0.05, with_pass
    without = run(pages, "trafilatura", False, "mathjax", layout)
    assert without["latex_survival"] <= 0.5  # what the math pass is for

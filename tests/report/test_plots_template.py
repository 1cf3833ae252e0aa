"""The offline ``dvc plots`` page template (stages/report/plots_template.py): it keeps DVC's ``{plot_divs}``, has no
``{scripts}`` (where DVC puts its CDN tags) and no script from elsewhere; and in headless chromium with every host
name unresolvable, ``dvc plots show`` draws its Vega plot with the template and draws nothing with DVC's own page
(the control: the same check fails there, and that page asks cdn.jsdelivr.net for vega)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stages.report import plots_template


def _run(cmd: list[str], cwd: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def _repo(tmp_path: Path) -> Path:
    """A git + DVC repository with one TSV of a falling loss."""
    _run(["git", "init", "-q"], tmp_path)
    _run(["dvc", "init", "-q"], tmp_path)
    (tmp_path / "loss.tsv").write_text("step\tloss\n" + "".join(f"{i}\t{1 / (i + 1):.3f}\n" for i in range(20)))
    return tmp_path


def test_template_keeps_plot_divs_and_loads_nothing(tmp_path: Path) -> None:
    path = plots_template.install(_repo(tmp_path))
    assert path == tmp_path / ".dvc" / plots_template.NAME
    page = path.read_text()
    assert "{plot_divs}" in page and "{scripts}" not in page
    assert re.findall(r"<script\b[^>]*>", page) == ["<script>", '<script type="module">']  # inline only, no src
    assert "vegaEmbed" in page and len(page) > 500_000  # the bundled libraries
    assert "html_template = plots-offline.html" in (tmp_path / ".dvc" / "config.local").read_text()


@pytest.mark.browser
def test_dvc_plots_show_draws_offline(browser: tuple[str, str], tmp_path: Path) -> None:
    from stages.report.browser import render

    repo = _repo(tmp_path)
    drawn = ("Array.from(document.querySelectorAll('body > div[id]'), "  # vega's marks: one canvas per plot div
             "d => d.querySelectorAll('canvas.marks, svg.marks').length)")
    page = repo / "dvc_plots" / "index.html"

    _run(["dvc", "plots", "show", "loss.tsv", "-x", "step", "-y", "loss"], repo)  # no template yet: DVC's own page
    default = render(page, timeout_s=3, ready=f"{drawn}.every(n => n > 0)")
    assert default.ready is False
    assert any(u.startswith("https://cdn.jsdelivr.net/npm/vega") for u in default.fetched)

    plots_template.install(repo)
    _run(["dvc", "plots", "show", "loss.tsv", "-x", "step", "-y", "loss"], repo)
    r = render(page, ready=f"{drawn}.every(n => n > 0) && {drawn}")
    assert r.problems() == []  # nothing fetched, no console error
    assert r.ready == [1]

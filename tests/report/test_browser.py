"""The report page in Debian's headless chromium (CI: REQUIRE_BROWSER=1 makes a missing browser a failure):
every image loaded, no console errors, nothing fetched from the network, a screenshot written. A broken page
shows each problem, so the check is not vacuous."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages import report
from stages.params import load_params
from stages.report.browser import render
from tests.report.fake_run import write_fake_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.browser


def test_report_renders_cleanly_offline(browser: tuple[str, str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_fake_run(tmp_path)
    metrics = report.run(load_params(ROOT / "params.yaml").report)
    shot = tmp_path / "report.png"
    r = render(tmp_path / "data/report/index.html", shot)
    assert r.problems() == []
    assert r.images == metrics["figures"] == 9
    assert r.title == "DeepSeekMath pipeline: the tiny default run"
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 50_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 1000 and height >= r.height_px > 3000  # the whole page, not one viewport


def test_a_broken_page_shows_every_problem(browser: tuple[str, str], tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><title>t</title><link rel="icon" href="data:,"></head><body>'
                    '<img alt="bad png" src="data:image/png;base64,iVBORw0KGgoAAAA=">'
                    '<img alt="remote" src="https://example.invalid/x.png">'
                    '<script>console.error("boom")</script></body></html>')
    r = render(page, None)
    assert r.images == 2 and sorted(r.broken_images) == ["bad png", "remote"]
    assert any("boom" in e for e in r.console_errors)
    assert r.fetched == ["https://example.invalid/x.png"]

"""Render the report in headless Chromium and check it: every image loaded, no console errors, nothing fetched
from the network; write a screenshot. Not part of the stage (dvc.yaml does not list it; it needs a browser):
the tests (tests/report/test_browser.py), CI and the committed screenshot docs/img/report.png use it.

Run: ``python -m stages.report.browser data/report/index.html --screenshot report.png`` (exit 1 on a problem).

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/setup`` installs them with apt-get where it can) and
selenium (the ``dev`` extra). ``$CHROMIUM`` / ``$CHROMEDRIVER`` override the executables' paths. No browser is
downloaded: selenium is given both paths, so its driver manager never runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Headless on a machine without a display, a GPU or a network: no sandbox (root in CI), no GPU process, and no
# background connections (QUIC, component updates, sync, first-run pings), which a closed network refuses many at a
# time; every host name resolves to nothing, so a page that fetched anything would show it as a console error.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND")


def find_browser() -> tuple[str, str] | None:
    """(chromium, chromedriver) executables, or None when either is missing."""
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@dataclass
class Rendered:
    """What the browser saw."""

    images: int
    broken_images: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    """URLs of resources the page loaded that are not ``data:`` URIs (must be none)."""
    title: str = ""
    height_px: int = 0
    screenshot: Path | None = None
    ready: object = None
    """The last value of ``render``'s ``ready`` expression (None without one)."""

    def problems(self) -> list[str]:
        """One line per problem (empty: the page rendered cleanly)."""
        out = [f"image not loaded: {b}" for b in self.broken_images]
        out += [f"console error: {e}" for e in self.console_errors]
        out += [f"fetched from outside the page: {u}" for u in self.fetched]
        return out


def render(html: str | os.PathLike[str], screenshot: str | os.PathLike[str] | None = None, width: int = 1200,
           full_page: bool = True, timeout_s: float = 30.0, ready: str = "true") -> Rendered:
    """Open ``html`` (a file) in headless Chromium, wait for it to load (and for the JavaScript expression ``ready``
    to be truthy: a page that draws after loading), check it and optionally write a PNG screenshot (the whole page
    when ``full_page``, else one ``width`` x 900 viewport)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_browser()
    if found is None:
        raise RuntimeError("chromium and chromedriver not found: apt-get install chromium chromium-driver "
                           "(bash .ci/setup does), or set $CHROMIUM and $CHROMEDRIVER")
    chromium, chromedriver = found
    with tempfile.TemporaryDirectory(prefix="report-chromium-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for f in CHROMIUM_FLAGS:
            opts.add_argument(f)
        opts.add_argument(f"--user-data-dir={profile}")
        opts.add_argument(f"--window-size={width},900")
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
        try:
            driver.set_page_load_timeout(timeout_s)
            driver.get(Path(html).resolve().as_uri())
            deadline = time.monotonic() + timeout_s
            loaded = "document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"
            while time.monotonic() < deadline and not driver.execute_script(f"return {loaded} && ({ready})"):
                time.sleep(0.1)
            images = driver.execute_script(
                "return Array.from(document.images).map(i => [i.alt || i.src.slice(0, 60), i.naturalWidth])")
            fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            height = int(driver.execute_script("return document.documentElement.scrollHeight"))
            out = Rendered(images=len(images), broken_images=[alt for alt, w in images if not w],
                           fetched=[u for u in fetched if not u.startswith("data:")], title=driver.title,
                           height_px=height, ready=driver.execute_script(f"return {ready}"))
            if screenshot is not None:
                if full_page:  # a viewport as tall as the page (DevTools protocol), then one screenshot
                    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
                driver.save_screenshot(str(screenshot))
                out.screenshot = Path(screenshot)
            out.console_errors = [e.get("message", "") for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        finally:
            driver.quit()
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: render, print what was seen, exit 1 on any problem."""
    ap = argparse.ArgumentParser(prog="python -m stages.report.browser", description=__doc__.split("\n")[0])
    ap.add_argument("html", nargs="?", default="data/report/index.html", help="the page (default: %(default)s)")
    ap.add_argument("--screenshot", help="write a PNG screenshot here")
    ap.add_argument("--width", type=int, default=1200, help="window width in pixels (default: %(default)s)")
    ap.add_argument("--viewport", action="store_true", help="screenshot one viewport, not the whole page")
    args = ap.parse_args(argv)
    if not Path(args.html).is_file():
        print(f"error: {args.html}: not found; build it with dvc repro report")
        return 2
    r = render(args.html, args.screenshot, width=args.width, full_page=not args.viewport)
    print(f"{args.html}: title {r.title!r}, {r.images} images, {r.height_px} px tall"
          + (f", screenshot {r.screenshot}" if r.screenshot else ""))
    for line in r.problems():
        print(f"  {line}")
    return 1 if r.problems() else 0


if __name__ == "__main__":
    raise SystemExit(main())

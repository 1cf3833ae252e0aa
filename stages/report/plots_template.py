"""A ``dvc plots show`` / ``dvc plots diff`` page template that draws the Vega plots offline.

DVC's own page (dvc_render's ``PAGE_HTML``) loads vega, vega-lite and vega-embed from cdn.jsdelivr.net through its
``{scripts}`` placeholder, so offline every Vega plot is blank. This template has no ``{scripts}`` (DVC then inserts
no CDN tags); it inlines the three libraries, bundled by ``vl_convert.javascript_bundle`` (vl-convert-python, the
Vega project's converter). Each plot div calls ``vegaEmbed('#id', spec)`` in an inline script while the page
loads; a shim in ``<head>`` queues those calls, and the bundle (a module script, run after the page is parsed)
renders the queue.

``python -m stages.report.plots_template`` (``.ci/setup`` runs it) writes the template to ``.dvc/plots-offline.html``
(git-ignored: ~0.9 MB, derived from the installed package) and sets ``plots.html_template`` in ``.dvc/config.local``.
Both are local, so a clone that never ran it gets DVC's default (CDN) page instead of an error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stages.core.io import write_text

NAME = "plots-offline.html"
"""The template's file name under ``.dvc/`` (``plots.html_template`` is relative to ``.dvc/``)."""

_SHIM = "window.dvcPlotsQueue = []; window.vegaEmbed = (id, spec) => window.dvcPlotsQueue.push([id, spec]);"
_SNIPPET = "window.vegaEmbed = vegaEmbed; for (const [id, spec] of window.dvcPlotsQueue) vegaEmbed(id, spec);"


def page() -> str:
    """The template: DVC fills ``{refresh_tag}`` and ``{plot_divs}`` (``str.replace``, so the bundle's braces stay)."""
    import vl_convert

    bundle = vl_convert.javascript_bundle(_SNIPPET)
    return ("<!DOCTYPE html>\n<html>\n<head>\n{refresh_tag}\n<meta charset=\"utf-8\">\n<title>DVC Plot</title>\n"
            f"<script>{_SHIM}</script>\n<script type=\"module\">\n{bundle}\n</script>\n"
            "<style>table { border-spacing: 15px; }</style>\n</head>\n<body>\n{plot_divs}\n</body>\n</html>\n")


def install(repo: str | Path = ".") -> Path:
    """Write the template to ``<repo>/.dvc/plots-offline.html`` and point ``plots.html_template`` (local config) at
    it; returns the template's path."""
    from dvc.config import Config

    dvc_dir = Path(repo) / ".dvc"
    if not dvc_dir.is_dir():
        raise SystemExit(f"error: {Path(repo).resolve()} is no DVC repository (no .dvc/): run dvc init, or pass --repo")
    path = dvc_dir / NAME
    write_text(path, page())
    with Config(dvc_dir=str(dvc_dir)).edit("local") as conf:
        conf["plots"]["html_template"] = NAME
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.report.plots_template", description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=".", help="the DVC repository (default: the current directory)")
    path = install(ap.parse_args(argv).repo)
    print(f"{path}: dvc plots show / diff now draw their Vega plots offline (plots.html_template in .dvc/config.local)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Test projects start as a fresh clone would, also when the checkout ran the pipeline before the tests (issue 35):
tests/flows/_project.py copies the sources, work in progress included, and none of what a run wrote."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.flows._project import GIT, copy_sources, source_files


def test_copies_leave_out_what_a_run_wrote(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "stages").mkdir(parents=True)
    (src / "stages" / "a.py").write_text("x = 1\n")
    (src / ".gitignore").write_text("/data/*\n!/data/metrics/\ncheckpoints/\n")
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    subprocess.run(["git", "add", "-A"], cwd=src, check=True)
    subprocess.run(GIT + ["commit", "-qm", "init"], cwd=src, check=True)
    (src / "stages" / "new.py").write_text("y = 2\n")  # not committed yet: a test must see it
    (src / "dvc.lock").write_text("schema: '2.0'\n")  # what `python -m flows.pipeline` leaves behind
    (src / "data" / "metrics").mkdir(parents=True)
    (src / "data" / "metrics" / "corpus.json").write_text("{}\n")
    (src / "checkpoints").mkdir()
    (src / "checkpoints" / "x").write_text("")
    assert sorted(source_files(src)) == [".gitignore", "stages/a.py", "stages/new.py"]
    dst = copy_sources(tmp_path / "dst", src)
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file()) == \
        [".gitignore", "stages/a.py", "stages/new.py"]

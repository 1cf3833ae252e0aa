"""stages.core.io: the hashes of a run's outputs that must be the same bytes on every run."""

from __future__ import annotations

import hashlib
from pathlib import Path

from stages.core.io import output_hashes


def test_output_hashes_cover_data_and_the_lock_but_not_the_timings(tmp_path: Path) -> None:
    (tmp_path / "data" / "models" / "sft").mkdir(parents=True)
    (tmp_path / "data" / "timings").mkdir()
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    (tmp_path / "data" / "models" / "sft" / "model.bin").write_bytes(b"\x00\x01")
    (tmp_path / "data" / "timings" / "sft.json").write_text('{"wall_s": 1.0}')
    got = output_hashes(tmp_path)
    assert got == {"dvc.lock": hashlib.md5(b"schema: '2.0'\n").hexdigest(),
                   "data/models/sft/model.bin": hashlib.md5(b"\x00\x01").hexdigest()}
    (tmp_path / "data" / "timings" / "sft.json").write_text('{"wall_s": 2.0}')  # a new timing changes nothing
    assert output_hashes(tmp_path) == got
    (tmp_path / "data" / "models" / "sft" / "model.bin").write_bytes(b"\x00\x02")  # a new output byte does
    assert output_hashes(tmp_path)["data/models/sft/model.bin"] != got["data/models/sft/model.bin"]


def test_a_deadline_is_a_setting_not_a_timing() -> None:
    """The answer checker's deadline (``timeout_s``) stays in the details, where the report reads it; measured
    durations go to data/timings."""
    from stages.core.io import split_timings

    res, tim = split_timings({"checker": {"version": "2", "timeout_s": 5.0}, "wall_s": 12.3, "acc": 0.5})
    assert res == {"checker": {"version": "2", "timeout_s": 5.0}, "acc": 0.5}
    assert tim == {"wall_s": 12.3}

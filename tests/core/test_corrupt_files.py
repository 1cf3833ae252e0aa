"""Corrupt input files are one-line errors naming the file (and the rows), and model weights are checked by the stage
that takes them (issue 28, item 4): Parquet with an intact footer and a corrupt data page, a truncated ``datasets``
directory, a truncated safetensors file, a checkpoint without one of its tensors, a corrupt tokenizer.json, a
truncated pytorch_model.bin. Each was a traceback, or passed the base_model stage and failed a later one."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from stages import base_model
from stages.core.errors import PipelineError
from stages.core.ingestion import read_source
from stages.core.model_files import model_dir_problem, safetensors_header
from stages.core.modeling import load_tokenizer, save_model
from stages.corpus.shards import iter_pages, plan_shards
from tests.test_base_model import TEXTS, _params


def _one_line(e: pytest.ExceptionInfo, *parts: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg and all(p in msg for p in parts), msg
    return msg


def _corrupt_parquet(path: Path, rows: int = 3000) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": [f"page {i} " * 20 for i in range(rows)], "url": [f"u{i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=1000)
    off = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    with open(path, "r+b") as f:  # the second row group's first page header: the footer stays intact
        f.seek(off)
        f.write(b"\xff" * 48)
    assert pq.ParquetFile(path).metadata.num_rows == rows  # the footer still reads
    return path


def test_parquet_with_a_corrupt_data_page_names_the_file_and_the_rows(tmp_path):
    f = _corrupt_parquet(tmp_path / "train.parquet")
    with pytest.raises(PipelineError) as e:
        list(read_source(f))
    _one_line(e, str(f), "rows from 1000 (row group 1)", "corrupt Parquet data")
    assert len(list(itertools.islice(read_source(f), 1000))) == 1000  # the rows before it read


def test_the_corpus_reader_too(tmp_path):
    f = _corrupt_parquet(tmp_path / "crawl.parquet")
    with pytest.raises(PipelineError) as e:
        for shard in plan_shards(f, 3):
            list(iter_pages(shard))
    _one_line(e, str(f), "rows from 1000 (row group 1)", "corrupt Parquet data")


def test_a_truncated_datasets_directory(tmp_path):
    import datasets

    d = tmp_path / "ds"
    datasets.Dataset.from_dict({"question": [f"q{i}" for i in range(2000)], "answer": ["1"] * 2000}).save_to_disk(d)
    arrow = next(d.glob("*.arrow"))
    with open(arrow, "r+b") as f:
        f.truncate(arrow.stat().st_size // 2)
    with pytest.raises(PipelineError) as e:
        list(read_source(d))
    _one_line(e, str(d), "datasets")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "m"
    tok = base_model.train_tokenizer(TEXTS, 400)
    save_model(base_model.init_model(_params(), tok), tok, d)
    return d


def _copy(ckpt: Path, tmp_path: Path) -> Path:
    out = tmp_path / "broken"
    shutil.copytree(ckpt, out)
    return out


def _base_model_refuses(path: Path, monkeypatch, tmp_path, *parts: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError) as e:
        base_model.run(_params(checkpoint=str(path)))
    _one_line(e, "base_model.checkpoint", str(path), *parts)
    assert not (tmp_path / "data" / "models" / "base").exists()  # no reference written for later stages


def test_a_safetensors_file_truncated_to_half_stops_the_base_model_stage(ckpt, tmp_path, monkeypatch):
    m = _copy(ckpt, tmp_path)
    f = m / "model.safetensors"
    with open(f, "r+b") as h:
        h.truncate(f.stat().st_size // 2)
    assert "corrupt model.safetensors: truncated" in model_dir_problem(m)
    _base_model_refuses(m, monkeypatch, tmp_path, "truncated")


def test_a_checkpoint_without_one_of_its_tensors(ckpt, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    m = _copy(ckpt, tmp_path)
    sd = load_file(m / "model.safetensors")
    gone = next(k for k in sd if "layers.0.mlp" in k)
    del sd[gone]
    save_file(sd, m / "model.safetensors", metadata={"format": "pt"})
    assert model_dir_problem(m) is None  # an intact file: only the config tells a tensor is missing
    _base_model_refuses(m, monkeypatch, tmp_path, "lacks 1 tensor(s) its config needs", gone)


def test_a_tensor_of_the_wrong_shape(ckpt, tmp_path, monkeypatch):
    m = _copy(ckpt, tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (m / "config.json").write_text(json.dumps(cfg))
    _base_model_refuses(m, monkeypatch, tmp_path, "wrong shape")


def test_a_corrupt_tokenizer_file(ckpt, tmp_path, monkeypatch):
    m = _copy(ckpt, tmp_path)
    text = (m / "tokenizer.json").read_text()
    (m / "tokenizer.json").write_text(text[: len(text) // 2])
    assert "corrupt tokenizer.json" in model_dir_problem(m)
    _base_model_refuses(m, monkeypatch, tmp_path, "corrupt tokenizer.json")
    with pytest.raises(PipelineError) as e:
        load_tokenizer(m)
    _one_line(e, str(m), "corrupt tokenizer.json")
    (m / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": 5}}))  # JSON, not a tokenizer
    with pytest.raises(PipelineError) as e:
        load_tokenizer(m)
    _one_line(e, str(m), "cannot load the tokenizer")


def test_a_truncated_pytorch_bin_and_a_bad_header(ckpt, tmp_path):
    import torch
    from safetensors.torch import load_file

    m = _copy(ckpt, tmp_path)
    sd = load_file(m / "model.safetensors")
    (m / "model.safetensors").unlink()
    torch.save(sd, m / "pytorch_model.bin")
    assert model_dir_problem(m) is None
    with open(m / "pytorch_model.bin", "r+b") as f:
        f.truncate((m / "pytorch_model.bin").stat().st_size // 2)
    assert "corrupt pytorch_model.bin" in model_dir_problem(m)
    bad = tmp_path / "x.safetensors"
    bad.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header claims 1000000000 bytes"):
        safetensors_header(bad)

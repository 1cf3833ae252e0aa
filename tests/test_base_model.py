"""base_model: digit-level BPE tokenizer, tiny Llama init, real-mode reference, bad sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages import base_model
from stages.core.errors import PipelineError
from stages.core.modeling import load_model, load_tokenizer, resolve_model, save_model
from stages.params import BaseModelParams, resolve
from stages.schema.base import validate_section

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [f"Tom has {i} apples. He buys {i * 3 % 17} more: {i} + {i * 3 % 17} = {i + i * 3 % 17}." for i in range(300)]


def _params(**kw: object) -> BaseModelParams:
    raw = resolve(ROOT / "params.yaml")["base_model"]
    raw.update(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, num_kv_heads=2, vocab_size=400)
    raw.update(kw)
    return BaseModelParams.model_validate(raw)


def test_tokenizer_splits_digits_and_round_trips() -> None:
    tok = base_model.train_tokenizer(TEXTS, 400)
    ids = tok("He has 1234 apples.")["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[0] == "<s>"
    assert [p for p in pieces if p.isdigit()] == ["1", "2", "3", "4"]
    assert tok.decode(ids, skip_special_tokens=True) == "He has 1234 apples."
    assert tok.eos_token == "</s>" and tok.pad_token == "<pad>"


def test_model_matches_tokenizer_and_saves_as_hf_dir(tmp_path: Path) -> None:
    tok = base_model.train_tokenizer(TEXTS, 400)
    model = base_model.init_model(_params(), tok)
    assert model.config.vocab_size == len(tok)
    assert model.config.hidden_size // model.config.num_attention_heads == 32
    save_model(model, tok, tmp_path / "m")
    again = load_model(tmp_path / "m")
    assert load_tokenizer(tmp_path / "m").padding_side == "left"
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert (a == b).all()


def test_same_seed_same_weights() -> None:
    tok = base_model.train_tokenizer(TEXTS, 400)
    a = base_model.init_model(_params(), tok).state_dict()
    b = base_model.init_model(_params(), tok).state_dict()
    c = base_model.init_model(_params(seed=1), tok).state_dict()
    assert all((a[k] == b[k]).all() for k in a)
    assert any((a[k] != c[k]).any() for k in a)


@pytest.mark.parametrize(("kw", "match"), [
    (dict(hidden_size=100, num_heads=3, num_kv_heads=3), "must divide"),
    (dict(hidden_size=40, num_heads=2, num_kv_heads=2), "head size"),
])
def test_bad_shapes_are_one_line_errors(kw: dict, match: str) -> None:
    """Refused when params are loaded (before any stage runs), in one line naming the section."""
    raw = {"base_model": {**_params().model_dump(), **kw}}
    with pytest.raises(PipelineError, match=match) as e:
        validate_section(BaseModelParams, raw, "params.yaml")
    assert str(e.value).startswith("params.yaml: base_model") and "\n" not in str(e.value)


def test_real_mode_writes_a_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = base_model.train_tokenizer(TEXTS, 400)
    save_model(base_model.init_model(_params(), tok), tok, tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    metrics = base_model.run(_params(checkpoint=str(tmp_path / "ckpt")))
    assert metrics["mode"] == "checkpoint" and metrics["model_type"] == "llama"
    ref = json.loads((tmp_path / "data/models/base/model_ref.json").read_text())
    assert ref == {"path": str(tmp_path / "ckpt"), "prompt_format": "deepseekmath"}
    assert resolve_model(tmp_path / "data/models/base") == str(tmp_path / "ckpt")
    assert load_model(tmp_path / "data/models/base").config.hidden_size == 64

"""stages/core/hardware.py: what ``precision: auto`` resolves to on a CPU with and without AMX, and the record the
training stages write (issue 35: runs on different CPUs must say which made them)."""

from __future__ import annotations

import pytest

from stages.core import hardware
from stages.train.update import use_bf16


def test_auto_is_bf16_on_a_cpu_with_avx512_bf16_without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "has_amx", lambda: False)
    monkeypatch.setattr(hardware, "has_avx512_bf16", lambda: True)
    monkeypatch.setattr(hardware, "cpu_capability", lambda: "AVX512")
    assert hardware.resolve_precision("auto", "cpu") == "bf16"
    assert hardware.fast_bf16("cpu") == (True, "CPU with AVX512_BF16 (AVX512)")
    assert hardware.fast_bf16_generation("cpu") == (False, "CPU without AMX (AVX512)")  # generation stays fp32


@pytest.mark.parametrize("amx", [True, False])
def test_auto_is_bf16_only_where_the_cpu_has_amx(amx: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "has_amx", lambda: amx)
    monkeypatch.setattr(hardware, "has_avx512_bf16", lambda: False)
    monkeypatch.setattr(hardware, "cpu_capability", lambda: "AVX512" if amx else "AVX2")
    assert hardware.resolve_precision("auto", "cpu") == ("bf16" if amx else "fp32")
    assert use_bf16("auto", hardware.torch.device("cpu")) is amx  # the training loop's decision is the same
    assert hardware.resolve_precision("fp32", "cpu") == "fp32" and hardware.resolve_precision("bf16", "cpu") == "bf16"
    rec = hardware.record("cpu", "auto", amx)
    assert rec == {"precision": "bf16" if amx else "fp32",
                   "precision_from": "auto: CPU with AMX (AVX512)" if amx else "auto: CPU without AMX or AVX512_BF16 (AVX2)",
                   "device": f"cpu ({'AVX512, AMX' if amx else 'AVX2'})"}
    assert hardware.record("cpu", "fp32", False)["precision_from"] == "params"
    if amx:  # grpo / reward_model outside DeepSpeed train in fp32 even where auto would be bf16
        assert hardware.record("cpu", "auto", False)["precision_from"].startswith("auto: fp32 outside DeepSpeed")


def test_generation_record_names_the_backend_and_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "has_amx", lambda: False)
    monkeypatch.setattr(hardware, "has_avx512_bf16", lambda: False)
    monkeypatch.setattr(hardware, "cpu_capability", lambda: "AVX2")
    rec = hardware.generation_record("auto", "float32", "hf")
    assert rec["dtype"] == "float32" and rec["generation_backend"] == "hf"
    assert rec["dtype_from"] == ("auto: CUDA GPU with bf16" if hardware.torch.cuda.is_available()
                                 else "auto: CPU without AMX (AVX2)")


def test_a_capped_onednn_isa_resolves_auto_as_that_cpu_kind_would(monkeypatch) -> None:
    """ONEDNN_MAX_CPU_ISA=AVX2 (the AVX2 emulation of docs/pipeline.md): no AMX, no AVX512_BF16, so fp32."""
    from stages.core import hardware

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    for f in (hardware.has_amx, hardware.has_avx512_bf16):
        f.cache_clear()
    try:
        assert not hardware.has_amx() and not hardware.has_avx512_bf16()
        assert hardware.resolve_precision("auto", "cpu") == "fp32"
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
        assert hardware._isa_allows("AVX10_1_512_AMX") and hardware._isa_allows("AVX512_CORE_BF16")
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_bf16")
        assert hardware._isa_allows("AVX512_CORE_BF16") and not hardware._isa_allows("AVX10_1_512_AMX")
    finally:
        for f in (hardware.has_amx, hardware.has_avx512_bf16):
            f.cache_clear()

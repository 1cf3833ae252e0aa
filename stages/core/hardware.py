"""The machine's part in a run: what ``precision: auto`` resolves to here, and why.

``auto`` values are resolved by the hardware: bf16 where bf16 matmuls are fast (CUDA GPUs with bf16; CPUs with AMX
tiles or the AVX512_BF16 instructions, whose oneDNN kernels run bf16 matmuls several times faster than fp32), else
fp32; the ``vllm`` generation backend where a CUDA GPU and vllm are present (stages/core/generation.py
``resolve_backend``). So the same params give different runs on different machines (other run times and held-out
accuracies; docs/pipeline.md). Every stage that trains records :func:`record` in its metrics (``hardware``:
git-tracked, hashed in dvc.lock, shown by ``dvc metrics show`` and ``dvc exp show``) and in its model directory
(``pipeline.json``, a DVC output), and the stages that generate record the resolved backend and dtype, so runs made on
different hardware are told apart.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch


@functools.cache
def cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels use here (``AVX512``, ``AVX2``, ``DEFAULT``...)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - an old torch: unknown
        return "unknown"


_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512")


def _isa_allows(isa: str) -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` (oneDNN's cap on the instructions its kernels use; unset or ``ALL``: none)
    admits ``isa``: a run capped to AVX2 (with ``ATEN_CPU_CAPABILITY=avx2`` and ``MKL_ENABLE_INSTRUCTIONS=AVX2``,
    how docs/pipeline.md emulates an AVX2 machine) resolves ``auto`` as one would."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return cap not in _ONEDNN_ISAS or _ONEDNN_ISAS.index(cap) >= _ONEDNN_ISAS.index(isa)


@functools.cache
def has_amx() -> bool:
    """Whether the CPU has AMX tiles (what makes bf16 matmuls fast on a CPU) that oneDNN may use."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()) and _isa_allows("AVX10_1_512_AMX")


@functools.cache
def has_avx512_bf16() -> bool:
    """Whether the CPU has the AVX512_BF16 instructions (bf16 dot products: oneDNN's bf16 matmuls run faster than fp32
    on them; Linux's /proc/cpuinfo flags, False where it cannot be read or oneDNN may not use them)."""
    if not _isa_allows("AVX512_CORE_BF16"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512_bf16" in line.split()
    except OSError:
        pass
    return False


def fast_bf16(device: torch.device | str) -> tuple[bool, str]:
    """(whether bf16 matmuls are fast on ``device``, why): CUDA with bf16 support; a CPU with AMX or AVX512_BF16."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = bool(torch.cuda.is_bf16_supported())
        return ok, f"CUDA GPU {'with' if ok else 'without'} bf16"
    if has_amx():
        return True, f"CPU with AMX ({cpu_capability()})"
    if has_avx512_bf16():
        return True, f"CPU with AVX512_BF16 ({cpu_capability()})"
    return False, f"CPU without AMX or AVX512_BF16 ({cpu_capability()})"


def fast_bf16_generation(device: torch.device | str) -> tuple[bool, str]:
    """(whether bf16 generation is faster than fp32 on ``device``, why): CUDA with bf16; a CPU with AMX only. On an
    AVX512_BF16 CPU without AMX, generation is slower in bf16 than in fp32: its small decode matmuls gain less than
    the conversions cost."""
    device = torch.device(device)
    if device.type == "cuda" or has_amx():
        return fast_bf16(device)
    return False, f"CPU without AMX ({cpu_capability()})"


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``bf16`` / ``fp32`` as given; ``auto``: bf16 where :func:`fast_bf16`, else fp32."""
    if precision != "auto":
        return precision
    return "bf16" if fast_bf16(device)[0] else "fp32"


def describe_device(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({cpu_capability()}{', AMX' if has_amx() else ''})"


def record(device: torch.device | str, precision: str, bf16: bool) -> dict[str, Any]:
    """What a training stage records: the precision it trained in (``bf16`` from the params value ``precision`` as
    the stage resolved it), where that came from (``params``, or ``auto`` and the capability that decided), and the
    device. ``{"precision": "fp32", "precision_from": "auto: CPU without AMX or AVX512_BF16 (AVX2)", "device": "cpu (AVX2)"}``."""
    fast, why = fast_bf16(device)
    if precision != "auto":
        source = "params"
    elif bf16 == fast:
        source = f"auto: {why}"
    else:  # auto, fast bf16, but the stage's plain PyTorch path trains in fp32 (bf16 applies under DeepSpeed)
        source = f"auto: fp32 outside DeepSpeed ({why})"
    return {"precision": "bf16" if bf16 else "fp32", "precision_from": source, "device": describe_device(device)}


def generation_record(dtype: str, resolved_dtype: str, backend: str) -> dict[str, Any]:
    """What a stage that generates records: the weights' dtype it sampled in (and where it came from), the backend
    ``auto`` resolved to, and the device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    source = "params" if dtype != "auto" else f"auto: {fast_bf16_generation(device)[1]}"
    return {"dtype": resolved_dtype, "dtype_from": source, "generation_backend": backend,
            "device": describe_device(device)}


def rl_record(precision: str, deepspeed: bool, device: torch.device | str, backend: str) -> dict[str, Any]:
    """:func:`record` of GRPO's update (stages/rl/update.py: DeepSpeed's bf16 mode where ``precision`` resolves to
    bf16; plain PyTorch runs bf16 autocast only for an explicit ``bf16``), with the generation ``backend`` the rollouts
    used (``auto`` resolved)."""
    bf16 = resolve_precision(precision, device) == "bf16" if deepspeed else precision == "bf16"
    return {**record(device, precision, bf16), "generation_backend": backend}

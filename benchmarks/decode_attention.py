"""Torch's CPU attention kernels at decode shapes (one query per row): speed, and whether the result depends on the
thread count (issue 29; stages.core.threads.invariant_attention).

For each dtype, rows B, heads H and key length T: the flash kernel (SDPA's default), SDPA's math backend and two
plain matmuls with a float32 softmax, timed at 2 threads (mean of 200 calls), and each kernel's output bits at 1 thread
compared with 2, 4, 8 and 16 threads (the count only sets how the work is split, so it can be tested on 2 cores).
Measured (torch 2.13, 2-core AMX machine, 2026-12-02): only the flash kernel at one (row, head) pair and T >= 200
differed, at 2 and 4 threads; in bf16 the math backend is 7-14x slower than flash.

    python benchmarks/decode_attention.py            # writes benchmarks/results/decode_attention.json
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

RESULTS = Path(__file__).resolve().parent / "results" / "decode_attention.json"
D = 64  # the tiny default's head dimension


def _bits(t: torch.Tensor) -> str:
    return hashlib.md5(t.float().contiguous().numpy().tobytes()).hexdigest()


def _kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> dict:
    def flash() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def math() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def matmuls() -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)).float() * D ** -0.5
        return torch.matmul(torch.softmax(s.masked_fill(~mask, float("-inf")), -1).to(v.dtype), v)

    return {"flash": flash, "math": math, "matmuls": matmuls}


def main() -> int:
    torch.manual_seed(0)
    before = torch.get_num_threads()
    timing, variant = [], []
    for dt in (torch.bfloat16, torch.float32):
        for B, H in ((1, 1), (1, 4), (2, 1), (8, 4), (64, 4)):
            for T in (64, 200, 700):
                q, k, v = (torch.randn(B, H, n, D, dtype=dt) for n in (1, T, T))
                mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
                mask[::3, :, :, :7] = False  # left padding of some rows
                for name, fn in _kernels(q, k, v, mask).items():
                    torch.set_num_threads(1)
                    ref = _bits(fn())
                    for nt in (2, 4, 8, 16):
                        torch.set_num_threads(nt)
                        if _bits(fn()) != ref:
                            variant.append({"kernel": name, "dtype": str(dt)[6:], "rows": B, "heads": H, "keys": T,
                                            "threads": nt})
                    if B == 64:
                        torch.set_num_threads(2)
                        fn()
                        t0 = time.perf_counter()
                        for _ in range(200):
                            fn()
                        timing.append({"kernel": name, "dtype": str(dt)[6:], "rows": B, "heads": H, "keys": T,
                                       "us_per_call": round((time.perf_counter() - t0) / 200 * 1e6, 1)})
    torch.set_num_threads(before)
    out = {"torch": torch.__version__, "load_average": os.getloadavg(), "thread_variant": variant, "timing_2_threads": timing,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    for r in timing:
        print(r)
    print("differs from 1 thread:", variant or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())

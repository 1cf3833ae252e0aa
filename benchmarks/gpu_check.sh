#!/usr/bin/env bash
# The GPU check on a machine with its own torch (CUDA) and no network, from a checkout carrying .gpu-wheels/
# (benchmarks/gpu_wheels.sh): install the wheels for this Python without dependencies into a temporary target,
# then run benchmarks/gpu_check.py from the checkout with PYTHONPATH (never `pip install -e .`, which pins torch).
#   bash benchmarks/gpu_check.sh [--out PATH] [gpu_check.py options]      (default budget: 240 s)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))'
deps="${GPU_DEPS:-/tmp/gpu-check-deps}"
rm -rf "$deps"
mapfile -t wheels < <(ls .gpu-wheels/*.whl | grep -E -- "-(py3|$tag|cp3[0-9]+-abi3)-" )
if ! printf '%s\n' "${wheels[@]}" | grep -q "numpy-.*-$tag-"; then
  echo "gpu_check.sh: .gpu-wheels has no wheels for $tag; run benchmarks/gpu_wheels.sh ${tag:2:1}.${tag:3}" >&2
  exit 4
fi
"$PY" -m pip install -q --no-deps --no-index --target "$deps" "${wheels[@]}"
PYTHONPATH="$PWD:$deps" exec "$PY" benchmarks/gpu_check.py "$@"

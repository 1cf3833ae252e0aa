#!/usr/bin/env bash
# Download the wheels of benchmarks/gpu_wheels.txt into .gpu-wheels/ (git-ignored) for the GPU machine's Python
# versions (default 3.11 and 3.12: ~59 MB, within the device tool's 64 MiB carry). No dependencies are resolved:
# the list is complete next to torch's own dependencies (checked by running the check from an environment holding
# only torch and these wheels: docs/real-mode.md).
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VERSIONS=("${@:-3.11 3.12}")
mkdir -p .gpu-wheels
for v in ${VERSIONS[@]}; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$v" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d .gpu-wheels -r benchmarks/gpu_wheels.txt
done
du -sh .gpu-wheels

#!/usr/bin/env bash
# scripts/fetch-device-wheels.sh: download the pure-Python wheels honed's optional backends use into
# .whl/ (gitignored). The GPU machine has no network: carry .whl there and scripts/gpu-test.sh
# installs them with --no-deps --no-index. The CPU venv (make setup) installs the same wheels.
#   torchao: the py3-none-any build (no C++ extensions; the CPU and the torch.compile paths
#   honed uses need none). 0.18 is made for torch >= 2.11: the device's 2.11.0+cu130 and the
#   CPU machines' 2.13.0. It declares no dependencies, so --no-deps never pulls another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
TORCHAO_VERSION=${TORCHAO_VERSION:-0.18.0}
mkdir -p .whl
wheel=".whl/torchao-${TORCHAO_VERSION}-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.10 \
    -d .whl "torchao==${TORCHAO_VERSION}" 2>&1 | grep -v "^WARNING: Location" || true
fi
test -f "$wheel" || { echo "fetch-device-wheels: $wheel was not downloaded" >&2; exit 1; }
echo "$wheel"

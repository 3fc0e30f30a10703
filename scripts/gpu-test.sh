#!/usr/bin/env bash
# scripts/gpu-test.sh: on the GPU machine (no network): build against the preinstalled torch,
# run the C++ tests, the whole Python suite with CUDA, the demo on cuda and the overhead benchmark.
# Logs go to $OUT (or ./gpu-out) so they come back from the device.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "=== $*"; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

step "build (no network, no build isolation)"
$PY -m pip install -q --no-build-isolation --no-deps --no-index -e . 2>&1 | grep -v "^WARNING" | tail -20
$PY -c "import honed; print('honed', honed.__version__)" || exit 1

step "C++ tests"
cmake -S . -B build/cpp-gpu -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=ON >/dev/null \
  && cmake --build build/cpp-gpu 2>&1 | tail -3 \
  && (cd build/cpp-gpu && ctest --output-on-failure 2>&1 | tail -5) || status=1

step "Python tests (CUDA)"
$PY -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "demo on cuda"
$PY -m honed.cli demo --device cuda --out /tmp/honed-demo-cuda.honed 2>&1 | tee "$OUT/demo-cuda.log" || status=1

step "overhead benchmark"
$PY bench/overhead.py --device cpu --calls 200000 --json "$OUT/overhead-cpu.json" || status=1
$PY bench/overhead.py --device cuda --calls 100000 --json "$OUT/overhead-cuda.json" || status=1
exit $status

#!/usr/bin/env bash
# scripts/gpu-test.sh [tests|bench|all]: on the GPU machine (no network): build against the
# preinstalled torch, then
#   tests: the C++ tests, the whole Python suite with CUDA, and `honed doctor`;
#   bench: `honed demo --device cuda`, the overhead and cache benchmarks, a BERT-base-like tune.
# Logs go to $OUT (or ./gpu-out) so they come back from the device.
set -uo pipefail
STAGE=${1:-all}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "=== $*"; }
run() { "$@" || { echo "FAILED: $*"; status=1; }; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

step "build (no network, no build isolation)"
$PY -m pip install -q --no-build-isolation --no-deps --no-index -e . 2>&1 | grep -v "^WARNING" | tail -20
$PY -c "import honed; print('honed', honed.__version__)" || exit 1
# Wheels carried in .whl/ (scripts/fetch-device-wheels.sh): torchao for TorchAOBackend.
if ls .whl/torchao*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-deps --no-index .whl/torchao-*.whl 2>&1 | grep -v "^WARNING" | tail -5
  $PY -c "import torchao; print('torchao', torchao.__version__)" || status=1
fi

if [ "$STAGE" = tests ] || [ "$STAGE" = all ]; then
  step "C++ tests"
  cmake -S . -B build/cpp-gpu -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=ON >/dev/null \
    && cmake --build build/cpp-gpu 2>&1 | tail -2 \
    && (cd build/cpp-gpu && ctest --output-on-failure 2>&1 | tail -6) || status=1

  step "Python tests (CUDA)"
  $PY -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tee "$OUT/pytest.log" \
    | grep -v -E "^DEBUG|triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1

  step "honed doctor"
  $PY -m honed.cli doctor --device cuda 2>&1 | tee "$OUT/doctor.log" || status=1
  $PY -m honed.cli doctor --json > "$OUT/doctor.json" || status=1
fi

if [ "$STAGE" = bench ] || [ "$STAGE" = all ]; then
  step "demo on cuda"
  $PY -m honed.cli demo --device cuda --out /tmp/honed-demo-cuda.honed 2>&1 \
    | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
    | tee "$OUT/demo-cuda.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1

  step "overhead benchmark"
  run $PY bench/overhead.py --device cpu --calls 200000 --json "$OUT/overhead-cpu.json"
  run $PY bench/overhead.py --device cuda --calls 100000 --json "$OUT/overhead-cuda.json"

  step "BERT-base-like tune (cuda)"
  (cd bench && $PY tune_model.py --device cuda --batches 8 16 --json "$OUT/bert-tune.json") 2>&1 \
    | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
    | tee "$OUT/bert-tune.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1

  step "TorchAO schemes (cuda)"
  (cd bench && $PY torchao_schemes.py --device cuda --json "$OUT/torchao-schemes.json") 2>&1 \
    | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
    | tee "$OUT/torchao-schemes.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1

  step "tuning cache speed-up (cuda)"
  run $PY bench/cache_speedup.py --device cuda --json "$OUT/cache-cuda.json"
fi
echo "gpu-test $STAGE: status $status"
exit $status

#!/usr/bin/env bash
# scripts/gpu-session.sh: the CUDA checks of one short device session, each step under its own
# time limit so one slow step cannot starve the rest (the device allows 600 s per command):
#   CUDA graphs vs reduce-overhead, AOTInductor on CUDA, the C++ runtime with CUDA (tests and
#   honed-run vs honed.load), TorchAO on the GPU, JIT cold/warm. Logs go to $OUT. The first two
#   steps compile from a cold cache, the slowest part of a session: give the session a call of
#   its own (SESSION_WALL), or pick steps: STEPS="cuda torchao runtime jit".
# The full stages (slower) are in scripts/gpu-test.sh.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
NOISE="triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn"
status=0
step() { echo; echo "=== [$SECONDS s] $*"; }
STEPS=" ${STEPS:-cuda torchao runtime jit} "
wants() { [[ "$STEPS" == *" $1 "* ]]; }
if [ -d .deps/usr ]; then
  export CMAKE_PREFIX_PATH=$PWD/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
step "build"
$PY -m pip install -q --no-build-isolation --no-deps --no-index -e . 2>&1 | grep -v "^WARNING" | tail -5
ls .whl/torchao-*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-deps --no-index .whl/torchao-*.whl 2>&1 | tail -2
RT=build/cpp-gpu-runtime
(cmake -S . -B $RT -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=ON -DHONED_BUILD_RUNTIME=ON \
   -DPython_EXECUTABLE="$(command -v "$PY")" > "$OUT/runtime-cmake.log" 2>&1 \
 && cmake --build $RT > "$OUT/runtime-build.log" 2>&1; echo "runtime build rc=$?" > "$OUT/runtime-build.rc") &
BUILD_PID=$!

pyt() {  # pyt LIMIT LOG pytest-args...
  local limit=$1 log=$2; shift 2
  timeout -k 5 "$limit" $PY -m pytest -q -p no:cacheprovider -rs "$@" 2>&1 | tee "$OUT/$log" \
    | grep -v -E "$NOISE" | tail -12
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED ($log)"; status=1; }
}
wants cuda && step "CUDA graphs + AOTInductor on CUDA" && pyt 300 cuda-backends.log tests/test_backend_cudagraphs.py tests/test_gpu.py \
  "tests/test_backend_aot.py::test_dynamic_profile_on_cuda_matches_eager_and_round_trips" \
  "tests/test_backend_aot.py::test_the_wrapper_links_the_shared_cxx_runtime"
wants torchao && step "TorchAO on the GPU" && pyt 240 torchao-gpu.log tests/test_backend_torchao.py
wait $BUILD_PID; cat "$OUT/runtime-build.rc"
grep -E "warning|error" "$OUT/runtime-build.log" | head -5
if ! wants runtime; then
  :
elif [ -x $RT/cpp/runtime/honed-run ]; then
  step "C++ runtime on CUDA (tune, save, honed-run --check, GoogleTest, examples/cpp)"
  HONED_TEST_CPP_BUILD=$RT HONED_TEST_DEVICE=cuda pyt 150 runtime-cuda.log tests/test_runtime_cpp.py
  step "honed-run vs honed.load (cuda)"
  timeout -k 5 100 $PY bench/cpp_vs_python.py --honed-run $RT/cpp/runtime/honed-run --device cuda \
    --models mlp --batches 1 --json "$OUT/cpp-vs-python.json" 2>&1 | grep -v -E "$NOISE" \
    | tee "$OUT/cpp-vs-python.log" | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED cpp_vs_python"; status=1; }
else
  echo "FAILED: runtime did not build"; tail -30 "$OUT/runtime-build.log"; status=1
fi
left=$(( ${SESSION_WALL:-570} - SECONDS ))
if wants jit && [ "$left" -gt 60 ]; then
  step "JIT cold vs warm (cuda), ${left} s left"
  timeout -k 5 "$left" $PY bench/jit_restart.py --device cuda --runs 2 --reps 10 \
    --json "$OUT/jit-restart-cuda.json" 2>&1 | grep -v -E "$NOISE" | tee "$OUT/jit-restart-cuda.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED jit_restart"; status=1; }
fi
echo "gpu-session: status $status at $SECONDS s"
exit $status

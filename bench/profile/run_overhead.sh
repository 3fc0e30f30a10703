#!/usr/bin/env bash
# bench/profile/run_overhead.sh BUILD DEVICE [SHAPE]: build run_overhead.cpp against the runtime in
# BUILD (a CMake build folder of this repo), save the tiny MLP for DEVICE, and time what
# honed::Model::run adds to libtorch's loader.
set -euo pipefail
BUILD=$1; DEVICE=$2; SHAPE=${3:-1x16}; PY=${PY:-python3}
T=$($PY -c "import os, torch; print(os.path.dirname(torch.__file__))")
CUDA_LIBS=""; [ -e "$T/lib/libtorch_cuda.so" ] && CUDA_LIBS="-ltorch_cuda -lc10_cuda"
g++ -std=c++20 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 bench/profile/run_overhead.cpp -Icpp/include \
  -I"$T/include" -I"$T/include/torch/csrc/api/include" -L"$BUILD/cpp/runtime" -L"$T/lib" \
  -Wl,--no-as-needed -lhoned_runtime -ltorch $CUDA_LIBS -Wl,--as-needed -ltorch_cpu -lc10 \
  -Wl,-rpath,"$(cd "$BUILD/cpp/runtime" && pwd)" -Wl,-rpath,"$T/lib" -o /tmp/run_overhead
ART=/tmp/overhead-$DEVICE.honed
[ -e "$ART" ] || $PY bench/profile/make_cpp_artifact.py "$ART" "$DEVICE" >/dev/null 2>&1
/tmp/run_overhead "$ART" "$ART.pt2" "$DEVICE" "$SHAPE" "${ROUNDS:-31}" "${CALLS:-200}"

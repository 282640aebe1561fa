# The two Quickstart commands, `make demo` and `make test`, set everything up from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: install demo test lint clean

install: $(STAMP)

# torch is named first, in the same pip command, so that no other requirement's torch range pulls a CUDA build.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (log: $(VENV)/install.log) ..."
	@{ $(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip && \
	   $(BIN)/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[dev]"; \
	 } > $(VENV)/install.log 2>&1 || { tail -40 $(VENV)/install.log; exit 1; }
	touch $(STAMP)

# The demo starts from a fresh run directory each time (the tiny model is kept).
demo: install
	rm -rf runs/quickstart/arithmetic-async
	$(BIN)/trinity-like run configs/quickstart.yaml

test: install
	$(BIN)/python -m pytest -q -ra

lint: install
	$(BIN)/ruff check trinity_like tests

clean:
	rm -rf $(VENV) runs .pytest_cache
